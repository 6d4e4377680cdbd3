"""The CLI as people expect it: `spd --help` without loading torch, a help line with its default
for every option of every command."""

from __future__ import annotations

import argparse
import subprocess
import sys

from spd.cli import HelpFormatter, build_parser


def test_spd_help_does_not_import_torch():
    code = ("import sys, contextlib, io\nfrom spd.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit): main(['--help'])\n"
            "print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "False", done.stderr


def _commands(parser: argparse.ArgumentParser, path: str = "spd"):
    """(name, parser) of every command and sub-command, nested ones (spd k8s render) included."""
    yield path, parser
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, p in a.choices.items():
                yield from _commands(p, f"{path} {name}")


def test_every_option_of_every_command_has_a_help_line_that_gives_its_default():
    missing, undefaulted = [], []
    for name, p in _commands(build_parser()):
        formatter = p._get_formatter()
        assert isinstance(formatter, HelpFormatter), name
        for a in p._actions:
            if not a.option_strings or a.dest == "help":
                continue
            where = f"{name} {a.option_strings[-1]}"
            if not a.help:
                missing.append(where)
            elif a.default not in (None, False, [], "", argparse.SUPPRESS) and "default" not in formatter._get_help_string(a).lower():
                undefaulted.append(where)
    assert not missing, f"options without help: {missing}"
    assert not undefaulted, f"help lines without their default: {undefaulted}"

"""Every flag of `spd up`, `spd orchestrator`, `spd train` and the workers lands in the config field of its name:
each field gets a distinct value on the command line and must come back in exactly that field."""

from __future__ import annotations

import argparse
import dataclasses
import itertools

import pytest

from spd.cli import build_parser
from spd.config import ClusterConfig, EagleTrainConfig, OrchestratorConfig, TrainConfig, WorkerConfig, from_args


def _subparser(name: str) -> argparse.ArgumentParser:
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return sub.choices[name]


def _distinct_argv(parser: argparse.ArgumentParser, fields: set[str]):
    """(argv, expected field values): a different value for every flag that sets a config field."""
    counter = itertools.count(3)
    argv, expected = [], {}
    for a in parser._actions:
        if a.dest not in fields or not a.option_strings:
            continue
        flag = a.option_strings[0]
        if isinstance(a, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
            argv.append(flag)
            expected[a.dest] = isinstance(a, argparse._StoreTrueAction)
            continue
        k = next(counter)
        text = a.choices[k % len(a.choices)] if a.choices else str(k) if a.type in (int, float) else f"v{k}"
        if getattr(a.type, "__name__", "").startswith("comma-separated"):
            text = f"{k},{k + 1}"
        argv += [flag, text]
        expected[a.dest] = a.type(text) if a.type else text
    return argv, expected


@pytest.mark.parametrize("command, cls, extra, required", [
    ("up", ClusterConfig, {}, []),
    ("orchestrator", OrchestratorConfig, {"topology": None}, []),
    ("train", TrainConfig, {}, []),
    ("train", EagleTrainConfig, {}, []),
    ("stage", WorkerConfig, {}, ["--of", "2"]),
    ("drafter", WorkerConfig, {}, []),
    ("spare", WorkerConfig, {}, ["--endpoint", "tcp://127.0.0.1:1"]),
])
def test_each_flag_lands_in_the_config_field_of_its_name(command, cls, extra, required):
    parser = _subparser(command)
    names = {f.name for f in dataclasses.fields(cls)} - set(extra)  # extra: built from its flag by the command
    argv, expected = _distinct_argv(parser, names)
    assert len(expected) >= 10, expected  # the command really exposes its config
    cfg = from_args(cls, parser.parse_args(argv + required), **extra)
    got = {k: getattr(cfg, k) for k in expected}
    assert got == expected

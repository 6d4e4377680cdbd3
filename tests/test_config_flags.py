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


def test_a_with_student_is_the_main_flags_with_its_overrides():
    from spd.commands.train import _config, _students

    parser = _subparser("train")
    args = parser.parse_args(["--lr", "3e-4", "--n", "4", "--seed", "7", "--out", "runs/main",
                              "--with", "ls=2 schedule=post anchors=0,6 out=runs/ppsd", "--with", "method=eagle3 ttt=2 init-head=false eval-every=5"])
    main, ppsd, draft = (_config(cls, s) for cls, s in zip((TrainConfig, TrainConfig, EagleTrainConfig), _students(args)))
    assert (main.ls, main.schedule, main.out) == (1, "pre", "runs/main")
    assert (ppsd.n, ppsd.ls, ppsd.schedule, ppsd.anchors, ppsd.lr, ppsd.seed, ppsd.out) == (4, 2, "post", [0, 6], 3e-4, 7, "runs/ppsd")
    assert (draft.ttt, draft.init_head, draft.eval_every_s, draft.lr, draft.vocab, draft.out) == (2, False, 5.0, 3e-4, 16384, "runs/eagle3")
    for bad in ("seed=1", "ls", "schedule=mid", "nonsense=1"):  # a shared flag, no value, not a choice, no such flag
        with pytest.raises(SystemExit):
            parser.parse_args(["--with", bad])

"""`spd train`: train a PDM for a target (design §7) from a cached teacher, resumably; with
`--method eagle3 --ttt S` the EAGLE-3-style baseline draft instead (design §9, spd.eagle.train).

CPU recipe (default model, ~2 h on one core): build the caches once, in the background,
  python -m spd.train.prepare selfgen --split heldout --max-items 96
  python -m spd.train.prepare selfgen --split train            # resumable; stop it any time
then `spd train --n 5 --ls 1 --lr 3e-4 --tokens 400000 --out runs/pdm-n5 --wait`, and copy
runs/pdm-n5/pdm/ to services/spd/assets/drafts/<model>/ (or pass --ship).
With --prepare the caches are built first (in this process) when they are missing or too small.
GPU recipe: the same commands with --device-free bigger batches: `prepare selfgen --batch 256
--dtype bfloat16` on the GPU box, then `spd train --tokens 20000000 --batch-tokens 8192 --lr 3e-4`.

Several students from one teacher pass: each `--with 'FLAG=VALUE ...'` adds a student, the main
flags with those overrides, trained in the same run on the same sequences in the same order (with
self-generated ids the target's prefill of a part, most of a CPU run's time, runs once for all):
  spd train --n 5 --ls 1 --out runs/pdm-ls1 --with 'ls=2 out=runs/pdm-ls2' \
      --with 'schedule=post anchors=0,6 out=runs/ppsd' --with 'method=eagle3 ttt=4'
Each student has its own optimizer, schedule, vocabulary (shared by those of the same --vocab),
checkpoint, history.jsonl and export in its own --out (not inherited: its out= or its method's
default, runs/pdm or runs/eagle3; an --lr or --vocab set on neither is its method's default too);
the data, order and clock flags (spd.config.SHARED) are the main flags'. The checkpoints are
written together and --resume restarts every student where it stopped (spd.train.loop).
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
from pathlib import Path

from spd.commands import UsageError
from spd.core.schedule import SCHEDULES
from spd.config import SHARED

NOT_PER_STUDENT = (*SHARED, "prepare", "ship", "students", "help")  # flags a --with cannot set


class _With(argparse.Action):
    """`--with 'FLAG=VALUE ...'`: one more student, as {field: value} overrides of the main flags,
    each value read by its flag's own type and choices (a switch takes true/false)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace, values, option_string=None):
        flags = [a for a in parser._actions if a.option_strings and a.dest not in NOT_PER_STUDENT]
        by_name = {o[2:].replace("-", "_"): a for a in flags for o in a.option_strings if not o.startswith("--no-")}
        by_name.update({a.dest: a for a in flags})  # (eval_every_s as well as eval_every)
        overrides = {}
        for item in shlex.split(str(values)):
            key, eq, text = item.partition("=")
            a = by_name.get(key.replace("-", "_"))
            if not eq or a is None:
                parser.error(f"--with {values!r}: {item!r} is not FLAG=VALUE of a flag a student may set (these are "
                             f"shared: {' '.join('--' + k.replace('_', '-') for k in SHARED)})")
            try:
                overrides[a.dest] = _value(a, text)
            except ValueError as e:
                parser.error(f"--with {values!r}: {key}: {e}")
        setattr(namespace, self.dest, [*getattr(namespace, self.dest), overrides])


def _value(a: argparse.Action, text: str):
    """One --with value, read as its flag reads it."""
    if isinstance(a, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        if text.lower() not in ("true", "false"):
            raise ValueError(f"{text!r} is not true or false")
        return text.lower() == "true"
    value = a.type(text) if callable(a.type) else text
    if a.choices is not None and value not in a.choices:
        raise ValueError(f"{value!r} is not one of {list(a.choices)}")
    return value


def add_parser(sub) -> None:
    from spd.config import EagleTrainConfig, TrainConfig, add_flags

    p = sub.add_parser("train", help="train a Pipeline Draft Module (PDM) or an EAGLE-3-style draft for a target model")
    p.add_argument("--method", choices=["pdm", "eagle3"], default="pdm",
                   help="pdm (design §7) | eagle3: the EAGLE-3-style baseline draft (design §9, spd.eagle); "
                   "the eagle3 defaults differ: --lr 1.5e-3 --vocab 16384 --out runs/eagle3")
    add_flags(p, TrainConfig, skip=("notes", "p_full"), aliases={"eval_every_s": "--eval-every", "ckpt_every_s": "--ckpt-every"},
              choices={"schedule": SCHEDULES, "amp": ("auto", "bfloat16", "float32")})
    add_flags(p, EagleTrainConfig, only=("feature_layers", "ttt"))
    p.add_argument("--with", dest="students", action=_With, default=[], metavar="'FLAG=VALUE ...'",
                   help="one more student trained in this run on the same teacher pass: the main flags with these "
                   "overrides (flag names without dashes, e.g. 'ls=2 out=runs/pdm-ls2', 'method=eagle3 ttt=4', "
                   "'schedule=post anchors=0,6 out=runs/ppsd'; --out is not inherited: out=, else the method's default); "
                   "repeatable")
    p.add_argument("--prepare", type=int, default=0, metavar="TOKENS",
                   help="first build the self-generated caches up to TOKENS positions (resumable)")
    p.add_argument("--ship", action="store_true", help="copy the main student (a PDM) to the shipped drafts folder")
    p.set_defaults(run=run, lr=None, vocab=None, out=None)  # None: the method's own default


def _config(cls, args: argparse.Namespace):
    """cls built from the flags by name; the flags left at None take cls's own defaults."""
    from spd.config import from_args

    unset = {k for k in ("lr", "vocab", "out") if getattr(args, k) is None}
    return from_args(cls, argparse.Namespace(**{k: v for k, v in vars(args).items() if k not in unset}))


def _students(args: argparse.Namespace) -> list[argparse.Namespace]:
    """The main student's flags, then each --with's: the main flags with its overrides (its --out its own)."""
    return [args] + [argparse.Namespace(**{**vars(args), "out": None, **o}) for o in args.students]


def _plan(args: argparse.Namespace):
    """The student of these flags, by its --method."""
    from spd.config import EagleTrainConfig, TrainConfig

    if args.method == "eagle3":
        from spd.eagle.train import plan as eagle3

        return eagle3(_config(EagleTrainConfig, args))
    from spd.train.trainer import plan as pdm

    return pdm(_config(TrainConfig, args))


def _summary(method: str, cfg, module) -> dict:
    """The line printed for a trained student."""
    notes = module.config.notes
    if method == "eagle3":
        return {"out": str(Path(cfg.out) / "draft"), "tokens_seen": module.config.trained_tokens,
                "heldout_p_per_step": notes.get("heldout_p_per_step")}
    return {"out": str(Path(cfg.out) / "pdm"), "tokens_seen": notes.get("tokens_seen"),
            "heldout_p": notes.get("heldout_p"), "heldout_loss": notes.get("heldout_loss")}


def run(args: argparse.Namespace) -> int:
    from spd.train.loop import check_plans, train_plans

    if args.ship and args.method != "pdm":
        raise SystemExit("--ship is for PDMs only")
    students = _students(args)
    plans = [_plan(s) for s in students]
    try:
        check_plans(plans)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if args.prepare:
        from spd.train import prepare

        common = ["--threads", str(args.threads)] + (["--model", args.model] if args.model else [])
        prepare.main(["selfgen", "--split", "heldout", "--max-items", "96"] + common)
        prepare.main(["selfgen", "--split", "train", "--tokens", str(args.prepare)] + common)
    for s, p, student in zip(students, plans, train_plans(plans)):
        print(json.dumps(_summary(s.method, p.cfg, student.module)))
    if args.ship:
        from spd.pipeline import SHIPPED_DRAFTS
        from spd.models.loading import resolve_model

        dest = SHIPPED_DRAFTS / resolve_model(args.model).name
        dest.mkdir(parents=True, exist_ok=True)
        for name in ("pdm.safetensors", "config.json"):
            shutil.copy(Path(plans[0].cfg.out) / "pdm" / name, dest / name)
        print(f"shipped to {dest}")
    return 0


if __name__ == "__main__":  # `python -m spd.commands.train ...`: without the rest of the CLI (a GPU box without pyzmq)
    import logging
    import sys

    from spd.cli import Parser

    parser = Parser(prog="python -m spd.commands.train")
    add_parser(parser.add_subparsers(dest="command", required=True))
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        sys.exit(run(parser.parse_args(["train", *sys.argv[1:]])))
    except UsageError as e:
        sys.exit(f"python -m spd.commands.train: error: {e}")

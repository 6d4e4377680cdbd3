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
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from spd.core.schedule import SCHEDULES


def add_parser(sub) -> None:
    from spd.config import EagleTrainConfig, TrainConfig, add_flags

    p = sub.add_parser("train", help="train a Pipeline Draft Module (PDM) or an EAGLE-3-style draft for a target model")
    p.add_argument("--method", choices=["pdm", "eagle3"], default="pdm",
                   help="pdm (design §7) | eagle3: the EAGLE-3-style baseline draft (design §9, spd.eagle); "
                   "the eagle3 defaults differ: --lr 1.5e-3 --vocab 16384 --out runs/eagle3")
    add_flags(p, TrainConfig, skip=("notes", "p_full"), aliases={"eval_every_s": "--eval-every", "ckpt_every_s": "--ckpt-every"},
              choices={"schedule": SCHEDULES, "amp": ("bfloat16", "float32")})
    add_flags(p, EagleTrainConfig, only=("feature_layers", "ttt"))
    p.add_argument("--prepare", type=int, default=0, metavar="TOKENS",
                   help="first build the self-generated caches up to TOKENS positions (resumable)")
    p.add_argument("--ship", action="store_true", help="copy the result to the shipped drafts folder")
    p.set_defaults(run=run, lr=None, vocab=None, out=None)  # None: the method's own default


def _config(cls, args: argparse.Namespace):
    """cls built from the flags by name; the flags left at None take cls's own defaults."""
    from spd.config import from_args

    unset = {k for k in ("lr", "vocab", "out") if getattr(args, k) is None}
    return from_args(cls, argparse.Namespace(**{k: v for k, v in vars(args).items() if k not in unset}))


def run(args: argparse.Namespace) -> int:
    from spd.config import TrainConfig
    from spd.train.trainer import train

    if args.prepare:
        from spd.train import prepare

        common = ["--threads", str(args.threads)] + (["--model", args.model] if args.model else [])
        prepare.main(["selfgen", "--split", "heldout", "--max-items", "96"] + common)
        prepare.main(["selfgen", "--split", "train", "--tokens", str(args.prepare)] + common)
    if args.method == "eagle3":
        return run_eagle3(args)
    cfg = _config(TrainConfig, args)
    pdm = train(cfg)
    notes = pdm.config.notes
    print(json.dumps({"out": str(Path(cfg.out) / "pdm"), "tokens_seen": notes.get("tokens_seen"),
                      "heldout_p": notes.get("heldout_p"), "heldout_loss": notes.get("heldout_loss")}))
    if args.ship:
        from spd.pipeline import SHIPPED_DRAFTS
        from spd.models.loading import resolve_model

        dest = SHIPPED_DRAFTS / resolve_model(args.model).name
        dest.mkdir(parents=True, exist_ok=True)
        for name in ("pdm.safetensors", "config.json"):
            shutil.copy(Path(cfg.out) / "pdm" / name, dest / name)
        print(f"shipped to {dest}")
    return 0


def run_eagle3(args: argparse.Namespace) -> int:
    """`spd train --method eagle3`: the EAGLE-3-style draft with TTT; writes OUT/draft/."""
    from spd.config import EagleTrainConfig
    from spd.eagle.train import train

    if args.ship:
        raise SystemExit("--ship is for PDMs only")
    cfg = _config(EagleTrainConfig, args)
    draft = train(cfg)
    notes = draft.config.notes
    print(json.dumps({"out": str(Path(cfg.out) / "draft"), "tokens_seen": draft.config.trained_tokens,
                      "heldout_p_per_step": notes.get("heldout_p_per_step")}))
    return 0


if __name__ == "__main__":  # `python -m spd.commands.train ...`: without the rest of the CLI (a GPU box without pyzmq)
    import logging
    import sys

    from spd.cli import Parser

    parser = Parser(prog="python -m spd.commands.train")
    add_parser(parser.add_subparsers(dest="command", required=True))
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s %(message)s")
    sys.exit(run(parser.parse_args(["train", *sys.argv[1:]])))

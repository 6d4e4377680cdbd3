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
    p = sub.add_parser("train", help="train a Pipeline Draft Module (PDM) or an EAGLE-3-style draft for a target model")
    p.add_argument("--method", choices=["pdm", "eagle3"], default="pdm",
                   help="pdm (design §7) | eagle3: the EAGLE-3-style baseline draft (design §9, spd.eagle)")
    p.add_argument("--ttt", type=int, default=4, help="eagle3: training-time-test unroll steps")
    p.add_argument("--feature-layers", help="eagle3: low,mid,high target layers (default L/6, L/2, L-1)")
    p.add_argument("--model", help="model directory (default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--n", type=int, default=5, help="pipeline width the PDM is trained for")
    p.add_argument("--ls", type=int, default=1, help="PDM decoder layers (L_s)")
    p.add_argument("--schedule", choices=SCHEDULES, default="pre", help="staircase the PDM is trained for (default pre)")
    p.add_argument("--anchors", help="anchor layers, comma-separated (default [0,e1,e3,e6,L-1]; PPSD: 0,e1)")
    p.add_argument("--tokens", type=int, default=0,
                   help="budget of assistant tokens to train on (0 = one pass over the cache)")
    p.add_argument("--out", default="runs/pdm", help="run directory: ckpt.pt, history.jsonl, pdm/")
    p.add_argument("--resume", action="store_true", help="continue from OUT/ckpt.pt")
    p.add_argument("--lr", type=float, default=1e-4, help="peak learning rate (default 1e-4)")
    p.add_argument("--batch-tokens", type=int, default=1024, help="loss positions per optimizer step")
    p.add_argument("--vocab", type=int, default=12288, help="draft vocabulary size V_s")
    p.add_argument("--data", default="selfgen-train", help="teacher cache name (or path)")
    p.add_argument("--heldout", default="selfgen-heldout", help="held-out teacher cache name (or path)")
    p.add_argument("--eval-seqs", type=int, default=24, help="held-out sequences per evaluation (default 24)")
    p.add_argument("--eval-every", type=float, default=600.0, help="seconds between held-out evaluations")
    p.add_argument("--ckpt-every", type=float, default=300.0, help="seconds between checkpoints")
    p.add_argument("--threads", type=int, default=1, help="CPU threads for torch (default 1)")
    p.add_argument("--seed", type=int, default=0, help="initialisation and shuffle seed (default 0)")
    p.add_argument("--wait", action="store_true", help="wait for the cache to grow until the budget is met")
    p.add_argument("--max-seconds", type=float, default=0.0, help="stop (resumable) after this wall time")
    p.add_argument("--no-init-head", action="store_true", help="random head instead of the target's LM-head rows")
    p.add_argument("--prepare", type=int, default=0, metavar="TOKENS",
                   help="first build the self-generated caches up to TOKENS positions (resumable)")
    p.add_argument("--ship", action="store_true", help="copy the result to the shipped drafts folder")
    p.add_argument("--no-progress", action="store_true", help="no progress bars (logs only)")
    p.add_argument("--fill", default="design",
                   help="simulated fill levels: design (a = n w.p. 1/2, else uniform) | judged:P (as the engine judges at acceptance P)")
    p.add_argument("--device", default="cpu", help="torch device for the PDM (cuda for the GPU recipe)")
    p.add_argument("--amp", choices=["bfloat16", "float32"], default="bfloat16",
                   help="autocast dtype of the PDM forward (default bfloat16; master weights stay fp32)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from spd.train.trainer import TrainConfig, train

    if args.prepare:
        from spd.train import prepare

        common = ["--threads", str(args.threads)] + (["--model", args.model] if args.model else [])
        prepare.main(["selfgen", "--split", "heldout", "--max-items", "96"] + common)
        prepare.main(["selfgen", "--split", "train", "--tokens", str(args.prepare)] + common)
    if args.method == "eagle3":
        return run_eagle3(args)
    anchors = [int(b) for b in args.anchors.split(",")] if args.anchors else None
    cfg = TrainConfig(model=args.model, n=args.n, ls=args.ls, anchors=anchors, schedule=args.schedule, tokens=args.tokens,
                      lr=args.lr, batch_tokens=args.batch_tokens, vocab=args.vocab, data=args.data,
                      heldout=args.heldout, eval_seqs=args.eval_seqs, eval_every_s=args.eval_every,
                      ckpt_every_s=args.ckpt_every, out=args.out, resume=args.resume, seed=args.seed,
                      threads=args.threads, wait=args.wait, max_seconds=args.max_seconds,
                      init_head=not args.no_init_head, progress=not args.no_progress,
                      device=args.device, fill=args.fill, amp=args.amp)
    pdm = train(cfg)
    notes = pdm.config.notes
    print(json.dumps({"out": str(Path(args.out) / "pdm"), "tokens_seen": notes.get("tokens_seen"),
                      "heldout_p": notes.get("heldout_p"), "heldout_loss": notes.get("heldout_loss")}))
    if args.ship:
        from spd.local import SHIPPED_DRAFTS
        from spd.models.loading import resolve_model

        dest = SHIPPED_DRAFTS / resolve_model(args.model).name
        dest.mkdir(parents=True, exist_ok=True)
        for name in ("pdm.safetensors", "config.json"):
            shutil.copy(Path(args.out) / "pdm" / name, dest / name)
        print(f"shipped to {dest}")
    return 0


def run_eagle3(args: argparse.Namespace) -> int:
    """`spd train --method eagle3`: the EAGLE-3-style draft with TTT; writes OUT/draft/."""
    from spd.eagle.train import EagleTrainConfig, train

    if args.ship:
        raise SystemExit("--ship is for PDMs only")
    layers = [int(b) for b in args.feature_layers.split(",")] if args.feature_layers else None
    cfg = EagleTrainConfig(model=args.model, feature_layers=layers, ttt=args.ttt, tokens=args.tokens, lr=args.lr,
                           batch_tokens=args.batch_tokens, vocab=args.vocab, data=args.data, heldout=args.heldout,
                           eval_seqs=args.eval_seqs, eval_every_s=args.eval_every, ckpt_every_s=args.ckpt_every,
                           out=args.out, resume=args.resume, seed=args.seed, threads=args.threads,
                           max_seconds=args.max_seconds, init_head=not args.no_init_head,
                           progress=not args.no_progress, device=args.device)
    draft = train(cfg)
    notes = draft.config.notes
    print(json.dumps({"out": str(Path(args.out) / "draft"), "tokens_seen": draft.config.trained_tokens,
                      "heldout_p_per_step": notes.get("heldout_p_per_step")}))
    return 0

"""EAGLE-3 trainer positions per second, the training code of a git commit against the checkout's,
side by side in one process: the same real sequences (self-generated responses, features from the
online teacher), the same draft and the same optimizer-step groups, TTT 4, fp32 (or the machine's
batched dtype), runs of each alternating after one untimed run each. Also checks that both give
the same loss and gradients.

    spd bench eagle_trainer_ab [--old ce86a13] [--part 139] [--seqs 48] [--threads 2] [--runs 2]
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from spd.core.stage import load_embedding
from spd.eagle import train as current
from spd.eagle.model import default_feature_layers, random_eagle
from spd.models.loading import load_config, load_tokenizer, resolve_model
from spd.train.online import OnlineCache
from spd.train.precision import batched_dtype
from spd.train.trainer import target_to_draft
from results_io import save  # (benchmarks/ is on sys.path: run as a script or by `spd bench`)
from train_throughput import _draft_vocab, step_groups

IDS = Path("data/selfgen/SmolLM2-135M-Instruct/train")


def module_at(commit: str, tmp: Path):
    """spd.eagle.train as it was at `commit` (its imports resolve against today's package)."""
    path = tmp / "eagle_train_old.py"
    path.write_text(subprocess.check_output(["git", "show", f"{commit}:services/spd/eagle/train.py"], text=True))
    spec = importlib.util.spec_from_file_location("eagle_train_old", path)
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="spd bench eagle_trainer_ab")
    ap.add_argument("--old", default="ce86a13", help="commit whose spd/eagle/train.py is 'old' (default ce86a13)")
    ap.add_argument("--part", type=int, default=139, help="self-generated part the sequences come from (default 139)")
    ap.add_argument("--seqs", type=int, default=48, help="sequences, spread over the part (default 48)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=2, help="timed runs of each (default 2)")
    ap.add_argument("--out", default="benchmarks/results/eagle_trainer_ab.json")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    model_dir = resolve_model(None)
    config = load_config(model_dir)
    layers = list(default_feature_layers(config.num_hidden_layers))
    cache = OnlineCache(IDS, model_dir, load_tokenizer(model_dir), layers=layers)
    part = cache.shards()[args.part]
    n = cache.count(part)
    seqs = cache.sequences(part, list(range(0, n, n // args.seqs))[: args.seqs])
    d2t = _draft_vocab(seqs, config.vocab_size, 16384)
    draft = random_eagle(config, layers, draft_ids=d2t, embed_weight=load_embedding(model_dir, config).weight)
    draft.train()
    t2d, cols = target_to_draft(d2t, config.vocab_size), [cache.layers.index(b) for b in layers]
    groups = [g for g, _ in step_groups(seqs, t2d, 1024, one_each=False)]
    amp = batched_dtype("cpu")

    def run(mod) -> tuple[float, float, int, list[torch.Tensor]]:
        draft.zero_grad()
        kl_sum, rows_sum = 0.0, 0
        t0 = time.perf_counter()
        for g in groups:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp == torch.bfloat16):
                kl, rows, _ = mod.batch_ttt_loss(draft, [seqs[i] for i in g], cols, t2d, 4)
            (kl / 1024).backward()
            kl_sum, rows_sum = kl_sum + kl.item(), rows_sum + rows
        return time.perf_counter() - t0, kl_sum, rows_sum, [p.grad.clone() for p in draft.parameters()]

    with tempfile.TemporaryDirectory() as tmp:
        versions = {"old": module_at(args.old, Path(tmp)), "new": current}
        for mod in versions.values():
            run(mod)  # untimed: first touch of memory, kernel choices
        runs: dict[str, list] = {name: [] for name in versions}
        for _ in range(args.runs):
            for name, mod in versions.items():
                runs[name].append(run(mod))
    old, new = runs["old"][-1], runs["new"][-1]
    grad_diff = max(float((a - b).abs().max() / (a.abs().max() + 1e-30)) for a, b in zip(old[3], new[3]))
    pos_s = {name: [r[2] / r[0] for r in rs] for name, rs in runs.items()}
    result = {"old_commit": args.old, "part": args.part, "seqs": len(seqs), "tokens": sum(len(s["tokens"]) for s in seqs),
              "positions": new[2], "threads": args.threads, "amp": str(amp), "ttt": 4, "positions_per_s": pos_s,
              "speedup": max(pos_s["new"]) / max(pos_s["old"]), "kl": {"old": old[1], "new": new[1]},
              "max_relative_grad_difference": grad_diff}
    table = (f"EAGLE-3 trainer (TTT 4, {result['amp']}, {args.threads} threads), {len(seqs)} sequences of part "
             f"{args.part} ({result['tokens']} tokens, {new[2]} step-1 loss positions), best of {args.runs}\n\n"
             "| code | positions / s | KL sum |\n|---|---|---|\n"
             f"| {args.old} | {max(pos_s['old']):.0f} | {old[1]:.1f} |\n| checkout | {max(pos_s['new']):.0f} | {new[1]:.1f} |\n\n"
             f"speedup {result['speedup']:.2f}x; largest gradient difference {grad_diff:.1e} of the tensor's largest entry\n")
    save(args.out, result, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())

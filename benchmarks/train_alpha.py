"""Measure the step acceptance ratio α = N/K of a PDM with the in-process SPD engine (greedy) on
held-out ShareGPT first-turn prompts (never used for training), and S0 = n·α.

  python benchmarks/train_alpha.py [--draft DIR] [--n 5] [--prompts 8] [--max-tokens 64] [--json out.json]

Also checks that the SPD output equals plain greedy AR token for token on every prompt.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from spd.core.engine import SPDEngine
from spd.core.sampling import SamplingParams
from spd.core.stopping import StopRule, eos_ids_of
from spd.core.ar import ar_generate
from spd.pipeline import PipelineConfig, build_local
from spd.train.data import load_sharegpt, prompt_ids, split_conversations


def heldout_prompts(tokenizer, k: int, max_prompt: int = 256, skip: int = 0) -> list[tuple[str, list[int]]]:
    _, held = split_conversations(load_sharegpt())
    out = []
    for c in held[skip:]:
        ids = prompt_ids(tokenizer, c.first_prompt)
        if len(ids) <= max_prompt:
            out.append((c.id, ids))
        if len(out) >= k:
            break
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default=None)
    p.add_argument("--draft", default=None, help="PDM dir (default: the shipped one)")
    p.add_argument("--n", type=int, default=5)
    p.add_argument("--schedule", default="pre", choices=["pre", "post"])
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--skip", type=int, default=0, help="skip the first SKIP held-out prompts")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--check-ar", action="store_true", help="also check SPD output == greedy AR")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    local = build_local(PipelineConfig(model=args.model, n=args.n, draft=args.draft))
    tok = local.tokenizer
    stop = StopRule(args.max_tokens, eos_ids_of(tok, local.config))
    engine = SPDEngine(local.stages, local.drafter(), args.schedule)
    rows, N, K = [], 0, 0
    for pid, ids in heldout_prompts(tok, args.prompts, skip=args.skip):
        t0 = time.perf_counter()
        g = engine.generate(ids, SamplingParams(), stop)
        s = g.stats
        row = {"id": pid, "N": s.generated_tokens, "K": s.cycles, "alpha": s.alpha, "accepts": s.accepts,
               "rejects": s.rejects, "p_accept": s.accepts / max(s.accepts + s.rejects, 1),
               "seconds": round(time.perf_counter() - t0, 1)}
        if args.check_ar:
            from spd.core.target import load_pipeline  # noqa: F401  (same stages, n = len(stages))
            ar = ar_generate(local.stages, ids, SamplingParams(), stop)
            row["equals_ar"] = ar.token_ids == g.token_ids
        rows.append(row)
        N, K = N + s.generated_tokens, K + s.cycles
        print(json.dumps(row), flush=True)
    alpha = N / K if K else float("nan")
    summary = {"n": args.n, "schedule": args.schedule, "prompts": len(rows), "N": N, "K": K, "alpha": alpha,
               "S0": args.n * alpha, "mean_alpha": sum(r["alpha"] or 0 for r in rows) / max(len(rows), 1),
               "p_accept": sum(r["accepts"] for r in rows) / max(sum(r["accepts"] + r["rejects"] for r in rows), 1),
               "draft": str(local.pdm.config.notes.get("tokens_seen", "random")) + " tokens seen"}
    print(json.dumps(summary))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": summary, "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

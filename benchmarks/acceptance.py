"""Benchmark (not a test): greedy acceptance of a PDM on held-out evaluation prompts, per set.

Exact verdicts by the offline replay (spd.eval.acceptance; it matches the live engine's counts,
see tests/test_fast_acceptance.py): N, K, α = N/K and S0 = n·α for MT-Bench first turns, GSM8K
and HumanEval (none of them used in training).

    python benchmarks/acceptance.py [--draft DIR] [--n 5] [--prompts 10] [--max-tokens 128] [--out ...]
"""

from __future__ import annotations

import argparse
import time

from tqdm import tqdm

from spd.core.stopping import StopRule, eos_ids_of
from spd.eval.acceptance import ar_with_anchors, replay
from spd.eval.prompts import SETS, load
from spd.pipeline import PipelineConfig, build_local
from spd.text import encode_prompt
from results_io import save  # noqa: E402  (benchmarks/ is on sys.path: run as a script or by `spd bench`)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--draft", help="PDM directory (default: the shipped one)")
    ap.add_argument("--n", type=int, default=5)
    ap.add_argument("--schedule", default="pre", choices=["pre", "post"])
    ap.add_argument("--prompts", type=int, default=10, help="first K prompts of each set")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--sets", default=",".join(SETS))
    ap.add_argument("--out", default="benchmarks/results/acceptance.json")
    args = ap.parse_args()
    local = build_local(PipelineConfig(n=args.n, draft=args.draft))
    drafter = local.drafter()
    stop = StopRule(args.max_tokens, eos_ids_of(local.tokenizer, local.config))
    rows = {}
    for name in args.sets.split(","):
        N = K = acc = rej = 0
        t0 = time.perf_counter()
        for messages in tqdm(load(name, args.prompts), desc=name):
            prompt = encode_prompt(local.tokenizer, messages=messages)
            generated, anchors = ar_with_anchors(local.stages, prompt, stop)
            r = replay(drafter, prompt, generated, anchors, args.schedule)
            N, K, acc, rej = N + r.generated_tokens, K + r.cycles, acc + r.accepts, rej + r.rejects
        p = acc / max(acc + rej, 1)
        rows[name] = {"prompts": args.prompts, "N": N, "K": K, "alpha": N / K, "S0": args.n * N / K,
                      "judgement_accept_rate": p, "seconds": time.perf_counter() - t0}
    result = {"n": args.n, "schedule": args.schedule, "draft": str(args.draft or "shipped"),
              "max_tokens": args.max_tokens, "sets": rows}
    lines = [f"n = {args.n}, {args.schedule}-step, greedy, {args.prompts} prompts per set, <= {args.max_tokens} tokens",
             "", "| set | N | K | alpha | S0 = n*alpha | p(accept) |", "|---|---|---|---|---|---|"]
    lines += [f"| {name} | {r['N']} | {r['K']} | {r['alpha']:.3f} | {r['S0']:.2f} | {r['judgement_accept_rate']:.3f} |"
              for name, r in rows.items()]
    save(args.out, result, "\n".join(lines))


if __name__ == "__main__":
    main()

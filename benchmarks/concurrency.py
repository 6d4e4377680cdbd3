"""Benchmark (not a test): many requests through one pipeline, next to the same requests one by one.

Greedy, default model (SmolLM2-135M-Instruct, fp32), shipped PDM, n = 5. For R = 1, 2, 4, 8
requests (different prompts and lengths), measured side by side in one run:

    in process   R sequential `generate` calls with plain stages (rows 1: what one request at a
                 time costs today), R sequential calls with stages at the fixed batch shape S (the
                 price of batch invariance), and one `generate_many` of all R at shape S;
    cluster      `spd up --max-concurrency S`: R streams one after another, then R at once
                 (every process of the cluster shares this machine's cores: label it so).

Reported: wall seconds, aggregate committed tokens/s, mean per-request decode tokens/s, and
whether every concurrent output equals its solo output at the same shape (it must).

    spd bench concurrency [--tokens 64] [--rows 8] [--counts 1,2,4,8] [--cluster-counts 1,2,4]
                          [--out benchmarks/results/concurrency.json]
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from cluster_util import address, running_cluster  # noqa: E402

from spd.core.engine import Request, SPDEngine  # noqa: E402
from spd.core.sampling import SamplingParams  # noqa: E402
from spd.core.stopping import StopRule, eos_ids_of  # noqa: E402
from spd.pipeline import PipelineConfig, build_local  # noqa: E402
from spd.text import encode_prompt  # noqa: E402
from spd_client import SPDClient  # noqa: E402
from results_io import save  # noqa: E402  (benchmarks/ is on sys.path: run as a script or by `spd bench`)

PROMPTS = [  # written for this benchmark (no evaluation set), of different lengths
    "Hi!",
    "Give me three tips for sleeping better.",
    "Explain in simple words how a rainbow forms, and why it is curved.",
    "Write a short poem about a cat who wants to become a sailor.",
    "What is the difference between a list and a tuple in Python? Give an example of each.",
    "Summarise the plot of a detective story you invent, in a few sentences.",
    "List five healthy breakfast ideas and say briefly why each one is good.",
    "A train leaves at 3 pm and travels 120 km at 60 km/h. When does it arrive? Explain.",
]


def in_process(args, counts: list[int]) -> list[dict]:
    torch.set_num_threads(2)
    local = build_local(PipelineConfig(n=args.n))
    eos = eos_ids_of(local.tokenizer, local.config)
    requests = [Request(encode_prompt(local.tokenizer, PROMPTS[i % len(PROMPTS)]), SamplingParams(),
                        StopRule(args.tokens - 4 * (i % 3), eos)) for i in range(max(counts))]
    engine = SPDEngine(local.stages, local.drafter())

    def shape(rows: int) -> None:  # the stages' and the drafter's batch shape
        for stage in local.stages:
            stage.rows = rows
        engine.drafter.rows = rows

    def sequential(reqs, rows):
        shape(rows)
        t0, outs = time.perf_counter(), [engine.generate(*r) for r in reqs]
        return time.perf_counter() - t0, outs

    rows = []
    for R in counts:
        reqs = requests[:R]
        plain_s, plain = sequential(reqs, 1)
        solo_s, solo = sequential(reqs, args.rows)
        shape(args.rows)
        t0 = time.perf_counter()
        together = engine.generate_many(reqs)
        together_s = time.perf_counter() - t0
        tokens = sum(len(g.token_ids) for g in together)
        rows.append({"where": "in process", "R": R, "tokens": tokens, "sequential_rows1_s": plain_s,
                     "sequential_s": solo_s, "concurrent_s": together_s,
                     "concurrent_tok_s": tokens / together_s, "sequential_rows1_tok_s": tokens / plain_s,
                     "per_request_decode_tok_s": _mean([len(g.token_ids) / g.stats.decode_s for g in together]),
                     "identical": [g.token_ids for g in together] == [g.token_ids for g in solo],
                     "ratio_vs_rows1": together_s / plain_s})
        print(rows[-1], flush=True)
    return rows


def _mean(xs):
    return sum(xs) / len(xs) if xs else 0.0


def _stream(client: SPDClient, prompt: str, max_tokens: int) -> tuple[list[int], float]:
    tokens, stats = [], {}
    for chunk in client.stream(prompt, max_tokens=max_tokens):
        tokens += chunk.token_ids
        stats = chunk.stats or stats
    return tokens, stats.get("tokens_per_s", 0.0)


def cluster(args, counts: list[int]) -> list[dict]:
    rows = []
    with running_cluster(Path("runs/bench-logs/concurrency"), n=args.n, max_concurrency=args.cluster_rows) as c:
        with SPDClient(address(c), timeout=600) as client:
            work = [(PROMPTS[i % len(PROMPTS)], args.tokens - 4 * (i % 3)) for i in range(max(counts))]
            _stream(client, *work[0])  # warm-up
            for R in counts:
                t0 = time.perf_counter()
                solo = [_stream(client, *w) for w in work[:R]]
                sequential_s = time.perf_counter() - t0
                with ThreadPoolExecutor(R) as pool:
                    t0 = time.perf_counter()
                    together = list(pool.map(lambda w: _stream(client, *w), work[:R]))
                    concurrent_s = time.perf_counter() - t0
                tokens = sum(len(t) for t, _ in together)
                rows.append({"where": "cluster (n + 2 processes on this machine's cores)", "R": R, "tokens": tokens,
                             "sequential_s": sequential_s, "concurrent_s": concurrent_s,
                             "concurrent_tok_s": tokens / concurrent_s,
                             "per_request_decode_tok_s": _mean([r for _, r in together]),
                             "identical": [t for t, _ in together] == [t for t, _ in solo],
                             "ratio_vs_sequential": concurrent_s / sequential_s})
                print(rows[-1], flush=True)
    return rows


def table(rows: list[dict]) -> str:
    out = ["| where | R | tokens | sequential (s) | concurrent (s) | concurrent / sequential | agg. tok/s | per-request tok/s | identical |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        seq = r.get("sequential_rows1_s", r["sequential_s"])
        out.append(f"| {r['where']} | {r['R']} | {r['tokens']} | {seq:.1f} | {r['concurrent_s']:.1f} | "
                   f"{r['concurrent_s'] / seq:.2f} | {r['concurrent_tok_s']:.1f} | {r['per_request_decode_tok_s']:.1f} | "
                   f"{r['identical']} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=5, help="pipeline stages (default 5)")
    ap.add_argument("--tokens", type=int, default=64, help="max_tokens of the longest request (default 64)")
    ap.add_argument("--rows", type=int, default=8, help="in-process fixed batch shape S (default 8)")
    ap.add_argument("--counts", default="1,2,4,8", help="in-process request counts R")
    ap.add_argument("--cluster-rows", type=int, default=4, help="cluster --max-concurrency (default 4)")
    ap.add_argument("--cluster-counts", default="1,2,4", help="cluster request counts R ('' to skip)")
    ap.add_argument("--out", default="benchmarks/results/concurrency.json")
    args = ap.parse_args()
    rows = in_process(args, [int(x) for x in args.counts.split(",") if x])
    if args.cluster_counts:
        rows += cluster(args, [int(x) for x in args.cluster_counts.split(",")])
    out = {"model": "SmolLM2-135M-Instruct fp32, shipped PDM, greedy", "n": args.n, "rows": args.rows,
           "cluster_rows": args.cluster_rows, "results": rows}
    save(args.out, out, table(rows))


if __name__ == "__main__":
    main()

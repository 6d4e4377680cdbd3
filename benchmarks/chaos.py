"""Benchmark (not a test): fault trials on a live local pipeline of the default model.

Each trial streams one greedy generation and, at a random streamed token, injects one fault:

    stage          kill -9 a random stage
    drafter        kill -9 the drafter
    stage-twice    kill -9 a random stage, and the same role again 8 tokens later
    stage-hung     SIGSTOP a random stage (the launcher kills it after hung_after_s)
    drafter+stage  kill -9 the drafter and a random stage together

once on a cluster without spares and once with `--spares 1`, the same seeded trials on each.
Reported per scenario: trials, completed, token-identical to the fault-free output, and the stall
(the longest gap between streamed tokens in the trial) p50 / p99, beside the fault-free gap.
Every process of the cluster shares this machine's cores, so a re-prefill here costs about n times
what it costs with one device per stage; the stall is measured as it is, not projected.

With `--concurrent R`, every trial streams R requests at once through a `--max-concurrency R`
pipeline (the faults ride on the first one) and counts as completed / identical only if all R are.

    spd bench chaos [--trials 20] [--n 5] [--tokens 48] [--spares 0,1] [--concurrent 1]
                    [--out benchmarks/results/chaos.json]
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from cluster_util import address, pid_of, running_cluster, supervised, wait_for  # noqa: E402

from spd_client import SPDClient  # noqa: E402
from results_io import save  # noqa: E402  (benchmarks/ is on sys.path: run as a script or by `spd bench`)

PROMPTS = ["Tell me a long story about a lighthouse keeper and a storm.",
           "Describe a busy market in a small town, in detail.",
           "Write a letter from a sailor to his sister about the sea.",
           "Explain how bread is made, step by step, as a story."]
SCENARIOS = ("stage", "drafter", "stage-twice", "stage-hung", "drafter+stage")


def plan(rng: random.Random, scenario: str, n: int, tokens: int) -> dict[int, list[tuple[str, int]]]:
    """token index -> [(role, signal)] for one trial."""
    stage, at = f"stage-{rng.randint(1, n)}", rng.randint(3, tokens // 2)
    return {"stage": {at: [(stage, signal.SIGKILL)]},
            "drafter": {at: [("drafter", signal.SIGKILL)]},
            "stage-twice": {at: [(stage, signal.SIGKILL)], at + 8: [(stage, signal.SIGKILL)]},
            "stage-hung": {at: [(stage, signal.SIGSTOP)]},
            "drafter+stage": {at: [("drafter", signal.SIGKILL), (stage, signal.SIGKILL)]}}[scenario]


def settled(cluster, spares: int) -> bool:
    """Every role held by a healthy process, and the spares back (the next trial starts the same)."""
    idle = sum(p.role.startswith("spare") for p in cluster.procs)
    return cluster.healthy() and idle == spares


def stream(cluster, prompt: str, tokens: int, faults: dict) -> dict:
    """One stream; `faults` (token index -> [(role, signal)]) are injected as its tokens arrive."""
    got, stamps, error, stats = [], [], None, {}
    try:
        with SPDClient(address(cluster), timeout=300, retries=0) as client:
            for i, chunk in enumerate(client.stream(prompt, max_tokens=tokens)):
                got += chunk.token_ids
                stats = chunk.stats or stats
                stamps.append(time.perf_counter())
                for role, sig in faults.get(i, []):
                    os.kill(pid_of(cluster, role), sig)
    except Exception as e:  # a failed trial is a result, not a crash of the benchmark
        error = repr(e)
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    return {"tokens": got, "error": error, "stall_s": max(gaps) if gaps else None, "recoveries": stats.get("recoveries")}


def trial(cluster, faults: dict, tokens: int, expected: list[list[int]]) -> dict:
    """len(expected) concurrent streams; the faults ride on the first one's tokens."""
    with ThreadPoolExecutor(len(expected)) as pool:
        runs = list(pool.map(lambda i: stream(cluster, PROMPTS[i], tokens, faults if i == 0 else {}),
                             range(len(expected))))
    stalls = [r["stall_s"] for r in runs if r["stall_s"] is not None]
    return {"faults": {i: [r for r, _ in f] for i, f in faults.items()},
            "completed": all(r["error"] is None for r in runs),
            "identical": all(r["tokens"] == e for r, e in zip(runs, expected)),
            "stall_s": max(stalls) if stalls else None, "recoveries": runs[0]["recoveries"],
            "error": next((r["error"] for r in runs if r["error"]), None)}


def quantile(xs: list[float], q: float) -> float | None:
    xs = sorted(x for x in xs if x is not None)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else None


def run_cluster(args, spares: int) -> dict:
    rng = random.Random(args.seed)  # the same trials for every spare count
    logs = Path("runs/bench-logs/chaos") / f"spares{spares}-r{args.concurrent}"
    with running_cluster(logs, n=args.n, spares=spares, max_concurrency=args.concurrent) as cluster, supervised(cluster):
        with SPDClient(address(cluster), timeout=300) as client:
            expected = [client.generate(p, max_tokens=args.tokens).token_ids for p in PROMPTS[:args.concurrent]]
        calm = trial(cluster, {}, args.tokens, expected)
        rows = []
        for scenario in SCENARIOS:
            for t in range(args.trials):
                wait_for(lambda: settled(cluster, spares), 180, "the cluster settled", period_s=0.2)
                rows.append({"scenario": scenario, **trial(cluster, plan(rng, scenario, args.n, args.tokens),
                                                           args.tokens, expected)})
                print(f"spares {spares} {scenario} {t}: {rows[-1]}", flush=True)
    summary = {}
    for scenario in SCENARIOS:
        rs = [r for r in rows if r["scenario"] == scenario]
        summary[scenario] = {"trials": len(rs), "completed": sum(r["completed"] for r in rs),
                             "identical": sum(r["identical"] for r in rs),
                             "stall_p50_s": quantile([r["stall_s"] for r in rs], 0.5),
                             "stall_p99_s": quantile([r["stall_s"] for r in rs], 0.99)}
    return {"spares": spares, "fault_free_longest_gap_s": calm["stall_s"], "summary": summary, "trials": rows}


def table(runs: list[dict]) -> str:
    lines = ["| scenario | spares | completed | identical | stall p50 (s) | stall p99 (s) |", "|---|---|---|---|---|---|"]
    for scenario in SCENARIOS:
        for run in runs:
            s = run["summary"][scenario]
            lines.append(f"| {scenario} | {run['spares']} | {s['completed']}/{s['trials']} | {s['identical']}/{s['trials']} "
                         f"| {s['stall_p50_s']:.2f} | {s['stall_p99_s']:.2f} |")
    calm = ", ".join(f"spares {r['spares']}: {r['fault_free_longest_gap_s']:.2f} s" for r in runs)
    return "\n".join(lines) + f"\n\nLongest gap between tokens in a fault-free trial: {calm}."


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=20, help="trials per scenario (default 20)")
    ap.add_argument("--n", type=int, default=5, help="pipeline stages (default 5)")
    ap.add_argument("--tokens", type=int, default=48, help="max_tokens per trial (default 48)")
    ap.add_argument("--spares", default="0,1", help="spare counts to compare, comma-separated (default 0,1)")
    ap.add_argument("--concurrent", type=int, default=1, help="streams per trial, in a --max-concurrency "
                    "pipeline of that size (default 1); faults ride on the first stream")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="benchmarks/results/chaos.json")
    args = ap.parse_args()
    runs = [run_cluster(args, int(k)) for k in args.spares.split(",")]
    out = {"model": "SmolLM2-135M-Instruct (embedded default), shipped PDM", "n": args.n, "tokens": args.tokens,
           "concurrent": args.concurrent,
           "cores": os.cpu_count(), "runs": runs}
    save(args.out, out, table(runs))


if __name__ == "__main__":
    main()

"""Benchmark (not a test): chaos trials on a live local pipeline.

Each trial streams one greedy generation and kill -9s something at a random streamed token:
a random stage, the drafter, two stages at once, or the orchestrator (the SDK then retries). The
supervisor restarts what died. Reported: trials, completed, token-identical to the fault-free
output, and recovery time = the longest gap between streamed tokens in the trial (p50/p99).

    python benchmarks/chaos.py [--trials 20] [--n 3] [--seed 0] [--out benchmarks/results/chaos.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from cluster_util import address, pid_of, running_cluster, supervised  # noqa: E402

from spd.models.loading import cache_dir, resolve_model  # noqa: E402
from spd.models.tiny import make_tiny_model  # noqa: E402
from spd_client import SPDClient  # noqa: E402

PROMPT = "tell me a long story about a lighthouse"


def trial(cluster, rng: random.Random, n: int, max_tokens: int, expected: list[int]) -> dict:
    kind = rng.choice(["stage", "drafter", "two-stages", "orchestrator"])
    victims = {"stage": [f"stage-{rng.randint(1, n)}"], "drafter": ["drafter"], "orchestrator": ["orchestrator"],
               "two-stages": [f"stage-{j}" for j in rng.sample(range(1, n + 1), 2)]}[kind]
    after = rng.randint(3, max_tokens // 2)
    tokens, stamps, error = [], [], None
    try:
        with SPDClient(address(cluster), timeout=300, retries=20, backoff=0.5) as client:
            for i, chunk in enumerate(client.stream(PROMPT, max_tokens=max_tokens)):
                tokens += chunk.token_ids
                stamps.append(time.perf_counter())
                if i == after:
                    for role in victims:
                        os.kill(pid_of(cluster, role), signal.SIGKILL)
    except Exception as e:  # a failed trial is a result, not a crash of the benchmark
        error = repr(e)
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    deadline = time.monotonic() + 120
    while not cluster.healthy() and time.monotonic() < deadline:  # restarts done before the next trial
        time.sleep(0.5)
    return {"kill": kind, "victims": victims, "after_token": after, "completed": error is None,
            "identical": tokens == expected, "recovery_s": max(gaps) if gaps else None, "error": error}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--n", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=120)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="benchmarks/results/chaos.json")
    args = ap.parse_args()
    model = make_tiny_model(cache_dir() / "bench" / "tiny-chat-8", "llama", vocab_size=49152, num_layers=8,
                            hidden_size=64, tokenizer_from=resolve_model(None))
    rng = random.Random(args.seed)
    with running_cluster(Path("runs/bench-logs/chaos"), n=args.n, model=str(model), draft="random") as cluster:
        with supervised(cluster):
            with SPDClient(address(cluster), timeout=300) as client:
                expected = client.generate(PROMPT, max_tokens=args.tokens).token_ids
            rows = []
            for t in range(args.trials):
                rows.append(trial(cluster, rng, args.n, args.tokens, expected))
                print(f"trial {t}: {rows[-1]}", flush=True)
    rec = sorted(r["recovery_s"] for r in rows if r["recovery_s"] is not None)
    summary = {"trials": len(rows), "completed": sum(r["completed"] for r in rows),
               "identical": sum(r["identical"] for r in rows),
               "recovery_p50_s": rec[len(rec) // 2] if rec else None,
               "recovery_p99_s": rec[min(len(rec) - 1, int(0.99 * len(rec)))] if rec else None,
               "model": "tiny random Llama (8 layers) with SmolLM2's tokenizer", "n": args.n}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"summary": summary, "trials": rows}, indent=1))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()

"""Benchmark (not a test): the distributed runtime's fixed per-cycle cost, and the cycle profile.

1. Zero-compute stages (`spd stage --zero-compute`) and a scripted drafter that is always right,
   for n in {2, 4, 8}: every cycle is a steady-state pipeline cycle, so the time between committed
   tokens at the client is the runtime's own cost per cycle (ZeroMQ hops, msgpack, orchestrator,
   gRPC stream). Reported as p50/p99 microseconds of the orchestrator's time between accepted
   commits, beside one ZeroMQ hop measured in the same run.
2. The cycle profile on the default model (n = 5): stage compute, draft, verification and what is
   left (transport + waiting), per committed token. On this 2-core machine all n + 2 processes
   share two cores, so the stages run one after another, not in parallel: the wall-clock here is
   NOT a pipeline speedup measurement.

    python benchmarks/runtime_overhead.py [--tokens 300] [--out benchmarks/results/runtime_overhead.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import zmq

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from cluster_util import address, running_cluster  # noqa: E402

from spd import wire  # noqa: E402
from spd.models.loading import cache_dir, load_tokenizer, resolve_model  # noqa: E402
from spd.models.tiny import make_tiny_model  # noqa: E402
from spd_client import SPDClient  # noqa: E402
from results_io import save  # noqa: E402  (benchmarks/ is on sys.path: run as a script or by `spd bench`)

PROMPT = "hello"
LOGS = Path("runs/bench-logs")  # per-process logs of the clusters started here


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def zmq_hop_us(reps: int = 2000, hidden: int = 576) -> dict:
    """One PUSH->PULL hop over loopback TCP with a HIDDEN-sized message (ping-pong / 2)."""
    ctx = zmq.Context()
    a_in, b_in = ctx.socket(zmq.PULL), ctx.socket(zmq.PULL)
    pa, pb = a_in.bind_to_random_port("tcp://127.0.0.1"), b_in.bind_to_random_port("tcp://127.0.0.1")
    to_b, to_a = ctx.socket(zmq.PUSH), ctx.socket(zmq.PUSH)
    to_b.connect(f"tcp://127.0.0.1:{pb}")
    to_a.connect(f"tcp://127.0.0.1:{pa}")
    h = torch.zeros(1, hidden)
    samples = []
    try:
        for i in range(reps):
            t0 = time.perf_counter()
            wire.send(to_b, wire.Hidden(rid="b", epoch=1, pos=i, base=0, tokens=[0], h=h))
            m = wire.recv(b_in, 1000)
            assert isinstance(m, wire.Hidden)
            wire.send(to_a, wire.Hidden(rid="b", epoch=1, pos=i, base=0, tokens=[0], h=m.h))
            wire.recv(a_in, 1000)
            samples.append((time.perf_counter() - t0) / 2 * 1e6)
    finally:
        ctx.destroy(linger=0)
    samples = samples[reps // 10:]
    return {"p50_us": statistics.median(samples), "p99_us": pct(samples, 0.99)}


def zero_compute(n: int, tokens: int, model_dir: Path) -> dict:
    tok = load_tokenizer(model_dir)
    last = tok.encode(PROMPT, add_special_tokens=False)[-1]
    V = tok.vocab_size if hasattr(tok, "vocab_size") else 49152
    script = ",".join(str((last + k) % 49152) for k in range(1, tokens + 1))
    with running_cluster(
            LOGS / f"zero-n{n}", n=n, model=str(model_dir), extra_stage_args=["--zero-compute"],
            extra_drafter_args=["--script", script]) as cluster:
        with SPDClient(address(cluster), timeout=300) as client:
            client.generate(PROMPT, raw=True, max_tokens=16)  # warm up
            stamps, stats = [], None
            for chunk in client.stream(PROMPT, raw=True, max_tokens=tokens):
                stamps.append(time.perf_counter())
                stats = chunk.stats or stats
    gaps = [1e6 * (b - a) for a, b in zip(stamps, stamps[1:])][n + 5:-1]
    return {"n": n, "tokens": tokens, "accepts": stats["accepts"], "rejects": stats["rejects"],
            "cycles": stats["cycles"], "cycle_p50_us": 1e3 * stats["cycle_ms_p50"], "cycle_p99_us": 1e3 * stats["cycle_ms_p99"],
            "client_gap_p50_us": statistics.median(gaps), "client_gap_p99_us": pct(gaps, 0.99),
            "decode_us_per_cycle": 1e3 * stats["decode_ms"] / max(stats["cycles"], 1), "vocab": V}


def cycle_profile(tokens: int) -> dict:
    prompt = "Explain in a few sentences how a CPU cache works."
    with running_cluster(LOGS / "profile-n5", n=5) as cluster:
        with SPDClient(address(cluster), timeout=600) as client:
            client.generate(prompt, max_tokens=8)
            r = client.generate(prompt, max_tokens=tokens)
    s = r.stats
    N, K = s["generated_tokens"], s["cycles"]
    judged = s["accepts"] + s["rejects"]
    cycle_ms = s["decode_ms"] / max(K, 1)
    return {"n": 5, "N": N, "K": K, "alpha": s["alpha"], "accepts": s["accepts"], "rejects": s["rejects"],
            "decode_ms_per_token": s["decode_ms"] / max(N - 1, 1), "cycle_ms": cycle_ms,
            "stage_ms": s["stage_ms"], "draft_ms_per_draft": s["draft_ms"] / max(s["drafts"], 1),
            "verify_ms_per_judgement": s["verify_ms"] / max(judged, 1),
            "note": "all processes share 2 CPU cores: stage forwards serialise; not a pipeline wall-clock"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=300)
    ap.add_argument("--profile-tokens", type=int, default=48)
    ap.add_argument("--skip-profile", action="store_true")
    ap.add_argument("--ns", default="2,4,8", help="pipeline widths of the zero-compute runs")
    ap.add_argument("--out", default="benchmarks/results/runtime_overhead.json")
    args = ap.parse_args()
    ns = [int(n) for n in args.ns.split(",")]
    layers = max(8, *ns)  # one layer per stage at least
    model_dir = make_tiny_model(cache_dir() / "bench" / f"tiny-chat-{layers}", "llama", vocab_size=49152,
                                num_layers=layers, hidden_size=64, tokenizer_from=resolve_model(None))
    hop = zmq_hop_us()
    rows = [zero_compute(n, args.tokens, model_dir) for n in ns]
    result = {"zmq_hop": hop, "zero_compute": rows}
    if not args.skip_profile:
        result["cycle_profile_default_model"] = cycle_profile(args.profile_tokens)
    lines = [f"one ZeroMQ hop (HIDDEN-sized, loopback): p50 {hop['p50_us']:.0f} us, p99 {hop['p99_us']:.0f} us", "",
             "runtime cost per cycle (orchestrator: time between accepted commits), zero-compute stages:", "",
             "| n | cycle p50 us | cycle p99 us | mean us | accepts/rejects |", "|---|---|---|---|---|"]
    lines += [f"| {r['n']} | {r['cycle_p50_us']:.0f} | {r['cycle_p99_us']:.0f} | {r['decode_us_per_cycle']:.0f} | "
              f"{r['accepts']}/{r['rejects']} |" for r in rows]
    if "cycle_profile_default_model" in result:
        lines += ["", "cycle profile, default model, n = 5: " + json.dumps(result["cycle_profile_default_model"])]
    save(args.out, result, "\n".join(lines))


if __name__ == "__main__":
    main()

"""Benchmark (not a test): batched matmul rate by dtype on this machine, and the dtype that batched
teacher and trainer work picks here (`spd.train.precision`).

Shapes are SmolLM2's: a decode step's MLP up-projection at 1 and 128 rows, the LM head at 128 rows,
and a prefill chunk of 2048 rows. Each cell is the best of a few timed runs, GFLOP/s.

    spd bench matmul_dtypes [--threads 2]
"""

from __future__ import annotations

import argparse
import time

import torch

from spd.train.precision import BF16_CPU_FLAGS, batched_dtype, cpu_flags
from results_io import save  # noqa: E402  (benchmarks/ is on sys.path: run as a script or by `spd bench`)

SHAPES = [(1, 1536, 576), (128, 1536, 576), (128, 49152, 576), (2048, 1536, 576)]  # (rows M, out N, in K)
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@torch.inference_mode()
def gflops(m: int, n: int, k: int, dtype: torch.dtype, seconds: float = 0.5) -> float:
    x, w = torch.randn(m, k, dtype=dtype), torch.randn(n, k, dtype=dtype)
    torch.nn.functional.linear(x, w)
    best, t_end = float("inf"), time.perf_counter() + seconds
    while time.perf_counter() < t_end or best == float("inf"):
        t0 = time.perf_counter()
        torch.nn.functional.linear(x, w)
        best = min(best, time.perf_counter() - t0)
    return 2 * m * n * k / best / 1e9


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="spd bench matmul_dtypes")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results/matmul_dtypes.json")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = [{"shape": list(s), **{str(d).split(".")[1]: round(gflops(*s, d), 1) for d in DTYPES}} for s in SHAPES]
    picked = str(batched_dtype("cpu")).split(".")[1]
    flags = sorted(cpu_flags() & set(BF16_CPU_FLAGS))
    names = [str(d).split(".")[1] for d in DTYPES]
    table = "| M x N x K | " + " | ".join(names) + " |\n|---|" + "---|" * len(names) + "\n"
    table += "".join(f"| {' x '.join(map(str, r['shape']))} | " + " | ".join(f"{r[n]:.0f}" for n in names) + " |\n"
                     for r in rows)
    table += (f"\nGFLOP/s, {args.threads} threads, torch CPU capability {torch.backends.cpu.get_cpu_capability()}; "
              f"bf16 CPU flags: {', '.join(flags) or 'none'}; batched teacher/trainer work runs in {picked} here.")
    save(args.out, {"threads": args.threads, "capability": torch.backends.cpu.get_cpu_capability(),
                    "bf16_flags": flags, "batched_dtype": picked, "rows": rows}, table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

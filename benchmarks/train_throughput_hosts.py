"""`spd bench train_throughput_hosts`: the `train_throughput` runs of several machines as one table,
a row per machine (each run is `results/train_throughput/HOST.json`, named for the machine it ran on).
It reads those files and measures nothing: each ratio in it was measured side by side in its own run.

    spd bench train_throughput_hosts [--runs benchmarks/results/train_throughput]
                                     [--out benchmarks/results/train_throughput_hosts.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from results_io import save


def row(host: str, run: dict) -> dict:
    """One machine's figures: its bf16 units, GEMM and read rates, and each stage's old and new rates."""
    cpu, teacher = run["machine"], run["teacher"]
    units = "AMX" if cpu["amx_bf16"] else "avx512_bf16" if cpu["avx512_bf16"] else "none (fp32)"
    stages = {name: (run[name]["old"][key], run[name]["new"][key]) for name, key in
              (("teacher", "tokens_per_s"), ("trainer", "positions_per_s"), ("eagle3_trainer", "positions_per_s"))
              if name in run}
    gemm = cpu.get("gemm_gflops", cpu.get("bf16_gemm_gflops"))  # (its name in runs before 4543865)
    return {"host": host, "bf16_units": units, "gemm_gflops": gemm,
            "read_gb_s": cpu["read_gb_s"], "prompts": run["prompts"],
            "teacher_ceiling_tok_s": cpu["teacher_ceiling_tok_s"],
            "ceiling_reached": teacher["new"]["tokens_per_s"] / cpu["teacher_ceiling_tok_s"], "stages": stages}


def cell(stage: tuple[float, float] | None) -> str:
    return f"{stage[0]:.0f} → {stage[1]:.0f} ({stage[1] / stage[0]:.2f}×)" if stage else "—"


def table(rows: list[dict]) -> str:
    head = ("| host | bf16 units | GEMM GFLOPS | read GB/s | prompts | teacher tok/s | teacher ceiling (new reaches) "
            "| trainer positions/s | EAGLE-3 TTT 4 positions/s |\n|---|---|---|---|---|---|---|---|---|\n")
    return head + "".join(
        f"| {r['host']} | {r['bf16_units']} | {r['gemm_gflops']} | {r['read_gb_s']} | {r['prompts']} "
        f"| {cell(r['stages']['teacher'])} | {r['teacher_ceiling_tok_s']} ({r['ceiling_reached']:.0%}) "
        f"| {cell(r['stages']['trainer'])} | {cell(r['stages'].get('eagle3_trainer'))} |\n" for r in rows) + (
        "\nOld → new (new / old), 2 threads, responses ≤ 256; each row is one run of `spd bench train_throughput` "
        "on that machine, old and new side by side, at the commit that last wrote its file. The teacher ceiling is "
        "every matmul at the GEMM rate and decode attention reading only the real K/V at the read rate.\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="spd bench train_throughput_hosts")
    ap.add_argument("--runs", default="benchmarks/results/train_throughput", help="folder of HOST.json runs")
    ap.add_argument("--out", default="benchmarks/results/train_throughput_hosts.json")
    args = ap.parse_args(argv)
    rows = [row(p.stem, json.loads(p.read_text())) for p in sorted(Path(args.runs).glob("*.json"))]
    rows.sort(key=lambda r: r["stages"]["teacher"][1] / r["stages"]["teacher"][0])
    save(args.out, {"hosts": rows}, table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

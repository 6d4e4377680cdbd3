"""Benchmark tool (not a test): one draft's acceptance over a whole set, from benchmarks/acceptance.py
runs on disjoint, contiguous prompt ranges (--skip S --prompts K), summed exactly: N and K add up,
α = N/K and S0 = n·N/K over all the prompts (not a mean of the parts' S0).

    python benchmarks/acceptance_merge.py --set humaneval --out OUT.json \
        PART.json:LABEL [PART.json:LABEL ...]

Each PART is an acceptance JSON and LABEL the draft's label in it (runs made at different times label
the same weights differently). The parts must tile prompts 1..total with no gap or overlap, and share
n, schedule and max_tokens; the table says how many prompts the set has in all.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from spd.eval.prompts import SETS, load
from results_io import save  # (benchmarks/ is on sys.path: run as a script)


def merge(parts: list[tuple[str, dict, str]], set_: str) -> dict:
    """Sum one set's N and K over parts [(file, acceptance JSON, label)] that tile the prompts in order."""
    first = parts[0][1]
    rows, n_sum, k_sum, end = [], 0, 0, 0
    for file, run, label in sorted(parts, key=lambda p: p[1].get("skip", 0)):
        for key in ("n", "schedule", "max_tokens"):
            if run[key] != first[key]:
                raise SystemExit(f"parts differ in {key}: {run[key]} != {first[key]}")
        skip, got = run.get("skip", 0), run["drafts"][label]["sets"][set_]
        if skip != end:
            raise SystemExit(f"prompts {end + 1}..{skip} are in no part (or two parts overlap)")
        end = skip + got["prompts"]
        n_sum, k_sum = n_sum + got["N"], k_sum + got["K"]
        rows.append({"prompts": f"{skip + 1}-{end}", "file": file, "label": label, "N": got["N"], "K": got["K"],
                     "S0": first["n"] * got["N"] / got["K"]})
    return {"set": set_, "n": first["n"], "schedule": first["schedule"], "max_tokens": first["max_tokens"],
            "prompts": end, "set_size": len(load(set_)),
            "N": n_sum, "K": k_sum, "alpha": n_sum / k_sum, "S0": first["n"] * n_sum / k_sum, "parts": rows}


def table(m: dict) -> str:
    lines = [f"{m['set']}: prompts 1-{m['prompts']} of {m['set_size']}, n = {m['n']}, <= {m['max_tokens']} tokens", "",
             "| prompts | label | N | K | S0 |", "|---|---|---|---|---|"]
    lines += [f"| {r['prompts']} | {r['label']} | {r['N']} | {r['K']} | {r['S0']:.3f} |" for r in m["parts"]]
    lines.append(f"| **all {m['prompts']}** | | **{m['N']}** | **{m['K']}** | **{m['S0']:.3f}** |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("parts", nargs="+", help="PART.json:LABEL")
    ap.add_argument("--set", required=True, choices=SETS)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    parts = [(f, json.loads(Path(f).read_text()), label) for f, label in (a.rsplit(":", 1) for a in args.parts)]
    m = merge(parts, args.set)
    save(args.out, m, table(m))


if __name__ == "__main__":
    main()

"""One table over several result folders of acceptance_*.json (benchmarks/acceptance.py) and
fills_<label>.json (benchmarks/train_eval.py): per draft, held-out agreement at fill 1 and n and the α
those fills imply, then S0 = n·α per evaluation set (SPD) or the oracle τ (EAGLE-3), exact replays.

    python benchmarks/drafts_table.py benchmarks/results/equal-400000 benchmarks/results/fill-400000 ... \
        --out benchmarks/results/drafts_400k.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from results_io import save  # noqa: E402  (benchmarks/ is on sys.path)

SETS = ("mtbench", "gsm8k", "humaneval")


def rows_of(folder: Path) -> list[dict]:
    rows: dict[str, dict] = {}
    for path in sorted(folder.glob("acceptance_*.json")):
        result = json.loads(path.read_text())
        for label, d in result.get("drafts", {}).items():
            row = rows.setdefault(label, {"draft": label, "kind": "SPD S0"})
            row.update({name: r["S0"] for name, r in d["sets"].items()})
        for label, d in result.get("eagle", {}).items():
            row = rows.setdefault(label, {"draft": label, "kind": f"EAGLE-3 τ (k = {d['k']})"})
            row.update({name: r["tau"] for name, r in d["sets"].items()})
    for path in sorted(folder.glob("fills_*.json")):
        label, f = path.stem.removeprefix("fills_"), json.loads(path.read_text())
        row = rows.setdefault(label, {"draft": label, "kind": "SPD S0"})
        row.update(p_a1=f["a1"]["p"], p_an=f[f"a{f['n']}"]["p"], s0_heldout=f.get("s0_judged"))
    return [dict(row, folder=folder.name) for row in rows.values()]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("folders", nargs="+")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    rows = [r for f in args.folders for r in rows_of(Path(f))]
    fmt = lambda v: "" if v is None else f"{v:.3f}" if v < 1 else f"{v:.2f}"  # noqa: E731
    lines = ["| run | draft | held-out p(a=1) | p(a=n) | held-out S0 from fills | figure | "
             + " | ".join(SETS) + " |", "|---" * (6 + len(SETS)) + "|"]
    for r in rows:
        lines.append(f"| {r['folder']} | {r['draft']} | {fmt(r.get('p_a1'))} | {fmt(r.get('p_an'))} | "
                     f"{fmt(r.get('s0_heldout'))} | {r['kind']} | " + " | ".join(fmt(r.get(s)) for s in SETS) + " |")
    save(args.out, {"rows": rows}, "\n".join(lines))


if __name__ == "__main__":
    main()

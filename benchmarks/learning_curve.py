"""The drafter's learning curve on a log-token axis, and the budget it projects for S0 = n·α ≥ 2.

Held-out top-1 agreement p (fill a = n) against training tokens, for the shipped PDM (its
config.json carries its curve) and any run histories given; a fit p = a + b·log2(tokens) per
series (points >= 50k tokens). What p must reach: with judged-draft acceptance P, an accepted draft
commits a token in one cycle and a rejected one costs a flush of n cycles, so
    α = 1 / (P + n(1 - P)),   S0 = n·α ≥ S   <=>   P ≥ (n - n/S) / (n - 1)
(P = 0.359 gives α = 0.281 at n = 5, as the engine measured: 0.282); n = 5, S = 2 needs P ≥ 0.625.
p at a = n stands in for P (the model card: 0.360 vs 0.359). The projection extrapolates a
log-linear fit, which real curves bend below, and the shipped curve is one run whose learning rate
decays to 0 at its end (its late points gain from the annealing): so the projection is a lower
bound on the budget, labelled so.

The shipped PDM's own notes hold only its last run's curve; a warm start's lineage is given as run
segments of one name, each offset by the tokens its base had seen in all (NAME=PATH@OFFSET), e.g.

  spd bench learning_curve --run "shipped=benchmarks/results/long_run_spd-n5-ls1_history.jsonl" \
      --run "shipped=benchmarks/results/warm-prevj30-300k/history.jsonl@2000827" [--n 5] [--s0 2]
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
from results_io import save

ROOT = Path(__file__).resolve().parents[1]
FIT_FROM = 50_000  # tokens: the fit ignores the first minutes of a run
SHIPPED = ROOT / "services/spd/assets/drafts/SmolLM2-135M-Instruct/config.json"


def needed_p(n: int, s0: float) -> float:
    return (n - n / s0) / (n - 1)


def fit(points: list[tuple[int, float]]) -> tuple[float, float] | None:
    """(a, b) of p = a + b·log2(tokens), least squares over the points with >= FIT_FROM tokens."""
    pts = [(math.log2(t), p) for t, p in points if t >= FIT_FROM]
    if len(pts) < 2:
        return None
    b, a = np.polyfit([x for x, _ in pts], [y for _, y in pts], 1)
    return float(a), float(b)


def shipped_curve() -> list[tuple[int, float]]:
    """The shipped PDM's curve from its notes, on the axis of tokens in all (a warm start's points
    offset by what its base had seen)."""
    notes = json.loads(SHIPPED.read_text())["notes"]
    base = int(notes.get("init_from", {}).get("tokens_seen") or 0)
    return [(base + int(t), float(p)) for t, p in notes["curve"]]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", action="append", default=[],
                    help="NAME=path/to/history.jsonl[@OFFSET] (repeatable; segments of one NAME join, OFFSET tokens later)")
    ap.add_argument("--n", type=int, default=5, help="pipeline width (default 5)")
    ap.add_argument("--s0", type=float, default=2.0, help="target S0 = n·α (default 2)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/learning_curve.json"), help="JSON out (.md and .png beside it)")
    args = ap.parse_args()
    series = {} if args.run else {"shipped PDM": shipped_curve()}
    for spec in args.run:
        name, path = spec.split("=", 1)
        path, _, offset = path.partition("@")
        rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
        series.setdefault(name, []).extend((int(offset or 0) + int(r["seen"]), float(r["heldout_p"])) for r in rows)
    target = needed_p(args.n, args.s0)
    out: dict = {"n": args.n, "s0_target": args.s0, "p_needed": target, "series": {}}
    rows = []
    for name, pts in series.items():
        f = fit(pts)
        entry: dict = {"points": pts, "fit": f}
        if f and f[1] > 0:
            entry["projected_tokens"] = 2 ** ((target - f[0]) / f[1])  # a lower bound (see the docstring)
        out["series"][name] = entry
        last = max(pts)
        rows.append([name, f"{last[0]:,}", f"{last[1]:.3f}", f"{f[1]:+.3f}" if f else "-",
                     f"{entry['projected_tokens'] / 1e6:.0f}M" if "projected_tokens" in entry else "-"])
    table = (f"Held-out p needed for S0 = {args.n}·α ≥ {args.s0}: **{target:.3f}** (α = 1/(P + n(1−P)))\n\n"
             "| series | tokens (last) | p (last) | p per doubling (fit) | projected tokens for the target (lower bound) |\n"
             "|---|---|---|---|---|\n" + "\n".join("| " + " | ".join(r) + " |" for r in rows) + "\n")
    save(Path(args.out), out, table)
    _plot(series, out, target, Path(args.out).with_suffix(".png"))
    return 0


def _plot(series: dict, out: dict, target: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, pts in series.items():
        pts = [(t, p) for t, p in pts if t > 0]
        ax.plot([t for t, _ in pts], [p for _, p in pts], "o-", label=name)
        f = out["series"][name]["fit"]
        if f and "projected_tokens" in out["series"][name]:
            xs = [min(t for t, _ in pts if t >= FIT_FROM), out["series"][name]["projected_tokens"]]
            ax.plot(xs, [f[0] + f[1] * math.log2(x) for x in xs], "--", alpha=0.6, label=f"{name}: log-linear fit (projection)")
    ax.axhline(target, color="grey", lw=0.8)
    ax.text(ax.get_xlim()[0] if ax.get_xlim()[0] > 0 else 5e4, target + 0.01, f"S0 = 2 needs p ≥ {target:.3f}", fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("assistant tokens trained on (log)")
    ax.set_ylabel("held-out top-1 agreement p (a = n)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    raise SystemExit(main())

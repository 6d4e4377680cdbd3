"""Turn the harness's raw counts into design §5 metrics, a markdown report and PNG plots.

Columns, per method (all ratios are over single-process greedy/sampled AR of the same target):
  S0    oracle speedup (draft cost 0): SPD/PPSD n·α, EAGLE-3 τ
  S     draft-cost adjusted with c = draft time / AR token time measured here (EAGLE-3: both timed in
        its own evaluation run; SPD / PPSD: in the quiet costs phase):
        SPD pre-step α / max(1/n, c); SPD post-step and PPSD n·α / (1 + n·c); EAGLE-3 τ / (1 + k·c)
  wall  EAGLE-3: MEASURED decode tok/s over AR's (same prompts, same process, this CPU).
        SPD / PPSD: PROJECTED from measured stage, draft and runtime-overhead times (spd.eval.costs):
        tok/s = α / cycle, cycle = max(stage, draft) + overhead (pre) or stage + draft + overhead (post),
        stage never below AR / n (spd.eval.costs), so the projection is at most S0.
"""

from __future__ import annotations

import json
from pathlib import Path

from spd.eval.costs import projected_cycle_ms
from spd.eval.methods import Method

SET_NAMES = {"mtbench": "MT-Bench", "mtbench2": "MT-Bench turn 2", "gsm8k": "GSM8K", "humaneval": "HumanEval"}


def _sum(tallies: list[dict]) -> dict:
    out: dict[str, float] = {}
    for t in tallies:
        for k, v in t.items():
            out[k] = out.get(k, 0) + v
    return out


def metrics(m: Method | None, t: dict, ar: dict, costs: dict, prompts: int) -> dict:
    """Metrics of one method from its tally `t`, AR's tally `ar` over the same prompts, and costs."""
    ar_ms = costs["ar_token_ms"]
    ar_tps = (ar["N"] - prompts) / ar["decode_s"] if ar.get("decode_s") else None
    if m is None:  # AR itself
        return {"acceptance": None, "S0": 1.0, "S": 1.0, "wall": 1.0, "wall_kind": "measured", "tok_s": ar_tps}
    if m.kind == "eagle3":
        rounds = t["K"]
        tau = (t["N"] - prompts) / rounds if rounds else None
        step_ms = 1e3 * t.get("draft_s", 0.0) / max(rounds * m.k, 1)
        c = step_ms / (1e3 / ar_tps) if ar_tps else None  # both timed in the same run, under the same load
        tps = (t["N"] - prompts) / t["decode_s"] if t.get("decode_s") else None
        return {"acceptance": tau, "acceptance_kind": "tau", "S0": tau, "c": c, "S": tau / (1 + m.k * c) if tau and c is not None else None,
                "wall": tps / ar_tps if tps and ar_tps else None, "wall_kind": "measured", "tok_s": tps,
                "mismatches": t.get("mismatches", 0)}
    alpha = t["N"] / t["K"] if t["K"] else None
    n = m.n
    draft = costs["draft_ms"].get(m.label)
    stage = max(costs["stage_ms"][str(n)]) if str(n) in costs["stage_ms"] else None
    over = costs["overhead_ms"].get(str(n)) or 0.0
    c = draft / ar_ms if draft is not None else None
    out = {"acceptance": alpha, "acceptance_kind": "alpha", "S0": n * alpha if alpha else None, "c": c}
    if alpha and c is not None:
        out["S"] = alpha / max(1 / n, c) if m.schedule == "pre" else n * alpha / (1 + n * c)
    if alpha and draft is not None and stage is not None:
        cycle = projected_cycle_ms(stage, draft, over, m.schedule, ar_ms, n)
        out.update(cycle_ms=cycle, tok_s=1e3 * alpha / cycle, wall=alpha * ar_ms / cycle, wall_kind="projected")
    return out


def compute(methods: list[Method], accept: dict, costs: dict) -> dict:
    """{T: {set | "overall": {label: metrics}}} from {set: accept file} and the costs."""
    out: dict[str, dict[str, dict]] = {}
    temps = sorted({T for f in accept.values() for T in f["results"]})
    for T in temps:
        out[T] = {}
        sets = [s for s in accept if T in accept[s]["results"]]
        for s in sets + ["overall"]:
            chosen = sets if s == "overall" else [s]
            rows = [accept[x]["results"][T] for x in chosen]
            p = sum(accept[x]["prompts"] for x in chosen)
            ar = _sum([r["AR"] for r in rows])
            res = {"AR": metrics(None, ar, ar, costs, p)}
            for m in methods:
                if all(m.label in r for r in rows):
                    res[m.label] = metrics(m, _sum([r[m.label] for r in rows]), ar, costs, p)
            out[T][s] = res
    return out


def _f(x, nd=2):
    return "–" if x is None else f"{x:.{nd}f}"


def _cell(r: dict) -> str:
    wall = _f(r.get("wall")) + ("" if r.get("wall_kind") != "projected" else "ᵖ")
    return f"{_f(r.get('S0'))} / {_f(r.get('S'))} / {wall}"


def markdown(cfg: dict, methods: list[Method], missing: list[Method], table: dict, costs: dict,
             check: dict | None, plots: list[str], notes: str | None = None) -> str:
    L = [f"# SPD evaluation report — {cfg['model']}", "",
         f"Command: `{cfg['command']}`  ", f"Prompts: first {cfg['prompts']} of each set, ≤ {cfg['max_tokens']} generated "
         f"tokens, chat template; T = 0 and T = {cfg.get('t1', 1.0)} with top-k {cfg['top_k']}, top-p {cfg['top_p']}; "
         f"{cfg['threads']} torch thread(s), fp32, CPU. Generated {cfg['date']}.", "",
         "Cells: **S0 / S / wall** — S0 oracle speedup, S draft-cost adjusted (c measured here), wall = wall-clock "
         "speedup over AR: EAGLE-3 *measured*, SPD/PPSD *projected* (marked ᵖ) from measured stage, draft and "
         "runtime-overhead times. T = 0 SPD/PPSD acceptance is exact (offline replay = live engine); T > 0 is the "
         "Σ min(p, q) estimate (checked against live runs below); EAGLE-3 always runs live.", ""]
    if notes:
        L += ["## Reading the results", "", notes.strip(), ""]
    for T, per in table.items():
        sets = [s for s in per if s != "overall"]
        L += [f"## Main comparison, T = {T}", "",
              "| method | " + " | ".join(SET_NAMES.get(s, s) for s in sets) + " | overall | acceptance (overall) |",
              "|---|" + "---|" * (len(sets) + 2)]
        for label in ["AR"] + [m.label for m in methods if "main" in m.groups]:
            if label not in per["overall"]:
                continue
            r = per["overall"][label]
            acc = r.get("acceptance")
            acc_s = "–" if acc is None else (f"τ = {acc:.2f}" if r.get("acceptance_kind") == "tau" else f"α = {acc:.3f}")
            L.append(f"| {label} | " + " | ".join(_cell(per[s][label]) for s in sets) + f" | {_cell(r)} | {acc_s} |")
        L.append("")
    T0 = next(iter(table))
    ov = table[T0]["overall"]
    for group, title, cols in (("n", "Pipeline width n (T = {T})", "n"), ("ls", "PDM depth L_s at n = 5 (T = {T})", "L_s"),
                               ("schedule", "Pre- vs post-step at n = 5 (T = {T})", "schedule")):
        rows = [m for m in methods if group in m.groups and m.label in ov]
        if not rows:
            continue
        for T, per in table.items():
            o = per["overall"]
            L += [f"## {title.format(T=T)}", "", "| method | n | schedule | α | S0 = nα | c | S | cycle (ms, proj.) | wall (proj.) |",
                  "|---|---|---|---|---|---|---|---|---|"]
            for m in rows:
                r = o[m.label]
                L.append(f"| {m.label} | {m.n} | {m.schedule} | {_f(r.get('acceptance'), 3)} | {_f(r.get('S0'))} | "
                         f"{_f(r.get('c'), 3)} | {_f(r.get('S'))} | {_f(r.get('cycle_ms'), 1)} | {_f(r.get('wall'))} |")
            L.append("")
    L += ["## Cycle-time breakdown vs n (measured components; cycle projected)", "",
          f"AR decode: {costs['ar_token_ms']:.1f} ms/token ({1e3 / costs['ar_token_ms']:.1f} tok/s). Stage = one-token forward of "
          "the slowest stage of a uniform split (the last: its layers + final norm + LM head); overhead = runtime cost per "
          "cycle with zero-compute stages (interpolated from `spd bench runtime_overhead`).", "",
          "| n | stages (ms) | slowest | SPD draft (ms) | overhead (ms) | pre-step cycle | post-step cycle | ideal AR/n |",
          "|---|---|---|---|---|---|---|---|"]
    for n, st in costs["stage_ms"].items():
        d = _sweep_draft_ms(methods, costs, n)
        o = costs["overhead_ms"].get(n) or 0.0
        ar = costs["ar_token_ms"]
        pre = projected_cycle_ms(max(st), d, o, "pre", ar, int(n)) if d is not None else None
        post = projected_cycle_ms(max(st), d, o, "post", ar, int(n)) if d is not None else None
        L.append(f"| {n} | {' / '.join(f'{x:.1f}' for x in st)} | {max(st):.1f} | {_f(d, 1)} | {o:.2f} | {_f(pre, 1)} | "
                 f"{_f(post, 1)} | {costs['ar_token_ms'] / int(n):.1f} |")
    L.append("")
    if check:
        L += ["## Sampled-acceptance estimate vs live engine", "",
              f"{check['method']}, T = {check['temperature']}, top-k {check['top_k']}, {check['prompts']} {check['set']} prompts × "
              f"{check['seeds']} seeds, ≤ {check['max_tokens']} tokens.", "",
              "| | N | K | α |", "|---|---|---|---|",
              f"| live engine (rejection sampling) | {check['live']['N']} | {check['live']['K']} | {check['live']['alpha']:.3f} |",
              f"| Σ min(p, q) estimate | {check['estimate']['N']} | {check['estimate']['K']:.1f} | {check['estimate']['alpha']:.3f} |", ""]
    if missing:  # one line, not a path per variant: on a fresh clone none of the runs/ exist
        where = sorted({str(Path(m.draft).parent) for m in missing})
        L += ["## Not evaluated", "", f"{len(missing)} variants have no checkpoint here ({', '.join(m.label for m in missing)}; "
              f"looked in {', '.join(f'`{w}`' for w in where)}): train them with `benchmarks/train_main.sh` / "
              "`benchmarks/train_sweep.sh` / `benchmarks/train_twin.sh` (the lineage's own: `benchmarks/lineage_draft.sh`).", ""]
    L += ["## Plots", ""] + [f"![{p}]({p})" for p in plots] + [""]
    if "width_sweep.png" not in plots:
        L += ["(No width-sweep plot: fewer than two widths of a sweep were evaluated here.)", ""]
    return "\n".join(L)


def _sweep_draft_ms(methods: list[Method], costs: dict, n: str) -> float | None:
    """Draft time of a pre-step SPD PDM at width n that was timed (the sweep's, else any, e.g. the shipped one)."""
    timed = [m for m in methods if m.kind == "spd" and str(m.n) == n and m.schedule == "pre" and m.label in costs["draft_ms"]]
    timed.sort(key=lambda m: m.draft == "shipped")  # prefer the sweep's own PDM
    return costs["draft_ms"][timed[0].label] if timed else None


def _save(fig, out: Path, name: str) -> str:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(out / name, dpi=110)
    plt.close(fig)
    return name


def plots(methods: list[Method], table: dict, costs: dict, out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    # 1. main comparison, overall, per temperature
    fig, axes = plt.subplots(1, len(table), figsize=(6 * len(table), 4.5), squeeze=False)
    for ax, (T, per) in zip(axes[0], table.items()):
        o = per["overall"]
        labels = ["AR"] + [m.label for m in methods if "main" in m.groups and m.label in o]
        x = range(len(labels))
        for i, (key, name) in enumerate((("S0", "S0 oracle"), ("S", "S draft-adjusted"), ("wall", "wall (EAGLE meas., SPD proj.)"))):
            ax.bar([v + (i - 1) * 0.27 for v in x], [o[lb].get(key) or 0 for lb in labels], 0.27, label=name)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks(list(x), labels, rotation=35, ha="right", fontsize=7)
        ax.set_title(f"speedup over AR, T = {T}")
        ax.legend(fontsize=7)
    names.append(_save(fig, out, "speedup_main.png"))
    # 2. width sweep
    T0 = next(iter(table))
    o = table[T0]["overall"]
    sweep = {kind: sorted((m for m in methods if m.kind == kind and "n" in m.groups and m.label in o), key=lambda m: m.n)
             for kind in ("spd", "ppsd")}
    if any(len(rows) > 1 for rows in sweep.values()):  # a sweep needs two widths; else the report says so
        fig, ax = plt.subplots(figsize=(6, 4))
        for (kind, rows), marker in zip(sweep.items(), ("o", "s")):
            if rows:
                ax.plot([m.n for m in rows], [o[m.label].get("S0") or 0 for m in rows], marker=marker, label=f"{kind.upper()} S0")
                ax.plot([m.n for m in rows], [o[m.label].get("wall") or 0 for m in rows], marker=marker, ls="--",
                        label=f"{kind.upper()} wall (projected)")
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xlabel("pipeline width n")
        ax.set_ylabel("speedup over AR")
        ax.set_title(f"width sweep, T = {T0}, all sets")
        ax.legend(fontsize=8)
        names.append(_save(fig, out, "width_sweep.png"))
    # 3. cycle breakdown
    ns = list(costs["stage_ms"])
    stage = [max(costs["stage_ms"][n]) for n in ns]
    draft = [_sweep_draft_ms(methods, costs, n) or 0 for n in ns]
    over = [costs["overhead_ms"].get(n) or 0 for n in ns]
    fig, ax = plt.subplots(figsize=(6, 4))
    x = range(len(ns))
    ax.bar([v - 0.2 for v in x], stage, 0.4, label="slowest stage")
    ax.bar([v - 0.2 for v in x], over, 0.4, bottom=stage, label="runtime overhead")
    ax.bar([v + 0.2 for v in x], draft, 0.4, label="PDM draft (hidden by pre-step if < stage)")
    ax.plot(list(x), [costs["ar_token_ms"] / int(n) for n in ns], "k.--", label="AR token / n")
    ax.set_xticks(list(x), [f"n={n}" for n in ns])
    ax.set_ylabel("ms")
    ax.set_title("cycle-time breakdown (measured components)")
    ax.legend(fontsize=7)
    names.append(_save(fig, out, "cycle_breakdown.png"))
    return names


def write(out: Path, cfg: dict, methods: list[Method], missing: list[Method], check: dict | None,
          notes: str | None = None) -> Path:
    from spd.eval.prompts import OPTIONAL_SETS, SETS

    accept = {s: json.loads((out / f"accept_{s}.json").read_text()) for s in SETS + OPTIONAL_SETS
              if (out / f"accept_{s}.json").exists()}
    costs = json.loads((out / "costs.json").read_text())
    table = compute(methods, accept, costs)
    (out / "metrics.json").write_text(json.dumps(table, indent=1))
    names = plots(methods, table, costs, out)
    md = markdown(cfg, methods, missing, table, costs, check, names, notes)
    (out / "report.md").write_text(md)
    return out / "report.md"

"""The decoding methods an evaluation compares, and where their checkpoints live.

Two matched training budgets, both on the same data (the target's own responses to ShareGPT
prompts, same order, lr 1.5e-3 decayed, V_s = 16384):
  main   240k assistant tokens: SPD n = 5, PPSD n = 5, EAGLE-3 (benchmarks/train_main.sh, runs/main/);
         PPSD n = 5 and EAGLE-3 are shipped (spd/assets/baselines/<model>/), so the main table runs
         without training; the shipped SPD PDM (its own budget, in its label) is an extra row.
  sweep  48k tokens: every width / depth / schedule variant (benchmarks/train_sweep.sh, runs/sweep/).
and, for every runs/equal-<TOKENS>/ trained here (benchmarks/train_equal_budget.sh), SPD n = 5 at
L_s = 1 and 2, PPSD n = 5 and EAGLE-3 k = 7 at that budget, from one teacher pass over one stream;
and, for every budget of the shipped PDM's lineage with a twin (benchmarks/train_twin.sh: the same
self-generated ids, order and schedule, online teacher), the lineage's draft at that budget
(benchmarks/lineage_draft.sh), PPSD n = 5 and EAGLE-3 k = 3 / 7 / 15: the main comparison's larger budgets.
A method whose checkpoint is missing is skipped and listed as such in the report.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

SWEEP, MAIN, RUNS = Path("runs/sweep"), Path("runs/main"), Path("runs")
RESULTS = Path("benchmarks/results")  # where a twin's draft is committed when it is (<method>-<TOKENS>/)
TWINS = {"spd": "pdm", "ppsd": "pdm", "eagle3": "draft"}  # run directory prefix -> its export's subdirectory
BASELINES = Path(__file__).resolve().parents[1] / "assets" / "baselines"  # shipped baseline drafts, per model


@dataclass(frozen=True)
class Method:
    label: str  # row label in the report
    kind: str  # spd | ppsd | eagle3
    draft: str  # checkpoint directory ("shipped" = the packaged PDM)
    n: int = 1  # pipeline width (spd, ppsd)
    schedule: str = "pre"  # staircase schedule (spd pre | post; ppsd is post)
    k: int = 0  # chain length (eagle3)
    groups: tuple[str, ...] = ("main",)  # report tables it appears in: main, n, ls, schedule
    budget: int = 0  # tokens its draft must have seen in all to count (a twin's budget; 0: any)


def _main(name: str, sub: str, model: str) -> str:
    """runs/main/<name>/<sub> when trained here, else the shipped copy (if any)."""
    local = MAIN / name / sub
    return str(local if (local / "config.json").exists() else BASELINES / model / name)


def shipped_tokens(model: str = "SmolLM2-135M-Instruct") -> int:
    """The tokens the shipped PDM has seen in all (its config.json; 0 if none is shipped)."""
    from spd.pipeline import SHIPPED_DRAFTS

    draft = SHIPPED_DRAFTS / model
    return draft_tokens(draft) if (draft / "config.json").exists() else 0


def draft_tokens(draft: Path) -> int:
    """The tokens an exported draft (a PDM or an EAGLE-3 draft) has seen in all, warm starts included."""
    from spd.eagle.model import EagleConfig
    from spd.eagle.train import tokens_in_all as eagle_tokens_in_all
    from spd.train.trainer import tokens_in_all

    raw = json.loads((draft / "config.json").read_text())
    if raw.get("kind") == "eagle3":
        return eagle_tokens_in_all(EagleConfig.from_saved(raw))
    return tokens_in_all(raw.get("notes") or {})


def complete(draft: Path, budget: int) -> bool:
    """An exported draft is there and has seen `budget` tokens in all (any count when budget is 0)."""
    return (draft / "config.json").exists() and (not budget or draft_tokens(draft) >= budget)


def shipped_label(model: str = "SmolLM2-135M-Instruct") -> str:
    """The shipped PDM's row label, with the tokens it was trained on."""
    return f"SPD n=5 L_s=1 shipped ({_budget(shipped_tokens(model))} tok)"


def default_methods(model: str = "SmolLM2-135M-Instruct") -> list[Method]:
    m = [Method(shipped_label(model), "spd", "shipped", 5, "pre")]
    m.append(Method("SPD n=5 (240k)", "spd", str(MAIN / "spd-n5-pre-ls1" / "pdm"), 5, "pre"))
    m.append(Method("PPSD n=5 (240k)", "ppsd", _main("ppsd-n5", "pdm", model), 5, "post"))
    for k in (3, 7, 15):
        m.append(Method(f"EAGLE-3 k={k} (240k)", "eagle3", _main("eagle3", "draft", model), k=k))
    sweep = lambda name: str(SWEEP / name / "pdm")  # noqa: E731
    m.append(Method("SPD n=5 L_s=1 (48k)", "spd", sweep("spd-n5-pre-ls1"), 5, "pre", groups=("n", "ls", "schedule")))
    m.append(Method("SPD n=5 L_s=2 (48k)", "spd", sweep("spd-n5-pre-ls2"), 5, "pre", groups=("ls",)))
    m.append(Method("SPD n=5 post-step (48k)", "spd", sweep("spd-n5-post-ls1"), 5, "post", groups=("schedule",)))
    for n in (2, 3, 6, 10):
        m.append(Method(f"SPD n={n} (48k)", "spd", sweep(f"spd-n{n}-pre-ls1"), n, "pre", groups=("n",)))
    for n in (2, 3, 5, 6):
        m.append(Method(f"PPSD n={n} (48k)", "ppsd", sweep(f"ppsd-n{n}"), n, "post", groups=("n",)))
    return m + equal_budget_methods() + twin_methods(shipped=shipped_tokens(model))


def _budget(tokens: int) -> str:
    return f"{tokens / 1e6:.1f}M" if tokens >= 1e6 else f"{tokens / 1e3:.0f}k"


def equal_budget_methods(runs: Path = RUNS) -> list[Method]:
    """The rows of every runs/equal-<TOKENS>/ here, smallest budget first."""
    out = []
    budgets = sorted((int(t), d) for d in runs.glob("equal-*") if (t := d.name.removeprefix("equal-")).isdigit())
    for tokens, d in budgets:
        b = _budget(tokens)
        out += [Method(f"SPD n=5 L_s=1 ({b}, equal)", "spd", str(d / "spd-n5-ls1" / "pdm"), 5, "pre"),
                Method(f"SPD n=5 L_s=2 ({b}, equal)", "spd", str(d / "spd-n5-ls2" / "pdm"), 5, "pre"),
                Method(f"PPSD n=5 ({b}, equal)", "ppsd", str(d / "ppsd-n5" / "pdm"), 5, "post"),
                Method(f"EAGLE-3 k=7 ({b}, equal)", "eagle3", str(d / "eagle3" / "draft"), k=7)]
    return out


def twin_methods(runs: Path = RUNS, results: Path = RESULTS, shipped: int = 0) -> list[Method]:
    """The lineage's draft and its twins at every budget with a twin here, smallest budget first. A
    draft is read from runs/<method>-<TOKENS>/ (trained or extracted here), else from its committed
    copy in benchmarks/results/<method>-<TOKENS>/; at the shipped PDM's own budget, its row stands
    for the lineage's. A draft still in training (fewer tokens than its budget) counts as missing."""
    budgets: set[int] = set()
    for d in [*runs.glob("*-*"), *results.glob("*-*")]:
        kind, _, count = d.name.partition("-")
        if kind in ("ppsd", "eagle3") and count.isdigit():
            budgets.add(int(count))

    def draft(kind: str, tokens: int) -> str:
        local = runs / f"{kind}-{tokens}" / TWINS[kind]
        committed = results / f"{kind}-{tokens}" / TWINS[kind]
        return str(committed if not complete(local, tokens) and complete(committed, tokens) else local)

    out = []
    for tokens in sorted(budgets):
        b = _budget(tokens)
        if tokens != shipped:
            out.append(Method(f"SPD n=5 L_s=1 ({b}, lineage)", "spd", draft("spd", tokens), 5, "pre", budget=tokens))
        out.append(Method(f"PPSD n=5 ({b}, twin)", "ppsd", draft("ppsd", tokens), 5, "post", budget=tokens))
        out += [Method(f"EAGLE-3 k={k} ({b}, twin)", "eagle3", draft("eagle3", tokens), k=k, budget=tokens)
                for k in (3, 7, 15)]
    return out


def available(methods: list[Method]) -> tuple[list[Method], list[Method]]:
    """(present, missing) by checkpoint: a draft still short of its budget is missing."""
    ok = [m for m in methods if m.draft == "shipped" or complete(Path(m.draft), m.budget)]
    return ok, [m for m in methods if m not in ok]

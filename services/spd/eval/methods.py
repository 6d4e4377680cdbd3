"""The decoding methods an evaluation compares, and where their checkpoints live.

Budget-matched checkpoints come from `benchmarks/train_sweep.sh` (runs/sweep/<name>/pdm) and the
EAGLE-3 trainer (runs/sweep/eagle3/draft); the shipped ones from the package. A method whose
checkpoint is missing is skipped and listed as such in the report.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

SWEEP = Path("runs/sweep")


@dataclass(frozen=True)
class Method:
    label: str  # row label in the report
    kind: str  # spd | ppsd | eagle3
    draft: str  # checkpoint directory ("shipped" = the packaged PDM / EAGLE draft)
    n: int = 1  # pipeline width (spd, ppsd)
    schedule: str = "pre"  # staircase schedule (spd pre | post; ppsd is post)
    k: int = 0  # chain length (eagle3)
    groups: tuple[str, ...] = ("main",)  # report tables it appears in: main, n, ls, schedule


def _spd(name, n, groups, schedule="pre", label=None):
    return Method(label or f"SPD n={n}", "spd", str(SWEEP / name / "pdm"), n, schedule, groups=groups)


def default_methods() -> list[Method]:
    m = [Method("SPD n=5 L_s=1 shipped (600k tok)", "spd", "shipped", 5, "pre", groups=("main",))]
    m.append(_spd("spd-n5-pre-ls1", 5, ("main", "n", "ls", "schedule"), label="SPD n=5 L_s=1"))
    m.append(_spd("spd-n5-pre-ls2", 5, ("ls",), label="SPD n=5 L_s=2"))
    m.append(_spd("spd-n5-post-ls1", 5, ("schedule",), schedule="post", label="SPD n=5 L_s=1 post-step"))
    for n in (2, 3, 6, 10):
        m.append(_spd(f"spd-n{n}-pre-ls1", n, ("n",)))
    for n in (2, 3, 5, 6):
        m.append(Method(f"PPSD n={n}", "ppsd", str(SWEEP / f"ppsd-n{n}" / "pdm"), n, "post", groups=("main", "n")))
    for k in (3, 7, 15):
        m.append(Method(f"EAGLE-3 k={k}", "eagle3", str(SWEEP / "eagle3" / "draft"), k=k, groups=("main",)))
    return m


def available(methods: list[Method]) -> tuple[list[Method], list[Method]]:
    """(present, missing) by checkpoint."""
    ok = [m for m in methods if m.draft == "shipped" or (Path(m.draft) / "config.json").exists()]
    return ok, [m for m in methods if m not in ok]

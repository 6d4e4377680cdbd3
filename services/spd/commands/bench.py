"""`spd bench NAME [ARGS...]`: run a benchmark script from the checkout's benchmarks/ folder.

Benchmarks measure (speed, acceptance, recovery) and write JSON; they are not tests.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"


def add_parser(sub) -> None:
    names = sorted(p.stem for p in BENCHMARKS.glob("*.py")) if BENCHMARKS.exists() else []
    p = sub.add_parser("bench", help=f"run a benchmark ({', '.join(names) or 'none found'})")
    p.add_argument("name", help="benchmark script name, e.g. chaos, runtime_overhead, ar_speed")
    p.add_argument("args", nargs="...", help="arguments passed to the script")
    p.set_defaults(run=run)


def run(args) -> int:
    script = BENCHMARKS / f"{args.name}.py"
    if not script.exists():
        raise SystemExit(f"no benchmark {args.name!r} in {BENCHMARKS}")
    sys.argv = [str(script), *args.args]
    sys.path.insert(0, str(BENCHMARKS))  # as `python benchmarks/NAME.py` would: its helpers import
    runpy.run_path(str(script), run_name="__main__")
    return 0

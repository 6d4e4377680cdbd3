"""`spd eval`: acceptance and speedup of SPD, PPSD and EAGLE-3 on MT-Bench, GSM8K and HumanEval.

Phases (default: all, in this order), each writing under --out:
  costs   component times on this machine            -> costs.json
  accept  per-set acceptance, EAGLE-3 live runs       -> accept_<set>.json (sets can run in parallel)
  check   sampled estimate vs live SPD engine         -> check.json
  report  metrics, markdown and plots                 -> metrics.json, report.md, *.png
`--quick` = 1 prompt per set, 16 tokens, few repetitions: minutes, for a smoke check.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import sys
from pathlib import Path

PHASES = ("costs", "accept", "check", "report")


def add_parser(sub) -> None:
    p = sub.add_parser("eval", help="evaluate SPD vs PPSD vs EAGLE-3 on MT-Bench / GSM8K / HumanEval")
    p.add_argument("--quick", action="store_true", help="1 prompt per set, 16 tokens: a few minutes")
    p.add_argument("--phase", default="all", help=f"comma-separated subset of {PHASES} (default all)")
    p.add_argument("--sets", default="mtbench,gsm8k,humaneval",
                   help="prompt sets; add mtbench2 for MT-Bench second turns (after the target's own first answer)")
    p.add_argument("--prompts", type=int, default=8, help="first K prompts of each set (0 = the whole set)")
    p.add_argument("--max-tokens", type=int, default=512, help="generation cap per prompt")
    p.add_argument("--temperatures", default="0,1", help="comma-separated; T > 0 uses --top-k/--top-p")
    p.add_argument("--top-k", type=int, default=50, help="top-k of the sampled runs (default 50)")
    p.add_argument("--top-p", type=float, default=1.0, help="top-p of the sampled runs (default 1.0)")
    p.add_argument("--sims", type=int, default=200, help="simulated verdict chains per prompt (sampled estimate)")
    p.add_argument("--methods", help="comma-separated labels to keep (default: every method with a checkpoint)")
    p.add_argument("--threads", type=int, default=1, help="CPU threads for torch (default 1)")
    p.add_argument("--overhead", default="benchmarks/results/runtime_overhead.json",
                   help="runtime overhead per cycle (benchmarks/runtime_overhead.py output), interpolated in n")
    p.add_argument("--model", help="target model directory (default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--out", default="benchmarks/results/eval", help="report directory (default benchmarks/results/eval)")
    p.add_argument("--reproduce", help="the command to print as the report's reproduction (default: this one)")
    p.add_argument("--notes", help="a markdown file included in the report as 'Reading the results'")
    p.add_argument("--no-progress", action="store_true", help="no progress bars (logs only)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from spd.eval import report
    from spd.eval.harness import EvalConfig, Harness, check_sampled
    from spd.eval.methods import available, default_methods

    if args.quick:
        args.prompts, args.max_tokens, args.sims = 1, 16, 50
    phases = PHASES if args.phase == "all" else tuple(args.phase.split(","))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    methods, missing = available(default_methods())
    if args.methods:
        keep = set(args.methods.split(","))
        methods = [m for m in methods if m.label in keep]
    cfg = EvalConfig(sets=tuple(args.sets.split(",")), prompts=args.prompts, max_tokens=args.max_tokens,
                     temperatures=tuple(float(t) for t in args.temperatures.split(",")), top_k=args.top_k,
                     top_p=args.top_p, sims=args.sims, threads=args.threads, model=args.model,
                     progress=not args.no_progress)
    h = Harness(cfg, methods)
    if "costs" in phases:
        ns = (2, 5) if args.quick else (2, 3, 5, 6, 10)
        (out / "costs.json").write_text(json.dumps(h.costs(ns, reps=5 if args.quick else 15, overhead=Path(args.overhead)), indent=1))
    if "accept" in phases:
        for name in cfg.sets:
            (out / f"accept_{name}.json").write_text(json.dumps(h.run_set(name), indent=1))
    if "check" in phases:
        spd = next((m for m in methods if m.kind == "spd" and m.draft == "shipped"), None) or \
            next((m for m in methods if m.kind == "spd"), None)
        if spd is not None:
            q: dict[str, int] = dict(prompts=1, seeds=2, max_tokens=args.max_tokens) if args.quick else {}
            (out / "check.json").write_text(json.dumps(check_sampled(h, spd, "mtbench", **q), indent=1))
    if "report" in phases:
        check = json.loads((out / "check.json").read_text()) if (out / "check.json").exists() else None
        argv = sys.argv[sys.argv.index("eval") + 1:] if "eval" in sys.argv else []
        command = args.reproduce or " ".join(["spd eval"] + [shlex.quote(a) for a in argv])
        meta = {"model": h.model_dir.name, "command": command, "prompts": cfg.prompts, "max_tokens": cfg.max_tokens,
                "top_k": cfg.top_k, "top_p": cfg.top_p, "threads": cfg.threads,
                "date": datetime.date.today().isoformat()}
        notes = Path(args.notes).read_text() if args.notes else None
        path = report.write(out, meta, methods, missing, check, notes)
        print(path.read_text())
    return 0

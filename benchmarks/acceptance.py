"""Benchmark (not a test): greedy acceptance of PDMs and EAGLE-3 drafts on held-out evaluation prompts, per set.

Exact verdicts by the offline replays (spd.eval.acceptance; they match the live engines' counts,
see tests/test_fast_acceptance.py): for a PDM N, K, α = N/K and S0 = n·α; for an EAGLE-3 draft the
oracle τ = decode tokens per draft–verify round at chain length k. MT-Bench first turns, GSM8K and
HumanEval (none of them used in training). The target's greedy run (and its anchor states) is
computed once per prompt and replayed for every draft, so drafts are compared on the same text.

    python benchmarks/acceptance.py [--draft [LABEL=]DIR ...] [--eagle [LABEL=]DIR ...] [--k 7] [--n 5]
        [--prompts 10] [--skip 0] [--max-tokens 128] [--out ...]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from tqdm import tqdm

from spd.core.drafter import DrafterState
from spd.core.pdm import PDM
from spd.core.stopping import StopRule, eos_ids_of
from spd.core.target import context_limit, max_new_tokens
from spd.eagle.drafter import EagleDrafter
from spd.eagle.engine import ensure_anchors
from spd.eagle.model import EagleDraft
from spd.eval.acceptance import ar_with_anchors, eagle_replay, replay
from spd.eval.prompts import SETS, load
from spd.pipeline import PipelineConfig, build_local, resolve_draft
from spd.text import encode_prompt
from results_io import save  # noqa: E402  (benchmarks/ is on sys.path: run as a script or by `spd bench`)


def _drafts(specs: list[str]) -> list[tuple[str, str | None]]:
    """[LABEL=]DIR -> (label, dir); 'shipped': the shipped PDM."""
    out = []
    for spec in specs:
        label, _, path = spec.rpartition("=")
        out.append((label or path, None if path == "shipped" else path))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--draft", action="append", default=[],
                    help="[LABEL=]PDM directory, repeatable ('shipped': the shipped one, the default)")
    ap.add_argument("--eagle", action="append", default=[], help="[LABEL=]EAGLE-3 draft directory, repeatable")
    ap.add_argument("--k", type=int, default=7, help="EAGLE-3 chain length (default 7)")
    ap.add_argument("--n", type=int, default=5)
    ap.add_argument("--schedule", choices=["pre", "post"],
                    help="replay every PDM at this schedule (default: each its own, from its config.json: PPSD post)")
    ap.add_argument("--prompts", type=int, default=10, help="K prompts of each set, after the skipped ones")
    ap.add_argument("--skip", type=int, default=0, help="skip each set's first S prompts (a sample beside the first K)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--sets", default=",".join(SETS))
    ap.add_argument("--out", default="benchmarks/results/acceptance.json")
    args = ap.parse_args()
    drafts = _drafts(args.draft or ["shipped"])
    local = build_local(PipelineConfig(n=args.n, draft=drafts[0][1]))
    drafters = {drafts[0][0]: local.drafter()}
    for label, path in drafts[1:]:
        pdm = PDM.load(resolve_draft(path, local.model_dir))
        ensure_anchors(local.stages, list(pdm.config.anchors))  # the target runs once for all: every draft's anchors
        drafters[label] = DrafterState(pdm, local.stages[0].embed, local.split)
    schedules = {label: args.schedule or d.pdm.config.schedule for label, d in drafters.items()}
    eagle_specs = _drafts(args.eagle)
    eagles = {}
    for label, path in eagle_specs:
        draft = EagleDraft.load(Path(path), embed_weight=local.stages[0].embed.weight)
        ensure_anchors(local.stages, list(draft.config.feature_layers))
        eagles[label] = (EagleDrafter(draft), list(draft.config.feature_layers))
    stop = StopRule(args.max_tokens, eos_ids_of(local.tokenizer, local.config))
    rows: dict[str, dict] = {label: {} for label in [*drafters, *eagles]}
    for name in args.sets.split(","):
        counts = {label: [0, 0, 0, 0] for label in drafters}  # N, K, accepts, rejects
        ecounts = {label: [0, 0, 0] for label in eagles}  # decode tokens, rounds, accepts
        t0 = time.perf_counter()
        chosen = load(name, args.skip + args.prompts)[args.skip:]  # fewer than K where the set ends first
        for messages in tqdm(chosen, desc=name):
            prompt = encode_prompt(local.tokenizer, messages=messages)
            generated, anchors = ar_with_anchors(local.stages, prompt, stop)
            for label, drafter in drafters.items():
                r = replay(drafter, prompt, generated, anchors, schedules[label])
                c = counts[label]
                c[:] = c[0] + r.generated_tokens, c[1] + r.cycles, c[2] + r.accepts, c[3] + r.rejects
            for label, (eagle, layers) in eagles.items():
                e = eagle_replay(eagle, layers, prompt, generated, anchors, args.k,
                                 max_new_tokens(len(prompt), stop, local.stages), context_limit(local.stages))
                c = ecounts[label]
                c[:] = c[0] + e.generated_tokens - 1, c[1] + e.cycles, c[2] + e.accepts
        for label, (N, K, acc, rej) in counts.items():
            rows[label][name] = {"prompts": len(chosen), "schedule": schedules[label], "N": N, "K": K, "alpha": N / K, "S0": args.n * N / K,
                                 "judgement_accept_rate": acc / max(acc + rej, 1), "seconds": time.perf_counter() - t0}
        for label, (D, R, acc) in ecounts.items():
            rows[label][name] = {"prompts": len(chosen), "k": args.k, "decode_tokens": D, "rounds": R, "accepts": acc,
                                 "tau": D / R}
    schedule = args.schedule or ("mixed" if len(set(schedules.values())) > 1 else next(iter(schedules.values())))
    result = {"n": args.n, "schedule": schedule, "max_tokens": args.max_tokens, "skip": args.skip,
              "drafts": {label: {"dir": path or "shipped", "sets": rows[label]} for label, path in drafts},
              "eagle": {label: {"dir": path, "k": args.k, "sets": rows[label]} for label, path in eagle_specs}}
    steps = "each PDM at its own schedule" if schedule == "mixed" else f"{schedule}-step"
    lines = [f"n = {args.n}, {steps}, greedy, prompts {args.skip + 1}-{args.skip + args.prompts} of each set, "
             f"<= {args.max_tokens} tokens, "
             "exact replay (the target's text computed once, every draft replayed on it)",
             "", "| draft | schedule | set | N | K | alpha | S0 = n*alpha | p(accept) |", "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {label} | {r['schedule']} | {name} | {r['N']} | {r['K']} | {r['alpha']:.3f} | {r['S0']:.2f} | {r['judgement_accept_rate']:.3f} |"
              for label, sets in rows.items() if label in drafters for name, r in sets.items()]
    if eagles:
        lines += ["", f"EAGLE-3, chain length k = {args.k}, oracle τ = decode tokens per draft–verify round (same text):", "",
                  "| draft | set | decode tokens | rounds | accepted drafts | τ |", "|---|---|---|---|---|---|"]
        lines += [f"| {label} | {name} | {r['decode_tokens']} | {r['rounds']} | {r['accepts']} | {r['tau']:.2f} |"
                  for label, sets in rows.items() if label in eagles for name, r in sets.items()]
    save(args.out, result, "\n".join(lines))


if __name__ == "__main__":
    main()

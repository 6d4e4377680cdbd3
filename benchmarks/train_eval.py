"""Held-out top-1 agreement p and KL of a trained PDM at every fill level a = 1..n (aligned forward).

  python benchmarks/train_eval.py --draft services/spd/assets/drafts/SmolLM2-135M-Instruct [--seqs 48]

p(a) predicts acceptance: at a = n (saturated pipeline) and a = 1 (the first draft after a reseed,
which is the one judged next when the previous draft was rejected). With a per-judgement acceptance
p, α = 1 / (p + (1 - p) n) and S0 = n·α (design §4); with p(a) per fill level, the engine judges
fill a in the share w_a of schedule.judged_fills and α = schedule.alpha_from_fills(p) (the last line's
"alpha_judged": what held-out ShareGPT text would give, not the evaluation sets).

For an averaged export (spd.train.average), `--extend-history RUN_HISTORY OUT` writes OUT = the
lines of the run it came from, then one line with the figures measured here (average.history_line).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from spd.core.pdm import PDM
from spd.core.schedule import alpha_from_fills, judged_fills, staircase_offset
from spd.core.split import uniform_split
from spd.models.loading import load_config, resolve_model
from spd.train.average import history_line
from spd.train.loop import held_sequences, resolve_cache
from spd.train.trainer import evaluate, target_to_draft


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--heldout", default="data/selfgen/SmolLM2-135M-Instruct/heldout",
                    help="held-out cache or self-generated ids (default: the committed held-out ids)")
    ap.add_argument("--seqs", type=int, default=48)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--extend-history", nargs=2, type=Path, metavar=("RUN_HISTORY", "OUT"),
                    help="an averaged draft: write OUT = RUN_HISTORY's lines + this measurement's line")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    model_dir = resolve_model(args.model)
    config = load_config(model_dir)
    pdm = PDM.load(args.draft)
    n = pdm.config.trained_n or 5
    s0 = staircase_offset(pdm.config.schedule)
    split = uniform_split(config.num_hidden_layers, n)
    cache = resolve_cache(model_dir, args.heldout)
    seqs = held_sequences(cache, args.seqs)
    cols = [cache.layers.index(b) for b in pdm.config.anchors]
    t2d = target_to_draft(pdm.d2t, config.vocab_size)
    out = {"draft": args.draft, "n": n, "schedule": pdm.config.schedule, "tokens_seen": pdm.config.notes.get("tokens_seen")}
    for a in range(1, n + 1):
        r = evaluate(pdm, seqs, split, s0, t2d, cols, fill=a)
        p = r["p"]
        out[f"a{a}"] = {"p": round(p, 4), "kl": round(r["loss"], 4), "tokens": r["tokens"],
                        "alpha_if_all_judgements_at_this_p": round(alpha_from_fills([p] * n), 4)}
        print(json.dumps({"fill": a, **out[f"a{a}"]}), flush=True)
    ps = [out[f"a{a}"]["p"] for a in range(1, n + 1)]
    out["judged_share"] = [round(w, 4) for w in judged_fills(ps)]
    out["alpha_judged"] = round(alpha_from_fills(ps), 4)
    out["s0_judged"] = round(n * out["alpha_judged"], 3)
    print(json.dumps(out))
    if args.extend_history:
        src, dest = args.extend_history
        lines = src.read_text().splitlines()
        dest.write_text("\n".join(lines + [json.dumps(history_line(json.loads(lines[-1]), out, pdm.config.notes))]) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Ship a trained PDM run into services/spd/assets/drafts/<model>/ with its MODEL_CARD.md.

  python benchmarks/train_ship.py --run runs/long/spd-n5-ls1 [--fills FILLS.json] \
      [--acceptance benchmarks/results/acceptance.json --label LABEL] \
      [--curve benchmarks/results/learning_curve.json] [--extra benchmarks/results/pdm_card_notes.md]

Copies RUN/pdm/{pdm.safetensors,config.json} and writes the model card from records only: the
export's provenance (config.json notes: data, vocabulary, lr, tokens), the run's history.jsonl,
held-out p at every fill level (benchmarks/train_eval.py's JSON), the evaluation-set acceptance
(benchmarks/acceptance.py's JSON, draft LABEL), the learning-curve projection
(benchmarks/learning_curve.py's JSON) and, last, a hand-written notes file.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from spd.pipeline import SHIPPED_DRAFTS
from spd.train.selfgen import rounds_of
from spd.train.trainer import tokens_in_all


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def _load(path: str | None) -> dict | None:
    """A JSON file, or the last line of a JSON-lines log (train_eval.py prints its summary last)."""
    if not path:
        return None
    text = Path(path).read_text()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return json.loads(text.strip().splitlines()[-1])


def _data_lines(data: dict) -> list[str]:
    if "jobs" in data:  # self-generated ids (spd.train.selfgen), features computed online
        return [
            f"- **Self-generated**: the target's own answers (at most {data['max_new']} new tokens) to every user "
            f"turn of the ShareGPT train split ({data['jobs']:,} jobs; earlier turns as context, oldest dropped to fit "
            f"{data['max_prompt']} prompt tokens), greedy, plus a sampled answer at T = {data['sample_temp']} for "
            f"{data['sample_frac']:.0%} of them{_more_rounds(data)}. Loss only on the response tokens.",
            f"- stored as token ids in `{data['cache']}` (committed, 2 bytes a token); the teacher's features (anchor states and top-32) are recomputed by a batched "
            "prefill inside the training loop (`spd.train.online`). Generation and prefill run in bf16 where the "
            "hardware multiplies bf16 natively, fp32 elsewhere (`spd.train.precision`; each part records its own).",
        ]
    return [f"- teacher cache `{data.get('cache', '?')}` ({data.get('source', '?')})"]


def _more_rounds(data: dict) -> str:
    """', and R more sampled answers to every prompt' where the ids have further job rounds."""
    more = rounds_of(data) - 1
    return f", and {more} more sampled answer{'s' * (more > 1)} to every prompt" if more else ""


def _fill_lines(fills: dict) -> list[str]:
    n = fills["n"]
    heads = " | ".join(f"a={a}" for a in range(1, n + 1))
    return [f"## Held-out agreement by fill level ({fills['a1']['tokens']:,} held-out positions)", "",
            "p(a) is the top-1 agreement with the target when a of the n in-flight positions have their anchors "
            "(a = n: the saturated pipeline; a = 1: the first draft after a reseed).", "",
            f"| | {heads} |", "|---|" + "---|" * n,
            "| p | " + " | ".join(f"{fills[f'a{a}']['p']:.3f}" for a in range(1, n + 1)) + " |",
            "| KL | " + " | ".join(f"{fills[f'a{a}']['kl']:.3f}" for a in range(1, n + 1)) + " |", ""]


def _warm_start(notes: dict) -> str:
    """', after a warm start from a draft that had seen N (M in all)', or nothing."""
    base = notes.get("init_from", {}).get("tokens_seen")
    return f", after a warm start from a draft that had seen {base:,} ({tokens_in_all(notes):,} in all)" if base else ""


def _averaged_lines(notes: dict) -> list[str]:
    """The ingredients of an averaged export (spd.train.average), or nothing."""
    parts = [f"{a['weight']:g} × the draft then at `{a['path']}` ({a['tokens_in_all']:,} tokens in all)" for a in notes.get("averaged", [])]
    return [f"- weights: the average {' + '.join(parts)} (`python -m spd.train.average`)"] if parts else []


def _heldout_line(notes: dict, fills: dict | None) -> str:
    """Held-out p and KL at a = n: from the fills where measured (an average has no run of its own)."""
    last = fills and fills.get(f"a{fills['n']}")
    p, kl = (last["p"], last["kl"]) if last else (notes.get("heldout_p"), notes.get("heldout_loss"))
    return f"- held-out top-1 agreement at a = n: p = {p or float('nan'):.3f} (KL {kl or float('nan'):.3f})"


def _acceptance_lines(acc: dict, label: str) -> list[str]:
    sets = acc["drafts"][label]["sets"]
    others = [k for k in acc["drafts"] if k != label]
    lines = ["## Acceptance on the evaluation sets (never used in training)", "",
             f"`benchmarks/acceptance.py`: exact offline replay of the engine's greedy verdicts, n = {acc['n']}, "
             f"{acc['schedule']}-step, first {next(iter(sets.values()))['prompts']} prompts of each set, at most "
             f"{acc['max_tokens']} tokens" + (f"; the same text replayed for {', '.join(others)}" if others else "") + ".", "",
             "| set | N | K | α | S0 = n·α | judged-draft acceptance |" + "".join(f" S0 {o} |" for o in others),
             "|---|---|---|---|---|---|" + "---|" * len(others)]
    for name, r in sets.items():
        lines.append(f"| {name} | {r['N']:,} | {r['K']:,} | {r['alpha']:.3f} | {r['S0']:.3f} | "
                     f"{r['judgement_accept_rate']:.3f} |" + "".join(f" {acc['drafts'][o]['sets'][name]['S0']:.3f} |" for o in others))
    return lines + [""]


def _curve_lines(curve: dict) -> list[str]:
    lines = ["## Reaching S0 = 2", "",
             f"S0 = n·α ≥ {curve['s0_target']} at n = {curve['n']} needs a judged-draft acceptance p ≥ {curve['p_needed']:.3f} "
             "(α = 1/(p + n(1 − p))). `spd bench learning_curve` fits p = a + b·log2(tokens) to each run's held-out "
             "curve (learning_curve.png, log-token axis). The projection extrapolates a straight line that real "
             "curves bend below, so it is a lower bound on the budget.", "",
             "| series | tokens (last) | p (last) | p per doubling | projected tokens (lower bound) |", "|---|---|---|---|---|"]
    for name, s in curve["series"].items():
        t, p = max(s["points"])
        slope = f"{s['fit'][1]:+.3f}" if s.get("fit") else "-"
        proj = f"{s['projected_tokens'] / 1e6:.0f}M" if "projected_tokens" in s else "-"
        lines.append(f"| {name} | {t:,} | {p:.3f} | {slope} | {proj} |")
    return lines + [""]


def card(cfg: dict, size_mb: float, hist: list[dict], model: str, fills: dict | None, acc: dict | None,
         label: str, curve: dict | None, extra: str) -> str:
    notes = cfg["notes"]
    vocab = notes.get("vocab", {})
    hours = hist[-1]["elapsed_s"] / 3600 if hist else float("nan")
    lines = [
        f"# PDM for {model} (n = {cfg['trained_n']}, L_s = {cfg['num_layers']}, {cfg['schedule']}-step)", "",
        "The Pipeline Draft Module that `spd generate`, `spd up` and the local pipeline load by default "
        "(`spd.pipeline.shipped_draft_for`). Trained on a 2-core CPU with `spd train` (services/spd/train).", "",
        "## Shape",
        f"- anchors {cfg['anchors']}, target width {cfg['target_hidden']}",
        f"- {cfg['num_layers']} Qwen3-style decoder layer(s), width {cfg['hidden_size']}, {cfg['num_heads']} heads / "
        f"{cfg['num_kv_heads']} KV heads, SwiGLU {cfg['intermediate_size']}",
        f"- draft vocabulary V_s = {cfg['draft_vocab']:,} of {cfg['target_vocab']:,} target tokens (the most frequent "
        f"self-generated tokens; coverage of held-out self-generated tokens {vocab.get('coverage_heldout_selfgen', float('nan')):.3f}, "
        f"of ShareGPT assistant text {vocab.get('coverage_sharegpt') or float('nan'):.3f}); head rows initialised from the target's LM head",
        f"- file: pdm.safetensors, fp16, {size_mb:.1f} MiB", "",
        "## Data", *_data_lines(notes.get("data", {})),
        "- held-out: the held-out ShareGPT split (2 % by a hash of the conversation id), self-generated the same "
        "way; never trained on. MT-Bench, GSM8K and HumanEval never enter training.", "",
        "## Training",
        f"- aligned training (per-depth replication, structural mask, simulated fill levels `{notes.get('fill', 'design')}`), "
        f"KL(teacher ‖ PDM) on the draft vocabulary; AdamW, peak lr {notes.get('lr')}, linear warm-up then linear decay "
        f"to 0 at the budget, {notes.get('batch_tokens')} response positions per step, one pass",
        f"- response tokens trained on: **{notes.get('tokens_seen', 0):,}**{_warm_start(notes)}; training wall time {hours:.1f} h on a CPU "
        "(as recorded by the run's checkpoints; work redone after a restart is counted once)",
        *_averaged_lines(notes),
        _heldout_line(notes, fills), "",
        "| tokens seen | held-out KL | held-out p (a = n) | hours |", "|---|---|---|---|",
        *[f"| {h['seen']:,} | {h['heldout_loss']:.3f} | {h['heldout_p']:.3f} | {h['elapsed_s'] / 3600:.1f} |" for h in hist], "",
    ]
    if fills:
        lines += _fill_lines(fills)
    if acc:
        lines += _acceptance_lines(acc, label)
    if curve:
        lines += _curve_lines(curve)
    return "\n".join(lines) + ("\n" + extra if extra else "") + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", required=True, help="run directory (RUN/pdm/, RUN/history.jsonl)")
    ap.add_argument("--fills", help="benchmarks/train_eval.py JSON (its last line)")
    ap.add_argument("--acceptance", help="benchmarks/acceptance.py JSON")
    ap.add_argument("--label", default="new", help="this draft's label in the acceptance JSON")
    ap.add_argument("--curve", help="benchmarks/learning_curve.py JSON")
    ap.add_argument("--extra", help="hand-written notes appended to the card")
    ap.add_argument("--model-name", default="SmolLM2-135M-Instruct")
    args = ap.parse_args(argv)
    run, dest = Path(args.run), SHIPPED_DRAFTS / args.model_name
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("pdm.safetensors", "config.json"):
        shutil.copy(run / "pdm" / name, dest / name)
    text = card(json.loads((dest / "config.json").read_text()), (dest / "pdm.safetensors").stat().st_size / 2**20,
                _jsonl(run / "history.jsonl"), args.model_name, _load(args.fills), _load(args.acceptance), args.label,
                _load(args.curve), Path(args.extra).read_text() if args.extra else "")
    (dest / "MODEL_CARD.md").write_text(text)
    print(dest)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

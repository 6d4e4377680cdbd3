"""Ship a trained PDM run into services/spd/assets/drafts/<model>/ with its MODEL_CARD.md.

  python benchmarks/train_ship.py --run runs/pdm-n5-ls1 [--alpha runs/alpha.json] [--probes runs]

Copies RUN/pdm/{pdm.safetensors,config.json} and writes the model card from the run's own records
(history.jsonl, the checkpoint's vocabulary info and config notes, the teacher cache progress) and
an α measurement by benchmarks/train_alpha.py.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from spd.pipeline import SHIPPED_DRAFTS


def _history(run: Path) -> list[dict]:
    p = run / "history.jsonl"
    return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []


def _probe_rows(root: Path) -> list[str]:
    rows = []
    for d in sorted(root.glob("probe-*")):
        h = _history(d)
        if h:
            cfg = json.loads((d / "pdm" / "config.json").read_text()) if (d / "pdm" / "config.json").exists() else {}
            src = cfg.get("notes", {}).get("data", {}).get("source", "?")
            rows.append(f"| {d.name} | {src} | {h[-1]['seen']:,} | {h[-1]['heldout_loss']:.3f} | {h[-1]['heldout_p']:.3f} |")
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run", default="runs/pdm-n5-ls1")
    ap.add_argument("--alpha", default=None, help="JSON written by benchmarks/train_alpha.py --json")
    ap.add_argument("--probes", default="runs")
    ap.add_argument("--model-name", default="SmolLM2-135M-Instruct")
    ap.add_argument("--tok-s", default="", help="measured throughput line for the card")
    args = ap.parse_args(argv)
    run = Path(args.run)
    dest = SHIPPED_DRAFTS / args.model_name
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("pdm.safetensors", "config.json"):
        shutil.copy(run / "pdm" / name, dest / name)
    cfg = json.loads((dest / "config.json").read_text())
    notes = cfg["notes"]
    hist = _history(run)
    alpha = json.loads(Path(args.alpha).read_text()) if args.alpha else None
    data = notes.get("data", {})
    cache_prog = {}
    cache_dir = Path(data.get("cache", ""))
    if (cache_dir / "progress.json").exists():
        cache_prog = json.loads((cache_dir / "progress.json").read_text())
    size_mb = (dest / "pdm.safetensors").stat().st_size / 2**20
    vocab = notes.get("vocab", {})
    curve = "\n".join(f"| {h['seen']:,} | {h['heldout_loss']:.3f} | {h['heldout_p']:.3f} | {h['elapsed_s'] / 60:.0f} |"
                      for h in hist)
    lines = [
        f"# PDM for {args.model_name} (n = {cfg['trained_n']}, L_s = {cfg['num_layers']}, {cfg['schedule']}-step)",
        "",
        "Pipeline Draft Module shipped with SPD and loaded by default by `spd generate` / the local "
        "pipeline (`spd.pipeline.shipped_draft_for`). Trained on a 2-core CPU in one session with "
        "`spd train` (services/spd/train); see the issue-4 note for the full story.",
        "",
        "## Shape",
        f"- anchors {cfg['anchors']} (`default_anchors(uniform_split(30, 5))`), target width {cfg['target_hidden']}",
        f"- {cfg['num_layers']} Qwen3-style decoder layer(s), width {cfg['hidden_size']}, "
        f"{cfg['num_heads']} heads / {cfg['num_kv_heads']} KV heads, SwiGLU {cfg['intermediate_size']}",
        f"- draft vocabulary V_s = {cfg['draft_vocab']} of {cfg['target_vocab']} target tokens; head rows "
        "initialised from the target's (tied) LM head",
        f"- file: pdm.safetensors, fp16, {size_mb:.1f} MiB",
        "",
        "## Data",
        "- **Self-generated**: the target's own greedy responses (bf16 teacher, at most 256 new tokens) to "
        "ShareGPT first-turn prompts (train split; prompts of at most 256 template tokens), through the "
        "target's chat template (the same prompt `spd generate` builds). Loss only on the response tokens.",
        f"- teacher cache when shipped (still growing; a single pass consumes it in order): "
        f"{cache_prog.get('consumed', '?')} prompts, {cache_prog.get('tokens', 0):,} positions, "
        f"{cache_prog.get('loss_tokens', 0):,} assistant positions (anchor states fp16 + teacher top-32 probabilities)",
        "- held-out: 96 prompts of the held-out ShareGPT split (2 % by a hash of the conversation id), "
        "self-generated the same way; never trained on. MT-Bench / GSM8K / HumanEval were not used.",
        f"- draft vocabulary: the {cfg['draft_vocab']} most frequent assistant tokens of the first "
        f"{vocab.get('selfgen_tokens_counted', 0):,} self-generated tokens, then of ShareGPT assistant text; "
        f"coverage of assistant tokens: held-out self-generated "
        f"{vocab.get('coverage_heldout_selfgen', float('nan')):.3f}, ShareGPT assistant text "
        f"{(vocab.get('coverage_sharegpt') or float('nan')):.3f}",
        "",
        "## Training",
        f"- aligned training (design §3/§7): per-depth replication, structural mask, simulated fill levels (DESIGN mix; a later phase may differ, see below) "
        f"(a = n w.p. 1/2, else uniform 1..n-1), KL(teacher || PDM) on the draft vocabulary at the newest "
        f"staircase position; AdamW lr {notes.get('lr')} (linear warm-up 20 steps, linear decay), "
        f"{notes.get('batch_tokens')} assistant positions per step, single pass",
        f"- tokens seen: {notes.get('tokens_seen', 0):,} assistant positions",
        f"- held-out (24 sequences, fill a = n, the saturated pipeline): KL {notes.get('heldout_loss') or float('nan'):.3f}, "
        f"top-1 agreement p = {notes.get('heldout_p') or float('nan'):.3f}",
        "",
        "| tokens seen | held-out KL | held-out p | minutes |",
        "|---|---|---|---|",
        curve,
        "",
    ]
    if args.tok_s:
        lines += [f"Throughput: {args.tok_s}", ""]
    probes = _probe_rows(Path(args.probes))
    if probes:
        lines += ["## Probes (24k-token runs, lr decayed to 0 within the run, V_s 12288, held-out p at a = n)", "",
                  "| run | data | tokens | held-out KL | held-out p |", "|---|---|---|---|---|", *probes, ""]
    if alpha:
        s = alpha["summary"]
        lines += [
            "## Acceptance measured by the engine",
            f"SPDEngine (in-process, greedy, n = {s['n']}, {s['schedule']}-step) on {s['prompts']} held-out "
            f"ShareGPT prompts (held-out split, never trained on; at most "
            f"{max(r['N'] for r in alpha['rows']) if alpha['rows'] else '?'} tokens each; output equal to greedy AR on "
            f"every prompt: {all(r.get('equals_ar', False) for r in alpha['rows'])}): "
            f"α = N/K = {s['alpha']:.3f}, S0 = n·α = {s['S0']:.2f}, judged-draft acceptance {s['p_accept']:.3f}.",
            "",
            "| prompt | N | K | α | accepts | rejects |", "|---|---|---|---|---|---|",
            *[f"| {r['id']} | {r['N']} | {r['K']} | {r['alpha']:.3f} | {r['accepts']} | {r['rejects']} |"
              for r in alpha["rows"]],
            "",
        ]
    extra = run / "CARD_EXTRA.md"
    if extra.exists():
        lines += [extra.read_text()]
    (dest / "MODEL_CARD.md").write_text("\n".join(lines) + "\n")
    print(dest)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

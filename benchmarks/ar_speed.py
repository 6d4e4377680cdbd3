"""Benchmark (not a test): our AR KV-cache loop vs HF `generate`, and one stage forward at n = 5.

Greedy, batch 1, default model, fp32, prefill excluded from tok/s. Writes JSON and prints a table.
    python benchmarks/ar_speed.py [--tokens 128] [--threads 2] [--out benchmarks/results/ar_speed.json]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from spd.core.sampling import SamplingParams
from spd.core.stopping import StopRule
from spd.core.target import run_through
from spd.core.ar import ar_generate
from spd.pipeline import PipelineConfig, build_local
from spd.text import encode_prompt
from results_io import save  # noqa: E402  (benchmarks/ is on sys.path: run as a script or by `spd bench`)

PROMPT = "Write a short story about a robot who learns to paint."


def ours(ids: list[int], tokens: int) -> dict:
    local = build_local(PipelineConfig(n=1), with_drafter=False)
    g = ar_generate(local.stages, ids, SamplingParams(), StopRule(tokens))  # no EOS: exactly `tokens`
    return {"tokens": len(g.token_ids), "decode_s": g.stats.decode_s,
            "tok_s": (len(g.token_ids) - 1) / g.stats.decode_s, "token_ids": g.token_ids}


def hf(model_dir: Path, ids: list[int], tokens: int) -> dict:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    x = torch.tensor([ids])
    with torch.inference_mode():
        t0 = time.perf_counter()
        model(x)  # prefill alone, to subtract it
        prefill = time.perf_counter() - t0
        t0 = time.perf_counter()
        out = model.generate(x, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)
        total = time.perf_counter() - t0
    return {"tokens": tokens, "decode_s": total - prefill, "tok_s": (tokens - 1) / (total - prefill),
            "token_ids": out[0, len(ids):].tolist()}


def stage_times(ids: list[int], n: int, reps: int) -> list[dict]:
    """Median time of one single-token forward per stage at context len(ids)."""
    local = build_local(PipelineConfig(n=n), with_drafter=False)
    run_through(local.stages, torch.tensor(ids), 0)
    h, rows = {}, []
    for j, stage in enumerate(local.stages):
        x = torch.tensor([ids[-1]]) if j == 0 else h[j - 1]
        samples = []
        for _ in range(reps):
            t0 = time.perf_counter()
            out = stage(x, len(ids))
            samples.append(time.perf_counter() - t0)
            stage.truncate(len(ids))
        h[j] = out.hidden
        rows.append({"stage": j + 1, "layers": len(stage.layer_ids), "lm_head": stage.is_last,
                     "ms_p50": 1e3 * statistics.median(samples)})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--out", default="benchmarks/results/ar_speed.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    local = build_local(PipelineConfig(n=1), with_drafter=False)
    ids = encode_prompt(local.tokenizer, PROMPT)
    a, b = ours(ids, args.tokens), hf(local.model_dir, ids, args.tokens)
    stages = stage_times(ids, 5, args.reps)
    result = {"threads": args.threads, "prompt_tokens": len(ids), "generated": args.tokens, "ours": a, "hf_generate": b,
              "same_tokens": a["token_ids"] == b["token_ids"], "stages_n5": stages}
    lines = [f"AR greedy, {args.tokens} tokens, {args.threads} threads, prompt {len(ids)} tokens", "",
             "| decoder | tok/s |", "|---|---|", f"| ours (KV-cache loop) | {a['tok_s']:.1f} |",
             f"| HF generate | {b['tok_s']:.1f} |", "", f"same tokens: {result['same_tokens']}", "",
             "| stage (n = 5, one token) | layers | ms p50 |", "|---|---|---|"]
    lines += [f"| {r['stage']} | {r['layers']}{' + LM head' if r['lm_head'] else ''} | {r['ms_p50']:.2f} |" for r in stages]
    save(args.out, result, "\n".join(lines))


if __name__ == "__main__":
    main()

"""Benchmark (not a test): drafter-data and training throughput, yesterday's settings vs today's, side by side.

Teacher = self-generated training data, "tokens generated and recorded per second":
  old  HF generate, bf16, batch 16, anchors + top-k captured by hooks while generating
       (`spd.train.teacher.generate_teacher`, the former `prepare selfgen` defaults)
  new  continuous-batching generation of token ids, bf16, batch 128 (`spd.train.batch_decode`), then
       the features by one batched bf16 prefill (`spd.train.online`); timed together
Trainer = PDM positions per second (aligned forward + KL + backward + AdamW), same sequences:
  old  fp32, one sequence per forward, attention through the dense [C*T, C*T] staircase mask
  new  bf16 autocast (fp32 master weights and optimizer state), one packed forward per optimizer
       step over only the rows the loss rows depend on (`spd.train.aligned.aligned_batch_hidden`),
       head + KL a chunk of rows at a time (`spd.train.trainer.head_kl`), fused AdamW

Both sides run in this one process, on the same prompts, at the same thread count.

    spd bench train_throughput [--prompts 128] [--max-new 128] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from spd.core.pdm import random_pdm
from spd.core.split import default_anchors, uniform_split
from spd.models.loading import load_config, load_tokenizer, resolve_model
from spd.train.batch_decode import BatchDecoder
from spd.train.online import OnlineTeacher
from spd.train.selfgen import selfgen_jobs
from spd.train.teacher import cache_layers, generate_teacher, load_hf
from spd.train.trainer import batch_loss, loss_rows, target_to_draft
from results_io import save  # noqa: E402  (benchmarks/ is on sys.path: run as a script or by `spd bench`)


def teacher_old(model_dir, prompts, max_new, eos) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        generate_teacher(model_dir, prompts, Path(tmp) / "c", batch=16, max_new=max_new, eos_id=eos)
        dt = time.perf_counter() - t0
        tokens = json.loads((Path(tmp) / "c" / "progress.json").read_text())["loss_tokens"]
    return {"tokens": tokens, "seconds": dt, "tokens_per_s": tokens / dt}


def teacher_new(model_dir, prompts, max_new, eos, layers) -> tuple[dict, list[dict]]:
    model = load_hf(model_dir)
    got: dict[int, list[int]] = {}
    t0 = time.perf_counter()
    BatchDecoder(model, 128, max_new, eos).run(
        [(i, p, 0.0) for i, p in enumerate(prompts)], lambda i, r: got.__setitem__(i, list(r)))
    t_gen = time.perf_counter() - t0
    teacher = OnlineTeacher(model_dir, layers)
    seqs = [(list(prompts[i]) + got[i][:-1], len(prompts[i]) - 1) for i in sorted(got)]
    t1 = time.perf_counter()
    feats = teacher.features(seqs)
    t_feat = time.perf_counter() - t1
    tokens = sum(len(r) for r in got.values())
    return {"tokens": tokens, "seconds": t_gen + t_feat, "generate_s": t_gen, "features_s": t_feat,
            "tokens_per_s": tokens / (t_gen + t_feat)}, feats


def step_groups(seqs, t2d, steps_rows: int, one_each: bool) -> list[tuple[list[int], bool]]:
    """The sequences of each forward (all of an optimizer step's, or `one_each` one per forward) and
    whether an optimizer step follows it: a step after the sequence whose loss rows reach steps_rows."""
    groups, group, acc = [], [], 0
    for i, seq in enumerate(seqs):
        group.append(i)
        acc += len(loss_rows(seq, t2d))
        if one_each or acc >= steps_rows:
            groups.append((group, acc >= steps_rows))
            group, acc = [], 0 if acc >= steps_rows else acc
    return groups + ([(group, False)] if group else [])


def trainer(config, seqs, layers, amp: str, dense: bool, n: int = 5, vocab: int = 16384, steps_rows: int = 1024) -> dict:
    """PDM positions per second over `seqs` (fill level 1 + i % n for seqs[i]), AdamW every steps_rows
    loss rows. dense (old): one sequence per forward through the dense mask, for-loop AdamW; else
    (new) one packed forward per optimizer step over its sequences' needed rows, fused AdamW."""
    split = uniform_split(config.num_hidden_layers, n)
    anchors = default_anchors(split)
    counts = torch.zeros(config.vocab_size, dtype=torch.long)
    for s in seqs:
        counts += torch.bincount(s["top_ids"][s["loss"].bool(), 0].long(), minlength=config.vocab_size)
    d2t = counts.argsort(descending=True)[:vocab].sort().values
    pdm = random_pdm(config, anchors, 1, draft_ids=d2t, seed=0)
    t2d = target_to_draft(d2t, config.vocab_size)
    cols = [layers.index(b) for b in anchors]
    opt = torch.optim.AdamW(pdm.parameters(), lr=1e-3, fused=not dense)  # new: fused, as spd.train.loop
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp == "bfloat16")
    rows_total, t0 = 0, time.perf_counter()
    for group, step in step_groups(seqs, t2d, steps_rows, one_each=dense):
        with autocast:
            kl, rows, _ = batch_loss(pdm, [seqs[i] for i in group], split, [1 + i % n for i in group], 0, t2d, cols,
                                     dense=dense)
        if kl is not None:
            (kl / steps_rows).backward()
            rows_total += rows
        if step:
            opt.step()
            opt.zero_grad(set_to_none=True)
    dt = time.perf_counter() - t0
    return {"amp": amp, "dense_mask": dense, "positions": rows_total, "seconds": dt, "positions_per_s": rows_total / dt}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="spd bench train_throughput")
    ap.add_argument("--prompts", type=int, default=128, help="ShareGPT prompts generated for (default 128)")
    ap.add_argument("--max-new", type=int, default=128, help="response cap (default 128)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads for every measurement (default 2)")
    ap.add_argument("--train-seqs", type=int, default=48, help="sequences per trainer measurement (default 48)")
    ap.add_argument("--out", default="benchmarks/results/train_throughput.json")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    model_dir = resolve_model(None)
    config, tok = load_config(model_dir), load_tokenizer(model_dir)
    prompts = [list(j.prompt) for j in selfgen_jobs(tok) if j.temperature == 0][: args.prompts]
    layers = cache_layers(config.num_hidden_layers)
    old = teacher_old(model_dir, prompts, args.max_new, tok.eos_token_id)
    new, feats = teacher_new(model_dir, prompts, args.max_new, tok.eos_token_id, layers)
    seqs = feats[: args.train_seqs]
    trainer(config, seqs[:4], layers, "float32", True)  # warm-up
    t_old = trainer(config, seqs, layers, "float32", True)
    t_new = trainer(config, seqs, layers, "bfloat16", False)
    result = {"threads": args.threads, "prompts": len(prompts), "max_new": args.max_new,
              "teacher": {"old": old, "new": new, "speedup": new["tokens_per_s"] / old["tokens_per_s"]},
              "trainer": {"old": t_old, "new": t_new, "speedup": t_new["positions_per_s"] / t_old["positions_per_s"]}}
    save(args.out, result, f"| stage | old | new | new / old |\n|---|---|---|---|\n"
         f"| teacher (tokens generated + recorded / s) | {old['tokens_per_s']:.0f} | {new['tokens_per_s']:.0f} | "
         f"{result['teacher']['speedup']:.2f} |\n"
         f"| trainer (positions / s) | {t_old['positions_per_s']:.0f} | {t_new['positions_per_s']:.0f} | "
         f"{result['trainer']['speedup']:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

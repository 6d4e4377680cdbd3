"""Benchmark (not a test): drafter-data and training throughput, yesterday's settings vs today's, side by side.

Teacher = self-generated training data, "response tokens generated and recorded (anchors + top-k)
per second", greedy, on a seeded sample of the self-generation prompts (sorted by length):
  old          HF generate, batch 16, anchors + top-k captured by forward hooks while
               generating, written as cache shards (the former `prepare selfgen`, kept below)
  ids+prefill  continuous-batching generation of token ids, batch B (`spd.train.batch_decode`),
               then the features by batched prefills (`spd.train.online`); timed together
  new          continuous batching, batch B, rows re-laid out oldest first and attending in
               groups over each group's own window, the features recorded by the decode steps
               themselves, written as cache shards (`spd.train.teacher.record_teacher`)
Every measurement after `old` runs with glibc malloc keeping freed memory (`spd.train.memory`, as
the teacher and trainer processes do): the old teacher runs as it always did, the old trainer
gets the setting too (so its ratio is, if anything, understated).
Trainer = PDM positions per second (aligned forward + KL + backward + AdamW), same sequences, in
steady state (an untimed pass first, then timed passes):
  old  fp32, one sequence per forward, attention through the dense [C*T, C*T] staircase mask
  new  autocast in the batched dtype where that is bf16 (fp32 master weights and optimizer state), one packed forward per optimizer
       step over only the rows the loss rows depend on (`spd.train.aligned.aligned_batch_hidden`),
       head + KL a chunk of rows at a time (`spd.train.trainer.head_kl`), fused AdamW
EAGLE-3 trainer = its step-1 positions per second (TTT unroll + KL at every step + backward +
fused AdamW), same sequences, both in the batched dtype and through the same loss (`head_kl`'s head + KL):
  old  one sequence per unroll
  new  an optimizer step's sequences right-padded into one batch (`spd.eagle.train.batch_ttt_loss`)

Every teacher runs in the machine's batched dtype (`spd.train.precision`): bf16 on a CPU with bf16
units, as the former self-generation did; fp32 on one without (there bf16 is emulated, ~8x slower).
Both sides run in this one process, on the same prompts, at the same thread count.

    spd bench train_throughput [--prompts 256] [--max-new 256] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

import torch

from spd.core.pdm import random_pdm
from spd.core.stage import load_embedding
from spd.core.split import default_anchors, uniform_split
from spd.eagle.model import default_feature_layers, random_eagle
from spd.eagle.train import batch_ttt_loss
from spd.models.loading import load_config, load_tokenizer, resolve_model
from spd.train.batch_decode import BatchDecoder
from spd.train.memory import keep_freed_memory
from spd.train.online import OnlineTeacher
from spd.train.precision import batched_dtype, cpu_flags
from spd.train.selfgen import selfgen_jobs
from spd.train.teacher import TOP_K, ShardWriter, HookCapture, cache_layers, load_hf, record_teacher
from spd.train.trainer import batch_loss, loss_rows, target_to_draft
from results_io import save  # noqa: E402  (benchmarks/ is on sys.path: run as a script or by `spd bench`)


@torch.inference_mode()
def hf_generate_teacher(model_dir, prompts, out: Path, batch: int, max_new: int, eos: int) -> None:
    """The former self-generation teacher: HF `generate`, `batch` left-padded prompts at a time (each
    batch waits for its longest answer), hooks recording H[b] and the top-k at every step."""
    model = load_hf(model_dir)
    layers = cache_layers(model.config.num_hidden_layers)
    writer, cap = ShardWriter(out, layers, {"source": "self-generated"}), HookCapture(model, layers)
    for i in range(0, len(prompts), batch):
        chunk = prompts[i:i + batch]
        P = max(len(p) for p in chunk)
        ids = torch.tensor([[eos] * (P - len(p)) + p for p in chunk])
        attn = torch.tensor([[0] * (P - len(p)) + [1] * len(p) for p in chunk])
        cap.states, cap.tops = [], []
        gen = model.generate(input_ids=ids, attention_mask=attn, do_sample=False, max_new_tokens=max_new,
                             pad_token_id=eos, eos_token_id=eos)[:, P:]  # [B, G]
        states = torch.cat(cap.states, dim=1)  # [B, P + steps, m, d]
        top_i = torch.stack([t[0] for t in cap.tops], dim=1)  # [B, steps, k]: step s predicts gen[s]
        top_p = torch.stack([t[1] for t in cap.tops], dim=1)
        for b, p in enumerate(chunk):
            g = gen[b].tolist()
            g = g[:g.index(eos) + 1] if eos in g else g
            n = len(p) + len(g) - 1  # positions: prompt + g[:-1]
            ti, tp = torch.zeros(n, TOP_K, dtype=torch.int32), torch.zeros(n, TOP_K, dtype=torch.float16)
            ti[len(p) - 1:], tp[len(p) - 1:] = top_i[b, :len(g)], top_p[b, :len(g)]
            writer.add(p + g[:-1], [0] * (len(p) - 1) + [1] * len(g), states[b, P - len(p):P - len(p) + n].clone(), ti, tp)
        writer.flush_if_full(i + len(chunk), 0.0)
    writer.flush_if_full(len(prompts), 0.0, force=True)
    cap.close()


def _timed(write, out: Path) -> dict:
    t0 = time.perf_counter()
    write(out)
    dt = time.perf_counter() - t0
    tokens = json.loads((out / "progress.json").read_text())["loss_tokens"]
    return {"tokens": tokens, "seconds": dt, "tokens_per_s": tokens / dt}


def teacher_old(model_dir, prompts, max_new, eos, tmp: Path) -> dict:
    return _timed(lambda out: hf_generate_teacher(model_dir, prompts, out, 16, max_new, eos), tmp / "old")


def teacher_new(model_dir, prompts, max_new, eos, batch: int, tmp: Path) -> dict:
    return {"batch": batch, **_timed(lambda out: record_teacher(model_dir, prompts, out, batch, max_new, eos_id=eos),
                                     tmp / "new")}


def teacher_ids_prefill(model_dir, prompts, max_new, eos, layers, batch: int) -> tuple[dict, list[dict]]:
    """Token ids first, then the features by prefill (also the sequences the trainer is timed on)."""
    model = load_hf(model_dir)
    got: dict[int, list[int]] = {}
    t0 = time.perf_counter()
    BatchDecoder(model, batch, max_new, eos).run(
        [(i, p, 0.0) for i, p in enumerate(prompts)], lambda i, r: got.__setitem__(i, list(r)))
    t_gen = time.perf_counter() - t0
    teacher = OnlineTeacher(model_dir, layers)
    seqs = [(list(prompts[i]) + got[i][:-1], len(prompts[i]) - 1) for i in sorted(got)]
    t1 = time.perf_counter()
    feats = teacher.features(seqs)
    t_feat = time.perf_counter() - t1
    tokens = sum(len(r) for r in got.values())
    return {"batch": batch, "tokens": tokens, "seconds": t_gen + t_feat, "generate_s": t_gen, "features_s": t_feat,
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


def _draft_vocab(seqs, vocab_size: int, vocab: int) -> torch.Tensor:
    """The `vocab` most frequent teacher argmaxes over the loss rows of `seqs`, ascending [V_s]."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for s in seqs:
        counts += torch.bincount(s["top_ids"][s["loss"].bool(), 0].long(), minlength=vocab_size)
    return counts.argsort(descending=True)[:vocab].sort().values


def _steady(groups, loss, params, fused: bool, amp: str, steps_rows: int, passes: int) -> dict:
    """Positions per second of `loss(group)` (-> kl, rows, hits) + backward over `groups` (from
    `step_groups`), AdamW where a group ends a step. Steady state, as a training run of hours sees
    it: one untimed pass first (first touch of memory, kernel choices for these shapes), then
    `passes` timed ones."""
    opt = torch.optim.AdamW(params, lr=1e-3, fused=fused)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp == "bfloat16")

    def one_pass() -> int:
        rows_total = 0
        for group, step in groups:
            with autocast:
                kl, rows, _ = loss(group)
            if kl is not None:
                (kl / steps_rows).backward()
                rows_total += rows
            if step:
                opt.step()
                opt.zero_grad(set_to_none=True)
        return rows_total

    one_pass()
    t0 = time.perf_counter()
    rows_total = sum(one_pass() for _ in range(passes))
    dt = time.perf_counter() - t0
    return {"amp": amp, "passes": passes, "positions": rows_total, "seconds": dt, "positions_per_s": rows_total / dt}


def trainer(config, seqs, layers, amp: str, dense: bool, n: int = 5, vocab: int = 16384, steps_rows: int = 1024,
            passes: int = 2) -> dict:
    """PDM positions per second over `seqs` (fill level 1 + i % n for seqs[i]), AdamW every steps_rows
    loss rows. dense (old): one sequence per forward through the dense mask, for-loop AdamW; else
    (new) one packed forward per optimizer step over its sequences' needed rows, fused AdamW."""
    split = uniform_split(config.num_hidden_layers, n)
    anchors = default_anchors(split)
    d2t = _draft_vocab(seqs, config.vocab_size, vocab)
    pdm = random_pdm(config, anchors, 1, draft_ids=d2t, seed=0)
    t2d = target_to_draft(d2t, config.vocab_size)
    cols = [layers.index(b) for b in anchors]

    def loss(group):
        return batch_loss(pdm, [seqs[i] for i in group], split, [1 + i % n for i in group], 0, t2d, cols, dense=dense)

    groups = step_groups(seqs, t2d, steps_rows, one_each=dense)
    return {"dense_mask": dense, **_steady(groups, loss, pdm.parameters(), not dense, amp, steps_rows, passes)}


def eagle_trainer(model_dir, config, seqs, layers, amp: str, one_each: bool, ttt: int = 4, vocab: int = 16384,
                  steps_rows: int = 1024, passes: int = 2) -> dict:
    """EAGLE-3 positions per second (step-1 loss rows, as its budget counts them) over `seqs`, `ttt`
    unrolled steps, fused AdamW every steps_rows rows. one_each (old): one sequence per unroll; else
    (new) an optimizer step's sequences right-padded into one batch (`spd.eagle.train.batch_ttt_loss`)."""
    d2t = _draft_vocab(seqs, config.vocab_size, vocab)
    feature_layers = default_feature_layers(config.num_hidden_layers)
    draft = random_eagle(config, feature_layers, draft_ids=d2t, embed_weight=load_embedding(model_dir, config).weight)
    t2d = target_to_draft(d2t, config.vocab_size)
    cols = [layers.index(b) for b in feature_layers]
    draft.train()

    def loss(group):
        return batch_ttt_loss(draft, [seqs[i] for i in group], cols, t2d, ttt)

    groups = step_groups(seqs, t2d, steps_rows, one_each=one_each)
    return {"one_sequence_each": one_each, "ttt": ttt,
            **_steady(groups, loss, draft.parameters(), True, amp, steps_rows, passes)}


def machine() -> dict:
    """What bounds the teacher here: the CPU's bf16 matrix units, the GEMM rate in the batched dtype (a
    target token costs 2 x params FLOPs) and the memory read rate (a decode step reads every row's
    K and V)."""
    flags, dtype = cpu_flags(), batched_dtype("cpu")
    x, w = torch.randn(2048, 576, dtype=dtype), torch.randn(1536, 576, dtype=dtype)
    torch.nn.functional.linear(x, w)
    t0 = time.perf_counter()
    for _ in range(20):
        torch.nn.functional.linear(x, w)
    gflops = 20 * 2 * x.shape[0] * w.numel() / (time.perf_counter() - t0) / 1e9
    big = torch.ones(1 << 27, dtype=torch.bfloat16)  # 256 MiB, far beyond the caches
    big.sum()
    t0 = time.perf_counter()
    for _ in range(5):
        big.sum()
    read = 5 * big.numel() * 2 / (time.perf_counter() - t0) / 1e9
    return {"amx_bf16": "amx_bf16" in flags, "avx512_bf16": "avx512_bf16" in flags, "dtype": str(dtype).split(".")[1],
            "gemm_gflops": round(gflops),
            "read_gb_s": round(read, 1)}


def teacher_ceiling(cpu: dict, config, params: int, mean_prompt: float, mean_resp: float) -> float:
    """Response tokens / s if every matmul ran at the GEMM rate and decode attention read only each
    row's real K and V at the read rate (no padding, no overhead): per response token, its share of
    the prompt's prefill, one decode step's matmuls, and the K/V of a context of prompt + resp/2."""
    flop_s = 2 * params / (cpu["gemm_gflops"] * 1e9)  # one token through the target
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv_bytes = 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * batched_dtype("cpu").itemsize  # K and V per position
    read_s = kv_bytes * (mean_prompt + mean_resp / 2) / (cpu["read_gb_s"] * 1e9)
    return 1 / (flop_s * mean_prompt / mean_resp + flop_s + read_s)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="spd bench train_throughput")
    ap.add_argument("--prompts", type=int, default=256, help="self-generation prompts generated for (default 256)")
    ap.add_argument("--batch", type=int, default=128, help="rows decoding together in the new teachers (default 128)")
    ap.add_argument("--max-new", type=int, default=256, help="response cap (default 256, as self-generation)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads for every measurement (default 2)")
    ap.add_argument("--train-seqs", type=int, default=48, help="sequences per trainer pass (default 48)")
    ap.add_argument("--train-passes", type=int, default=2, help="timed trainer passes, after an untimed one (default 2)")
    ap.add_argument("--out", default="benchmarks/results/train_throughput/this-machine.json",
                    help="where the run goes; a kept run is renamed for its machine (see train_throughput_hosts)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    model_dir = resolve_model(None)
    config, tok = load_config(model_dir), load_tokenizer(model_dir)
    greedy = [j for j in selfgen_jobs(tok) if j.temperature == 0]
    prompts = sorted((list(j.prompt) for j in random.Random(0).sample(greedy, args.prompts)), key=len)
    layers, eos = cache_layers(config.num_hidden_layers), tok.eos_token_id
    with tempfile.TemporaryDirectory() as tmp:
        old = teacher_old(model_dir, prompts, args.max_new, eos, Path(tmp))
        keep_freed_memory()
        new = teacher_new(model_dir, prompts, args.max_new, eos, args.batch, Path(tmp))
    two_pass, feats = teacher_ids_prefill(model_dir, prompts, args.max_new, eos, layers, args.batch)
    seqs = feats[:: max(1, len(feats) // args.train_seqs)][: args.train_seqs]  # every length (the prompts are sorted)
    t_old = trainer(config, seqs, layers, "float32", True, passes=args.train_passes)
    amp = str(batched_dtype("cpu")).split(".")[1]
    t_new = trainer(config, seqs, layers, amp, False, passes=args.train_passes)
    e_old, e_new = (eagle_trainer(model_dir, config, seqs, layers, amp, one_each, passes=args.train_passes)
                    for one_each in (True, False))
    params = sum(p.numel() for p in load_hf(model_dir).parameters())
    cpu = {**machine(), "target_params": params}
    cpu["prefill_ceiling_tok_s"] = round(cpu["gemm_gflops"] * 1e9 / (2 * params))
    mean_prompt = sum(map(len, prompts)) / len(prompts)
    cpu["teacher_ceiling_tok_s"] = round(teacher_ceiling(cpu, config, params, mean_prompt, new["tokens"] / len(prompts)))
    result = {"threads": args.threads, "machine": cpu, "prompts": len(prompts), "mean_prompt": mean_prompt,
              "max_new": args.max_new,
              "teacher": {"old": old, "ids_then_prefill": two_pass, "new": new,
                          "speedup": new["tokens_per_s"] / old["tokens_per_s"],
                          "ids_then_prefill_speedup": two_pass["tokens_per_s"] / old["tokens_per_s"]},
              "trainer": {"old": t_old, "new": t_new, "speedup": t_new["positions_per_s"] / t_old["positions_per_s"]},
              "eagle3_trainer": {"old": e_old, "new": e_new,
                                 "speedup": e_new["positions_per_s"] / e_old["positions_per_s"]}}
    save(args.out, result, f"| stage | old | new | new / old |\n|---|---|---|---|\n"
         f"| teacher (tokens generated + recorded / s) | {old['tokens_per_s']:.0f} | {new['tokens_per_s']:.0f} | "
         f"{result['teacher']['speedup']:.2f} |\n"
         f"| teacher, ids then prefill (the other candidate) | {old['tokens_per_s']:.0f} | "
         f"{two_pass['tokens_per_s']:.0f} | {result['teacher']['ids_then_prefill_speedup']:.2f} |\n"
         f"| trainer (positions / s) | {t_old['positions_per_s']:.0f} | {t_new['positions_per_s']:.0f} | "
         f"{result['trainer']['speedup']:.2f} |\n"
         f"| EAGLE-3 trainer, TTT {e_new['ttt']} (step-1 positions / s) | {e_old['positions_per_s']:.0f} | "
         f"{e_new['positions_per_s']:.0f} | {result['eagle3_trainer']['speedup']:.2f} |\n\n"
         f"{len(prompts)} prompts (mean {result['mean_prompt']:.0f} tokens), responses <= {args.max_new}; "
         f"{args.threads} threads; AMX {'yes' if cpu['amx_bf16'] else 'no'}, teachers in {cpu['dtype']}, GEMM {cpu['gemm_gflops']} GFLOPS: "
         f"a target pass at most ~{cpu['prefill_ceiling_tok_s']} tokens/s; memory read {cpu['read_gb_s']} GB/s.\n\n"
         f"Teacher ceiling on this machine (every matmul at that GEMM rate, decode attention reading only the real K/V "
         f"at that read rate, no padding, no overhead): ~{cpu['teacher_ceiling_tok_s']} tokens/s = "
         f"{cpu['teacher_ceiling_tok_s'] / old['tokens_per_s']:.1f}x old; new reaches "
         f"{new['tokens_per_s'] / cpu['teacher_ceiling_tok_s']:.0%} of it.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

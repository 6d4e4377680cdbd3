"""PDM training loop (design §7) over a teacher cache: aligned forward, KL to the teacher restricted to
the draft vocabulary, AdamW with linear decay, checkpoint + resume, held-out top-1 agreement.

Public API (reused by `spd train`, the benchmarks and the eval harness):
  TrainConfig, train(cfg) -> PDM
  sequence_loss(pdm, seq, split, a, s0, t2d, cols) -> (kl_sum, rows, hits)
  evaluate(pdm, seqs, split, s0, t2d, cols, fill=None) -> {"loss", "p", "p_in_vocab", "tokens"}
  sample_fill(n, rng, p_full)
"""

from __future__ import annotations

import json
import logging
import os
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from spd.core.pdm import PDM, random_pdm
from spd.core.schedule import staircase_offset
from spd.core.split import PipelineSplit, default_anchors, uniform_split
from spd.train.aligned import aligned_logits
from spd.train.teacher import TeacherCache

log = logging.getLogger(__name__)


@dataclass
class TrainConfig:
    model: str | None = None  # target model dir (None = default SmolLM2-135M-Instruct)
    n: int = 5  # pipeline width the PDM is trained for
    ls: int = 1  # PDM decoder layers
    anchors: list[int] | None = None  # anchor layers B; None = default_anchors (PPSD: [0, e1])
    schedule: str = "pre"  # pre (s0 = 0) | post (s0 = 1)
    tokens: int = 0  # budget in loss positions (assistant tokens); 0 = one pass over the cache as it is now
    lr: float = 1e-4
    warmup: int = 20  # optimizer steps of linear warm-up
    weight_decay: float = 0.01
    batch_tokens: int = 1024  # loss positions per optimizer step (sequences accumulated)
    vocab: int = 12288  # V_s
    data: str = "selfgen-train"  # teacher cache name under $SPD_CACHE/teacher/<model>/ (or a path)
    heldout: str = "selfgen-heldout"
    eval_seqs: int = 24  # held-out sequences per evaluation
    eval_every_s: float = 600.0
    ckpt_every_s: float = 300.0
    out: str = "runs/pdm"
    resume: bool = False
    seed: int = 0
    threads: int = 1
    wait: bool = False  # wait for more shards (cache still being generated) until the budget is met
    p_full: float = 0.5  # P(a = n) of the simulated fill level; else uniform 1..n-1
    fill: str = "design"  # design (the above) | judged:P (fill levels of the drafts the engine judges at acceptance P)
    init_head: bool = True  # head rows (and final norm) from the target
    epochs: int = 1  # passes over the cache (single pass by default; tests overfit with more)
    max_steps: int = 0  # stop after this many optimizer steps (tests); 0 = budget
    max_seconds: float = 0.0  # stop (checkpointed, resumable) after this wall time; 0 = none
    progress: bool = True
    device: str = "cpu"  # torch device of the PDM (cuda for the GPU recipe)
    amp: str = "bfloat16"  # autocast dtype of the forward (bfloat16: AMX on this CPU, tensor cores on GPUs) | float32

    notes: dict = field(default_factory=dict)


def sample_fill(n: int, rng: random.Random, p_full: float = 0.5, fill: str = "design") -> int:
    """Simulated fill level. "design": a = n with probability p_full, else uniform in 1..n-1 (design §7).

    "judged:P": the fill levels of the drafts the engine actually judges when each judgement accepts
    with probability P: after a reject the a = 1 draft is judged next, after an accept the next fill
    up, so P(a = k) ∝ P^(k-1) for k < n and ∝ P^(n-1)/(1-P) for a = n. At low P most judged drafts are
    a = 1 drafts (P = 0.35: 65 %), which the design mix sees only 1/8 of the time.
    """
    if n == 1:
        return n
    if fill.startswith("judged:"):
        p = float(fill.split(":", 1)[1])
        w = [p ** (k - 1) for k in range(1, n)] + [p ** (n - 1) / max(1 - p, 1e-6)]
        return rng.choices(range(1, n + 1), weights=w)[0]
    if rng.random() < p_full:
        return n
    return rng.randint(1, n - 1)


def target_to_draft(d2t: torch.Tensor, vocab_size: int) -> torch.Tensor:
    t2d = torch.full((vocab_size,), -1, dtype=torch.long)
    t2d[d2t] = torch.arange(len(d2t))
    return t2d


def teacher_kl(logits: torch.Tensor, d: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Sum over rows of KL(teacher || draft): logits [R, V_s]; d [R, k] the teacher's top ids as draft
    ids (-1 outside the draft vocabulary); top_p [R, k]. The teacher is restricted to the draft
    vocabulary and renormalised."""
    p = top_p.float() * (d >= 0)
    p = p / p.sum(-1, keepdim=True)
    lq = F.log_softmax(logits.float(), dim=-1).gather(1, d.clamp(min=0))
    return (p * (torch.log(p.clamp_min(1e-20)) - lq)).sum()


def sequence_loss(pdm: PDM, seq: dict, split: PipelineSplit, a: int, s0: int, t2d: torch.Tensor,
                  cols: list[int], dense: bool = False):
    """KL(teacher || PDM) summed over the loss rows of one sequence: newest staircase position (the
    depth-s0 copy), assistant tokens only, teacher argmax inside the draft vocabulary; the teacher's
    top-k restricted to the draft vocabulary and renormalised. Returns (kl_sum, rows, hits)."""
    dev = pdm.d2t.device
    anchors = seq["anchors"][:, cols].to(dev).float()
    ids = t2d.to(dev)[seq["top_ids"].to(dev).long()]  # [T, k] draft ids, -1 outside
    valid = seq["loss"].to(dev).bool() & (ids[:, 0] >= 0)
    rows = valid.nonzero()[:, 0]
    if len(rows) == 0:
        return None, 0, 0
    logits = aligned_logits(pdm, anchors, split, a, s0, rows, dense=dense)
    d = ids[rows]
    kl = teacher_kl(logits, d, seq["top_p"].to(dev)[rows])
    hits = int((logits.argmax(-1) == d[:, 0]).sum())
    return kl, len(rows), hits


@torch.no_grad()
def evaluate(pdm: PDM, seqs: list[dict], split: PipelineSplit, s0: int, t2d: torch.Tensor, cols: list[int],
             fill: int | None = None) -> dict:
    """Held-out metrics at fill level `fill` (default n: the saturated pipeline).

    p = top-1 agreement with the teacher over ALL assistant positions (a teacher argmax outside the
    draft vocabulary counts as a miss): the acceptance probability of a greedy draft at that fill.
    """
    was = pdm.training
    pdm.eval()
    a = fill or split.n
    kl_sum, kl_rows, hits, total = 0.0, 0, 0, 0
    dev = pdm.d2t.device
    for seq in seqs:
        seq = {k: v.to(dev) for k, v in seq.items()}
        lrows = seq["loss"].bool().nonzero()[:, 0]
        if len(lrows) == 0:
            continue
        logits = aligned_logits(pdm, seq["anchors"][:, cols].float(), split, a, s0, lrows)
        hits += int((pdm.d2t[logits.argmax(-1)] == seq["top_ids"][lrows, 0].long()).sum())
        total += len(lrows)
        ids = t2d.to(dev)[seq["top_ids"][lrows].long()]
        ok = ids[:, 0] >= 0
        if ok.any():
            d = ids[ok]
            p = seq["top_p"][lrows][ok].float() * (d >= 0)
            p = p / p.sum(-1, keepdim=True)
            lq = F.log_softmax(logits[ok].float(), -1).gather(1, d.clamp(min=0))
            kl_sum += float((p * (torch.log(p.clamp_min(1e-20)) - lq)).sum())
            kl_rows += int(ok.sum())
    pdm.train(was)
    return {"loss": kl_sum / max(kl_rows, 1), "p": hits / max(total, 1), "p_in_vocab_rows": kl_rows / max(total, 1),
            "tokens": total, "fill": a}


def _resolve_cache(model_dir: Path, name: str, device: str = "cpu"):
    """A teacher cache directory, or a selfgen id directory (part_*.npz) read with online features."""
    from spd.train.teacher import teacher_dir

    path = Path(name) if "/" in name else teacher_dir(model_dir, name)
    if any(path.glob("part_*.npz")):
        from spd.models.loading import load_tokenizer
        from spd.train.online import OnlineCache

        return OnlineCache(path, model_dir, load_tokenizer(model_dir), device=device)
    return TeacherCache(path)


def _atomic_save(obj, path: Path) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def make_pdm(cfg: TrainConfig, model_dir: Path, config, split: PipelineSplit, draft_ids: torch.Tensor) -> PDM:
    lm_head = None
    if cfg.init_head:
        from spd.core.stage import load_stage

        last = load_stage(model_dir, config, range(config.num_hidden_layers - 1, config.num_hidden_layers), ())
        lm_head = last.lm_head.weight.detach()
    anchors = list(cfg.anchors) if cfg.anchors else list(default_anchors(split))
    pdm = random_pdm(config, anchors, cfg.ls, draft_ids=draft_ids, lm_head_weight=lm_head,
                     seed=cfg.seed)
    # (copying the target's final-norm weights too made the initial logits huge: KL ~16 at step 0)
    pdm.config.schedule, pdm.config.trained_n = cfg.schedule, cfg.n
    return pdm


def choose_vocab(cfg: TrainConfig, model_dir: Path, config, cache: TeacherCache, held: TeacherCache | None):
    from spd.models.loading import load_tokenizer
    from spd.train.vocab import build_vocab, cache_counts, coverage, sharegpt_counts

    V = config.vocab_size
    own = cache_counts(cache, V)
    try:
        tok = load_tokenizer(model_dir)
        share = sharegpt_counts(tok, V, model_dir.name)
        eos = (tok.eos_token_id,) if tok.eos_token_id is not None else ()
    except Exception as e:  # tiny id-only models: no tokenizer
        log.info("vocab: no ShareGPT counts (%s)", e)
        share, eos = torch.zeros(V, dtype=torch.long), ()
    # normalised frequencies: the target's own text first, ShareGPT assistant text for the tail
    score = own.double() / max(own.sum().item(), 1) + 0.25 * share.double() / max(share.sum().item(), 1)
    d2t = build_vocab(score, min(cfg.vocab, V), eos)
    info = {"V_s": len(d2t), "coverage_train_selfgen": coverage(own, d2t),
            "coverage_sharegpt": coverage(share, d2t) if share.sum() else None, "selfgen_tokens_counted": int(own.sum())}
    if held is not None:
        info["coverage_heldout_selfgen"] = coverage(cache_counts(held, V), d2t)
    return d2t, info


def train(cfg: TrainConfig) -> PDM:
    from tqdm import tqdm

    from spd.models.loading import load_config, resolve_model

    torch.set_num_threads(cfg.threads)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    model_dir = resolve_model(cfg.model)
    config = load_config(model_dir)
    split = uniform_split(config.num_hidden_layers, cfg.n)
    s0 = staircase_offset(cfg.schedule)
    cache = _resolve_cache(model_dir, cfg.data, cfg.device)
    held = _resolve_cache(model_dir, cfg.heldout, cfg.device) if cfg.heldout else None
    if held is not None and hasattr(cache, "teacher") and hasattr(held, "teacher"):
        held._teacher = cache.teacher  # one target in memory
    ckpt_path = out / "ckpt.pt"
    state = None
    if cfg.resume and ckpt_path.exists():
        state = torch.load(ckpt_path, weights_only=False)
        log.info("resuming from %s at step %d (%d tokens)", ckpt_path, state["step"], state["seen"])
        d2t, vocab_info = state["d2t"], state["vocab_info"]
        saved = TrainConfig(**{**state["cfg"], "resume": True})
        for k in ("n", "ls", "anchors", "schedule", "vocab", "data"):
            if getattr(saved, k) != getattr(cfg, k):
                raise ValueError(f"--resume with a different {k}: checkpoint {getattr(saved, k)!r}, now {getattr(cfg, k)!r}")
    else:
        d2t, vocab_info = choose_vocab(cfg, model_dir, config, cache, held)
        log.info("vocab: %s", vocab_info)
    pdm = make_pdm(cfg, model_dir, config, split, d2t).to(cfg.device)
    cols = [cache.layers.index(b) for b in pdm.config.anchors]
    t2d = target_to_draft(d2t, config.vocab_size)
    opt = torch.optim.AdamW(pdm.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    budget = cfg.tokens or int(cache.progress().get("loss_tokens", 0)) * cfg.epochs
    step, seen, shard_i, seq_i, history, epoch = 0, 0, 0, 0, [], 0
    rng = random.Random(cfg.seed)
    elapsed = 0.0
    if state is not None:
        pdm.load_state_dict(state["pdm"])
        opt.load_state_dict(state["opt"])
        step, seen, shard_i, seq_i, history = state["step"], state["seen"], state["shard"], state["seq"], state["history"]
        epoch = state.get("epoch", 0)
        rng.setstate(state["rng"])
        elapsed = state.get("elapsed", 0.0)
    held_seqs = []
    if held is not None:
        for sh in held.shards():
            held_seqs.extend(held.sequences(sh))
            if len(held_seqs) >= cfg.eval_seqs:
                break
        held_seqs = held_seqs[:cfg.eval_seqs]

    def checkpoint(final: bool = False):
        _atomic_save({"pdm": pdm.state_dict(), "opt": opt.state_dict(), "step": step, "seen": seen, "shard": shard_i,
                      "seq": seq_i, "history": history, "rng": rng.getstate(), "budget": budget, "d2t": d2t,
                      "vocab_info": vocab_info, "cfg": asdict(cfg), "elapsed": elapsed, "epoch": epoch}, ckpt_path)
        export(pdm, out / "pdm", cfg, vocab_info, history, seen, cache)
        if final:
            log.info("final checkpoint at %d tokens", seen)

    def do_eval():
        if not held_seqs:
            return {}
        t0 = time.perf_counter()
        r = evaluate(pdm, held_seqs, split, s0, t2d, cols)
        r1 = evaluate(pdm, held_seqs, split, s0, t2d, cols, fill=1)  # the first draft after a reseed
        history.append({"step": step, "seen": seen, "heldout_loss": r["loss"], "heldout_p": r["p"],
                        "heldout_p_a1": r1["p"], "heldout_loss_a1": r1["loss"],
                        "elapsed_s": round(elapsed, 1), "eval_s": round(time.perf_counter() - t0, 1)})
        with open(out / "history.jsonl", "a") as f:
            f.write(json.dumps(history[-1]) + "\n")
        return r

    if not history:
        r = do_eval()
        log.info("held-out at 0 tokens: %s", r)
    bar = tqdm(total=budget, initial=seen, unit="tok", disable=not cfg.progress, dynamic_ncols=True, mininterval=5)
    ema_loss = ema_p = None
    last_eval = last_ckpt = time.perf_counter()
    t_run = time.perf_counter()
    acc_rows, acc_loss, acc_hits = 0, 0.0, 0
    opt.zero_grad(set_to_none=True)
    pdm.train()
    autocast = torch.autocast(torch.device(cfg.device).type, dtype=getattr(torch, cfg.amp), enabled=cfg.amp != "float32")
    done = False
    while not done:
        shards = cache.shards()
        if shard_i >= len(shards):
            if epoch + 1 < cfg.epochs and shards:
                epoch, shard_i, seq_i = epoch + 1, 0, 0
                continue
            if cfg.wait and seen < budget:
                time.sleep(30)
                continue
            break
        seqs = cache.sequences(shards[shard_i])
        order = list(range(len(seqs)))
        random.Random(cfg.seed * 1000003 + shard_i + 7919 * epoch).shuffle(order)
        while seq_i < len(order):
            seq = seqs[order[seq_i]]
            seq_i += 1
            a = sample_fill(cfg.n, rng, cfg.p_full, cfg.fill)
            with autocast:
                kl, rows, hits = sequence_loss(pdm, seq, split, a, s0, t2d, cols)
            if kl is None:
                continue
            (kl / cfg.batch_tokens).backward()
            acc_rows, acc_loss, acc_hits = acc_rows + rows, acc_loss + kl.item(), acc_hits + hits
            seen += rows
            bar.update(rows)
            if acc_rows >= cfg.batch_tokens:
                frac = min(1.0, (step + 1) / max(cfg.warmup, 1)) * max(0.0, 1.0 - seen / max(budget, 1))
                for g in opt.param_groups:
                    g["lr"] = cfg.lr * frac
                torch.nn.utils.clip_grad_norm_(pdm.parameters(), 1.0)
                opt.step()
                opt.zero_grad(set_to_none=True)
                step += 1
                l, p = acc_loss / acc_rows, acc_hits / acc_rows
                ema_loss = l if ema_loss is None else 0.9 * ema_loss + 0.1 * l
                ema_p = p if ema_p is None else 0.9 * ema_p + 0.1 * p
                acc_rows, acc_loss, acc_hits = 0, 0.0, 0
                now = time.perf_counter()
                elapsed_now = elapsed + now - t_run
                post = {"loss": f"{ema_loss:.3f}", "p_train": f"{ema_p:.3f}"}
                if history:
                    post["p_heldout"] = f"{history[-1]['heldout_p']:.3f}"
                bar.set_postfix(post, refresh=False)
                if now - last_eval >= cfg.eval_every_s:
                    elapsed, t_run = elapsed_now, now
                    r = do_eval()
                    log.info("step %d, %d tokens: held-out loss %.4f p %.4f", step, seen, r["loss"], r["p"])
                    last_eval = time.perf_counter()
                if now - last_ckpt >= cfg.ckpt_every_s:
                    elapsed, t_run = elapsed + time.perf_counter() - t_run, time.perf_counter()
                    checkpoint()
                    last_ckpt = time.perf_counter()
                if seen >= budget or (cfg.max_steps and step >= cfg.max_steps) or \
                        (cfg.max_seconds and elapsed + time.perf_counter() - t_run >= cfg.max_seconds):
                    done = True
                    break
        if not done:
            shard_i, seq_i = shard_i + 1, 0
    bar.close()
    elapsed += time.perf_counter() - t_run
    if not history or history[-1]["seen"] != seen:
        do_eval()
    checkpoint(final=True)
    return pdm.eval()


def export(pdm: PDM, path: Path, cfg: TrainConfig, vocab_info: dict, history: list, seen: int, cache: TeacherCache):
    """Write the inference checkpoint (PDM.save: fp16 safetensors + config.json with provenance)."""
    if pdm.d2t.device.type != "cpu":
        import copy

        pdm = copy.deepcopy(pdm).cpu()
    pdm.config.trained_n, pdm.config.schedule = cfg.n, cfg.schedule
    last = history[-1] if history else {}
    pdm.config.notes = {
        **cfg.notes,
        "data": {"cache": str(cache.root), **{k: v for k, v in cache.meta.items() if k != "layers"}},
        "tokens_seen": seen, "vocab": vocab_info, "lr": cfg.lr, "batch_tokens": cfg.batch_tokens,
        "heldout_p": last.get("heldout_p"), "heldout_loss": last.get("heldout_loss"),
        "heldout_fill": cfg.n, "curve": [(h["seen"], round(h["heldout_p"], 4)) for h in history],
    }
    pdm.save(Path(path))

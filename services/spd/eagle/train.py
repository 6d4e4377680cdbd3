"""EAGLE-3-style draft training with training-time test (TTT) over the teacher cache.

Step 1 runs the draft over the target features of every position i (input (f_i, x_{i+1}),
predicting x_{i+2}). Step j >= 2 feeds each position the draft's own step-(j-1) hidden output at
position i-1, as inference does for the j-th draft of a chain starting at t = i-j+1; its query sees
the step-1 keys at positions <= t and the diagonal keys of steps 2..j of its own chain (exactly the
draft's KV cache at that point of inference). Loss at every step: KL(teacher || draft) of the token
that step predicts, restricted to the draft vocabulary (as spd.train.trainer.sequence_loss), on
assistant positions whose teacher argmax is in the draft vocabulary. Budget = loss positions seen
at step 1, like the PDM trainer.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from spd.eagle.model import EagleDraft, default_feature_layers, random_eagle
from spd.train.teacher import TeacherCache
from spd.train.trainer import (
    _atomic_save,
    _resolve_cache,
    choose_vocab,
    target_to_draft,
    teacher_kl,
)

log = logging.getLogger(__name__)


@dataclass
class EagleTrainConfig:
    model: str | None = None  # target model dir (None = default SmolLM2-135M-Instruct)
    feature_layers: list[int] | None = None  # low/mid/high target layers; None = default_feature_layers
    ttt: int = 4  # TTT unroll steps s
    tokens: int = 0  # budget in step-1 loss positions; 0 = one pass over the cache
    lr: float = 1.5e-3  # peak learning rate
    warmup: int = 20  # optimizer steps of linear warm-up (then linear decay to 0 at the budget)
    weight_decay: float = 0.01  # AdamW weight decay
    batch_tokens: int = 1024  # step-1 loss positions per optimizer step
    vocab: int = 16384  # V_s
    data: str = "selfgen-train"  # teacher cache name (or path)
    heldout: str = "selfgen-heldout"  # held-out teacher cache name (or path); "" = none
    eval_seqs: int = 24  # held-out sequences per evaluation
    eval_every_s: float = 600.0  # seconds between held-out evaluations
    ckpt_every_s: float = 300.0  # seconds between checkpoints
    out: str = "runs/eagle3"  # run directory: ckpt.pt, history.jsonl, draft/
    resume: bool = False  # continue from out/ckpt.pt
    seed: int = 0  # init and data order
    threads: int = 1  # torch threads
    init_head: bool = True  # head rows from the target's LM head
    epochs: int = 1  # passes over the cache
    max_steps: int = 0  # stop after this many optimizer steps (tests); 0 = budget
    max_seconds: float = 0.0  # stop (checkpointed, resumable) after this wall time; 0 = none
    progress: bool = True  # tqdm bar
    device: str = "cpu"  # torch device of the draft
    notes: dict = field(default_factory=dict)  # extra provenance


class _StepCache:
    """Keys/values of the TTT steps run so far, concatenated along the key axis (autograd-safe)."""

    def __init__(self):
        self.k = self.v = None  # [1, H_kv, j*T, D]

    def update(self, k, v, layer_idx, *args, **kwargs):
        self.k = k if self.k is None else torch.cat([self.k, k], dim=2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=2)
        return self.k, self.v


def ttt_mask(T: int, j: int, device=None) -> torch.Tensor:
    """bool [1, 1, T, j*T]: query (step j, position i), chain start t = i-j+1, sees step-1 keys at
    positions <= t and key (step j', position t+j'-1) for j' = 2..j (its own key included, so no row
    is empty even where t < 0)."""
    i = torch.arange(T, device=device).unsqueeze(1)  # [T, 1]
    p = torch.arange(T, device=device).unsqueeze(0)  # [1, T]
    t = i - j + 1
    blocks = [p <= t] + [p == t + jj - 1 for jj in range(2, j + 1)]
    return torch.cat(blocks, dim=1)[None, None]


def ttt_hidden(draft: EagleDraft, states: torch.Tensor, tokens: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """states: [T, 3, d] target features; tokens: [T]. Returns per step the own hidden [T-1, d] of
    draft positions 0..T-2 (position i predicts x_{i+2}; rows i < j-1 of step j are meaningless)."""
    T1 = tokens.shape[0] - 1
    feature = draft.fuse_states(states[:T1])  # [T1, d]
    nxt = tokens[1:]  # [T1] x_{i+1}
    pos = torch.arange(T1, device=feature.device)
    cache, out = _StepCache(), []
    for j in range(1, steps + 1):
        h = draft.hidden(feature, nxt, pos, ttt_mask(T1, j, feature.device), cache)  # [T1, d]
        out.append(h)
        feature = torch.cat([h[:1], h[:-1]], dim=0)  # step j+1 at i takes h_j[i-1] (row 0: filler)
    return out


def _prepare(seq: dict, cols: list[int], t2d: torch.Tensor, dev) -> tuple:
    states = seq["anchors"][:, cols].to(dev).float()  # [T, 3, d]
    tokens = seq["tokens"].to(dev).long()  # [T]
    ids = t2d.to(dev)[seq["top_ids"].to(dev).long()]  # [T, k] draft ids, -1 outside
    return states, tokens, ids


def sequence_ttt_loss(draft: EagleDraft, seq: dict, cols: list[int], t2d: torch.Tensor, steps: int):
    """(kl summed over steps and rows, step-1 rows, step-1 hits) for one sequence; (None, 0, 0) if empty."""
    dev = draft.d2t.device
    states, tokens, ids = _prepare(seq, cols, t2d, dev)
    valid = (seq["loss"].to(dev).bool() & (ids[:, 0] >= 0))[1:]  # [T-1] draft position i -> teacher row i+1
    rows = valid.nonzero()[:, 0]
    if len(rows) == 0:
        return None, 0, 0
    top_p = seq["top_p"].to(dev)
    kl, hits = 0.0, 0
    for j, h in enumerate(ttt_hidden(draft, states, tokens, steps), start=1):
        i = rows[rows >= j - 1]
        if len(i) == 0:
            continue
        logits = draft.logits(h[i])  # [R, V_s]
        kl = kl + teacher_kl(logits, ids[i + 1], top_p[i + 1])
        if j == 1:
            hits = int((logits.argmax(-1) == ids[i + 1, 0]).sum())
    return kl, len(rows), hits


@torch.no_grad()
def evaluate(draft: EagleDraft, seqs: list[dict], cols: list[int], t2d: torch.Tensor, steps: int) -> dict:
    """Held-out top-1 agreement with the teacher per TTT step over ALL assistant positions (teacher
    argmax outside the draft vocabulary = miss), and the KL over the in-vocabulary ones."""
    was = draft.training
    draft.eval()
    hits, total, kl, kl_rows = [0] * steps, [0] * steps, [0.0] * steps, [0] * steps
    dev = draft.d2t.device
    for seq in seqs:
        states, tokens, ids = _prepare(seq, cols, t2d, dev)
        lrows = seq["loss"].to(dev).bool()[1:].nonzero()[:, 0]
        if len(lrows) == 0:
            continue
        for j, h in enumerate(ttt_hidden(draft, states, tokens, steps)):
            i = lrows[lrows >= j]
            logits = draft.logits(h[i])
            top = seq["top_ids"].to(dev)[i + 1, 0].long()
            hits[j] += int((draft.d2t[logits.argmax(-1)] == top).sum())
            total[j] += len(i)
            ok = ids[i + 1, 0] >= 0
            if ok.any():
                kl[j] += float(teacher_kl(logits[ok], ids[i + 1][ok], seq["top_p"].to(dev)[i + 1][ok]))
                kl_rows[j] += int(ok.sum())
    draft.train(was)
    return {"p": [h / max(t, 1) for h, t in zip(hits, total)],
            "loss": [k / max(r, 1) for k, r in zip(kl, kl_rows)], "tokens": total[0]}


def make_draft(cfg: EagleTrainConfig, model_dir: Path, config, d2t: torch.Tensor) -> EagleDraft:
    from spd.core.stage import load_embedding, load_stage

    L = config.num_hidden_layers
    lm_head = load_stage(model_dir, config, range(L - 1, L), ()).lm_head.weight.detach() if cfg.init_head else None
    embed = load_embedding(model_dir, config).weight.detach()
    return random_eagle(config, cfg.feature_layers or default_feature_layers(L), draft_ids=d2t,
                        lm_head_weight=lm_head, embed_weight=embed, seed=cfg.seed)


def _held_sequences(held: TeacherCache | None, n: int) -> list[dict]:
    seqs = []
    for sh in (held.shards() if held is not None else []):
        seqs.extend(held.sequences(sh))
        if len(seqs) >= n:
            break
    return seqs[:n]


class _Run:
    """Mutable training state that goes into the checkpoint."""

    def __init__(self):
        self.step = self.seen = self.shard = self.seq = self.epoch = 0
        self.history: list[dict] = []
        self.elapsed = 0.0


def train(cfg: EagleTrainConfig) -> EagleDraft:
    from tqdm import tqdm

    from spd.models.loading import load_config, resolve_model

    torch.set_num_threads(cfg.threads)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    model_dir = resolve_model(cfg.model)
    config = load_config(model_dir)
    cache = _resolve_cache(model_dir, cfg.data)
    held = _resolve_cache(model_dir, cfg.heldout) if cfg.heldout else None
    ckpt_path, run = out / "ckpt.pt", _Run()
    state = torch.load(ckpt_path, weights_only=False) if cfg.resume and ckpt_path.exists() else None
    if state is not None:
        d2t, vocab_info = state["d2t"], state["vocab_info"]
        for k in ("feature_layers", "ttt", "vocab", "data"):
            if state["cfg"][k] != getattr(cfg, k):
                raise ValueError(f"--resume with a different {k}: checkpoint {state['cfg'][k]!r}, now {getattr(cfg, k)!r}")
    else:
        d2t, vocab_info = choose_vocab(cfg, model_dir, config, cache, held)
        log.info("vocab: %s", vocab_info)
    draft = make_draft(cfg, model_dir, config, d2t).to(cfg.device)
    cols = [cache.layers.index(b) for b in draft.config.feature_layers]
    t2d = target_to_draft(d2t, config.vocab_size)
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    budget = cfg.tokens or int(cache.progress().get("loss_tokens", 0)) * cfg.epochs
    if state is not None:
        draft.load_state_dict(state["draft"])
        opt.load_state_dict(state["opt"])
        run.__dict__.update(state["run"])
        log.info("resuming from %s at step %d (%d tokens)", ckpt_path, run.step, run.seen)
    held_seqs = _held_sequences(held, cfg.eval_seqs)

    def checkpoint():
        _atomic_save({"draft": draft.state_dict(), "opt": opt.state_dict(), "run": dict(run.__dict__), "d2t": d2t,
                      "vocab_info": vocab_info, "cfg": asdict(cfg)}, ckpt_path)
        export(draft, out / "draft", cfg, vocab_info, run, cache)

    def do_eval():
        if not held_seqs:
            return {}
        t0 = time.perf_counter()
        r = evaluate(draft, held_seqs, cols, t2d, cfg.ttt)
        run.history.append({"step": run.step, "seen": run.seen, "heldout_p": r["p"], "heldout_loss": r["loss"],
                            "elapsed_s": round(run.elapsed, 1), "eval_s": round(time.perf_counter() - t0, 1)})
        with open(out / "history.jsonl", "a") as f:
            f.write(json.dumps(run.history[-1]) + "\n")
        log.info("step %d, %d tokens: held-out p per step %s", run.step, run.seen, [round(p, 4) for p in r["p"]])
        return r

    if not run.history:
        do_eval()
    bar = tqdm(total=budget, initial=run.seen, unit="tok", disable=not cfg.progress, dynamic_ncols=True, mininterval=5)
    last_eval = last_ckpt = t_run = time.perf_counter()
    acc = [0, 0.0, 0]  # rows, kl, hits since the last optimizer step
    ema = None
    opt.zero_grad(set_to_none=True)
    draft.train()
    done = False
    while not done:
        shards = cache.shards()
        if run.shard >= len(shards):
            if run.epoch + 1 < cfg.epochs and shards:
                run.epoch, run.shard, run.seq = run.epoch + 1, 0, 0
                continue
            break
        seqs = cache.sequences(shards[run.shard])
        order = torch.randperm(len(seqs), generator=torch.Generator().manual_seed(
            cfg.seed * 1000003 + run.shard + 7919 * run.epoch)).tolist()
        while run.seq < len(order):
            seq = seqs[order[run.seq]]
            run.seq += 1
            kl, rows, hits = sequence_ttt_loss(draft, seq, cols, t2d, cfg.ttt)
            if kl is None:
                continue
            (kl / cfg.batch_tokens).backward()
            acc = [acc[0] + rows, acc[1] + kl.item(), acc[2] + hits]
            run.seen += rows
            bar.update(rows)
            if acc[0] < cfg.batch_tokens:
                continue
            frac = min(1.0, (run.step + 1) / max(cfg.warmup, 1)) * max(0.0, 1.0 - run.seen / max(budget, 1))
            for g in opt.param_groups:
                g["lr"] = cfg.lr * frac
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            run.step += 1
            ema = (acc[1] / acc[0]) if ema is None else 0.9 * ema + 0.1 * acc[1] / acc[0]
            bar.set_postfix({"loss": f"{ema:.3f}", "p1_train": f"{acc[2] / acc[0]:.3f}"}, refresh=False)
            now = time.perf_counter()
            run.elapsed, t_run = run.elapsed + now - t_run, now
            if run.step % 5 == 0 or run.step == 1:
                log.info("step %d: %d/%d tokens, %.1f tok/s, loss %.4f (ema %.4f), p1_train %.3f", run.step, run.seen,
                         budget, run.seen / max(run.elapsed, 1e-9), acc[1] / acc[0], ema, acc[2] / acc[0])
            acc = [0, 0.0, 0]
            if now - last_eval >= cfg.eval_every_s:
                do_eval()
                last_eval = time.perf_counter()
            if now - last_ckpt >= cfg.ckpt_every_s:
                checkpoint()
                last_ckpt = time.perf_counter()
                log.info("checkpoint at step %d (%d tokens)", run.step, run.seen)
            if run.seen >= budget or (cfg.max_steps and run.step >= cfg.max_steps) or \
                    (cfg.max_seconds and run.elapsed >= cfg.max_seconds):
                done = True
                break
        if not done:
            run.shard, run.seq = run.shard + 1, 0
    bar.close()
    run.elapsed += time.perf_counter() - t_run
    if not run.history or run.history[-1]["seen"] != run.seen:
        do_eval()
    checkpoint()
    log.info("done: %d tokens in %.0f s", run.seen, run.elapsed)
    return draft.eval()


def export(draft: EagleDraft, path: Path, cfg: EagleTrainConfig, vocab_info: dict, run: _Run, cache: TeacherCache):
    """Write the inference draft (EagleDraft.save: fp16 safetensors + config.json with provenance)."""
    last = run.history[-1] if run.history else {}
    draft.config.ttt_steps, draft.config.trained_tokens = cfg.ttt, run.seen
    draft.config.notes = {
        **cfg.notes, "data": {"cache": str(cache.root), **{k: v for k, v in cache.meta.items() if k != "layers"}},
        "vocab": vocab_info, "lr": cfg.lr, "batch_tokens": cfg.batch_tokens, "steps": run.step,
        "heldout_p_per_step": last.get("heldout_p"), "heldout_loss_per_step": last.get("heldout_loss"),
        "curve": [(h["seen"], h["heldout_p"]) for h in run.history],
    }
    draft.save(Path(path))

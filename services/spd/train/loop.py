"""The one training loop behind `spd train`: data order, AdamW, the learning-rate schedule, gradient
accumulation, held-out evaluation, checkpoint + resume. What is trained plugs in as a `Student`
(the PDM, spd.train.trainer; the EAGLE-3-style draft, spd.eagle.train).

One optimizer step accumulates `batch_tokens` loss positions; rows of the sequence that crosses the
boundary count towards the next step, so step k has seen k * batch_tokens positions (± one
sequence) and the step-based schedule (linear warm-up, then linear decay to 0 at the budget,
transformers' get_linear_schedule_with_warmup) ends where the token budget does. A sequence's rows
are counted before its forward (`Student.rows`), so the sequences of a step reach the student in
one `loss` call when the step is due (the PDM packs them into one forward): the same gradient and
the same accounting as one sequence at a time. AdamW runs fused (one kernel per step).

A checkpoint (OUT/ckpt.pt) holds the student's weights under its `name`, the optimizer state, the
run counters (RunState) at the top level, the student's own extra state, and the config; resuming
continues at the same shard and sequence of the same order. Under torchrun each rank reads its own
shards and the ranks step together (spd.train.ranks); rank 0 evaluates and writes.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol

import torch

from spd.config import LoopConfig
from spd.train.ranks import Ranks

log = logging.getLogger(__name__)


@dataclass
class RunState:
    """The counters a checkpoint resumes from."""

    step: int = 0  # optimizer steps taken
    seen: int = 0  # loss positions trained on
    shard: int = 0  # current shard among this rank's shards of the cache
    seq: int = 0  # next index into that shard's shuffled order
    epoch: int = 0  # pass over the cache
    elapsed: float = 0.0  # training wall time so far (s), evaluations included
    history: list[dict] = field(default_factory=list)  # held-out evaluations, also in history.jsonl


class Student(Protocol):
    """What the loop trains."""

    name: str  # checkpoint key of the weights and folder of the export ("pdm", "draft")

    @property
    def module(self) -> torch.nn.Module:
        """The trained parameters."""
        ...

    def rows(self, seq: dict) -> int:
        """The loss rows the sequence contributes (known before its forward)."""
        ...

    def loss(self, seqs: list[dict]) -> tuple[torch.Tensor | None, int, int]:
        """(KL summed over the sequences' loss rows, rows, top-1 hits), in one go (a student may batch
        them); (None, 0, 0) if they have none."""
        ...

    def evaluate(self, seqs: list[dict]) -> dict:
        """Held-out figures for the history entry (at least heldout_p and heldout_loss)."""
        ...

    def export(self, path: Path, run: RunState) -> None:
        """Write the inference checkpoint with its provenance."""
        ...

    def extra_state(self) -> dict:
        """Student state beyond the weights that a resume needs (e.g. its fill-level RNG)."""
        ...

    def load_extra_state(self, state: dict) -> None:
        ...


def shard_order(n: int, seed: int, shard: int, epoch: int) -> list[int]:
    """The shuffled order of a shard's n sequences: the same for every student and across resumes."""
    order = list(range(n))
    random.Random(seed * 1000003 + shard + 7919 * epoch).shuffle(order)
    return order


def load_checkpoint(cfg: LoopConfig, same: tuple[str, ...]) -> dict | None:
    """OUT/ckpt.pt when resuming (None otherwise); ValueError if it was trained with a different
    value of any config field named in `same`."""
    path = Path(cfg.out) / "ckpt.pt"
    if not (cfg.resume and path.exists()):
        return None
    state = torch.load(path, weights_only=False)
    for k in same:
        if state["cfg"].get(k) != getattr(cfg, k):
            raise ValueError(f"--resume with a different {k}: checkpoint {state['cfg'].get(k)!r}, now {getattr(cfg, k)!r}")
    return state


def held_sequences(held, n: int) -> list[dict]:
    """The first n sequences of a held-out cache (none without one)."""
    seqs: list[dict] = []
    for sh in (held.shards() if held is not None else []):
        seqs.extend(held.sequences(sh))
        if len(seqs) >= n:
            break
    return seqs[:n]


def resolve_cache(model_dir: Path, name: str, device: str = "cpu"):
    """A teacher cache directory, or a self-generated id directory (part_*.npz) read with online
    teacher features."""
    from spd.train.teacher import TeacherCache, teacher_dir

    path = Path(name) if "/" in name else teacher_dir(model_dir, name)
    if any(path.glob("part_*.npz")):
        from spd.models.loading import load_tokenizer
        from spd.train.online import OnlineCache

        return OnlineCache(path, model_dir, load_tokenizer(model_dir), device=device)
    return TeacherCache(path)


@dataclass
class Setup:
    """What a run starts from, the same for every student."""

    model_dir: Path  # the target model
    config: Any  # its HF config
    cache: Any  # training data (TeacherCache, or OnlineCache over self-generated ids)
    held_seqs: list[dict]  # held-out sequences evaluated on
    state: dict | None  # the checkpoint resumed from
    d2t: torch.Tensor  # [V_s] draft vocabulary: draft id -> target id
    vocab_info: dict  # its size and coverage


def setup(cfg: LoopConfig, same: tuple[str, ...], d2t: torch.Tensor | None = None) -> Setup:
    """Threads, run directory, target, caches, the checkpoint (if resuming: see load_checkpoint) and
    the draft vocabulary (the checkpoint's, else `d2t` (a warm start's), else chosen from the data)."""
    from spd.models.loading import load_config, resolve_model
    from spd.train.vocab import choose_vocab

    torch.set_num_threads(cfg.threads)
    Path(cfg.out).mkdir(parents=True, exist_ok=True)
    model_dir = resolve_model(cfg.model)
    config = load_config(model_dir)
    cache = resolve_cache(model_dir, cfg.data, cfg.device)
    held = resolve_cache(model_dir, cfg.heldout, cfg.device) if cfg.heldout else None
    if held is not None and hasattr(cache, "teacher") and hasattr(held, "teacher"):
        held._teacher = cache.teacher  # one target in memory
    state = load_checkpoint(cfg, same)
    if state is not None:
        d2t, vocab_info = state["d2t"], state["vocab_info"]
    elif d2t is not None:
        vocab_info = {"V_s": len(d2t), "from": cfg.init_from}
    else:
        d2t, vocab_info = choose_vocab(cfg.vocab, model_dir, config, cache, held)
        log.info("vocab: %s", vocab_info)
    return Setup(model_dir, config, cache, held_sequences(held, cfg.eval_seqs), state, d2t, vocab_info)


def _atomic_save(obj, path: Path) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


class _Loop:
    def __init__(self, cfg: LoopConfig, student: Student, s: Setup):
        from transformers import get_linear_schedule_with_warmup

        self.cfg, self.student, self.cache, self.held_seqs = cfg, student, s.cache, s.held_seqs
        self.saved = {"d2t": s.d2t, "vocab_info": s.vocab_info}  # what rebuilds the student's vocabulary
        state = s.state
        self.out = Path(cfg.out)
        self.ranks = Ranks(cfg.device)
        self.params = [p for p in student.module.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(self.params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay,
                                     fused=torch.device(cfg.device).type in ("cpu", "cuda"))  # one kernel per step
        self.budget = cfg.tokens or int(self.cache.progress().get("loss_tokens", 0)) * cfg.epochs
        self.run = RunState()
        if state is not None:
            student.module.load_state_dict(state[student.name])
            self.opt.load_state_dict(state["opt"])
            self.run = RunState(**{f.name: state[f.name] for f in fields(RunState) if f.name in state})
            own = state.get("ranks", [{}])
            if len(own) != self.ranks.world:
                raise ValueError(f"--resume with {self.ranks.world} ranks: the checkpoint was written by {len(own)}")
            self.run.shard, self.run.seq, self.run.epoch = (own[self.ranks.rank].get(k, getattr(self.run, k))
                                                            for k in ("shard", "seq", "epoch"))
            student.load_extra_state({**state, **own[self.ranks.rank]})
            log.info("resuming from %s at step %d (%d tokens)", self.out / "ckpt.pt", self.run.step, self.run.seen)
        for g in self.opt.param_groups:
            g["initial_lr"] = cfg.lr
        total = max(math.ceil(self.budget / cfg.batch_tokens), cfg.warmup + 1)
        # the schedule is a function of the step alone: rebuilt at the resumed step, never saved
        self.sched = get_linear_schedule_with_warmup(self.opt, cfg.warmup, total, last_epoch=self.run.step - 1)

    def checkpoint(self) -> None:
        """On every rank (it gathers each rank's data position); rank 0 writes."""
        run = self.run
        own = self.ranks.gather({"shard": run.shard, "seq": run.seq, "epoch": run.epoch, **self.student.extra_state()})
        if not self.ranks.main:
            return
        _atomic_save({self.student.name: self.student.module.state_dict(), "opt": self.opt.state_dict(),
                      **asdict(self.run), **own[0], "ranks": own, **self.saved, "budget": self.budget,
                      "cfg": asdict(self.cfg)}, self.out / "ckpt.pt")
        self.student.export(self.out / self.student.name, self.run)
        log.info("checkpoint at step %d (%d tokens)", self.run.step, self.run.seen)

    def evaluate(self) -> None:
        if not self.held_seqs or not self.ranks.main:
            return
        t0 = time.perf_counter()
        r = self.student.evaluate(self.held_seqs)
        self.run.history.append({"step": self.run.step, "seen": self.run.seen, **r, "elapsed_s": round(self.run.elapsed, 1),
                                 "eval_s": round(time.perf_counter() - t0, 1)})
        with open(self.out / "history.jsonl", "a") as f:
            f.write(json.dumps(self.run.history[-1]) + "\n")
        log.info("[eval] step %d, %d tokens: held-out loss %s p %s", self.run.step, self.run.seen,
                 _round(r["heldout_loss"]), _round(r["heldout_p"]))

    def sequences(self):
        """(sequence) in training order until the cache (or the budget's wait) runs out."""
        cfg, run = self.cfg, self.run
        while True:
            shards = self.ranks.mine(self.cache.shards())
            if run.shard >= len(shards):
                if run.epoch + 1 < cfg.epochs and shards:
                    run.epoch, run.shard, run.seq = run.epoch + 1, 0, 0
                    continue
                if cfg.wait and run.seen < self.budget:
                    time.sleep(30)  # the cache is still being generated by another process
                    continue
                return
            seqs = self.cache.sequences(shards[run.shard])
            order = shard_order(len(seqs), cfg.seed, run.shard * self.ranks.world + self.ranks.rank, run.epoch)
            while run.seq < len(order):
                run.seq += 1
                yield seqs[order[run.seq - 1]]
            run.shard, run.seq = run.shard + 1, 0

    def out_of_time(self, t_run: float) -> bool:
        return bool(self.cfg.max_seconds and self.run.elapsed + time.perf_counter() - t_run >= self.cfg.max_seconds)

    def train(self) -> None:
        from tqdm import tqdm

        cfg, run = self.cfg, self.run
        if not run.history:
            self.evaluate()
        bar = tqdm(total=self.budget, initial=run.seen, unit="tok", disable=not (cfg.progress and self.ranks.main), dynamic_ncols=True,
                   mininterval=5)
        autocast = torch.autocast(torch.device(cfg.device).type, dtype=getattr(torch, cfg.amp),
                                  enabled=cfg.amp != "float32")
        last_eval = last_ckpt = t_run = time.perf_counter()
        pending = 0  # loss rows not yet stepped on (may run past batch_tokens by one sequence)
        rows_s, kl_s, hits_s = 0, 0.0, 0  # since the last optimizer step, for the logs
        self.student.module.train()
        self.opt.zero_grad(set_to_none=True)
        sequences = self.sequences()
        step_seqs: list[dict] = []  # this rank's sequences of the coming step: one loss call when it is due
        while True:
            seq = next(sequences, None)
            rows, (exhausted,) = self.ranks.agree(self.student.rows(seq) if seq is not None else 0,
                                                  seq is None)  # rows over all ranks; stop when any rank runs out
            if exhausted:
                break
            assert seq is not None  # (else exhausted)
            step_seqs.append(seq)
            pending, rows_s, run.seen = pending + rows, rows_s + rows, run.seen + rows
            bar.update(rows)
            if pending < cfg.batch_tokens:
                continue
            pending -= cfg.batch_tokens
            with autocast:
                kl, _, hits = self.student.loss(step_seqs)
            step_seqs = []
            if kl is not None:
                (kl / cfg.batch_tokens).backward()
                kl_s, hits_s = kl_s + kl.item(), hits_s + hits
            self.ranks.sum_grads(self.params)
            torch.nn.utils.clip_grad_norm_(self.params, 1.0)
            self.opt.step()
            self.sched.step()
            self.opt.zero_grad(set_to_none=True)
            run.step += 1
            bar.set_postfix({"loss": f"{kl_s / rows_s:.3f}", "p_train": f"{hits_s / rows_s:.3f}"}, refresh=False)
            if self.ranks.main and (run.step % 20 == 0 or run.step == 1):  # kl, hits: rank 0's rows
                log.info("step %d: %d/%d tokens, loss %.4f, p_train %.3f, lr %.2e", run.step, run.seen, self.budget,
                         kl_s * self.ranks.world / rows_s, hits_s * self.ranks.world / rows_s, self.sched.get_last_lr()[0])
            rows_s, kl_s, hits_s = 0, 0.0, 0
            now = time.perf_counter()
            run.elapsed, t_run = run.elapsed + now - t_run, now
            if self.ranks.main and now - last_eval >= cfg.eval_every_s:
                self.evaluate()
                last_eval = time.perf_counter()
            _, (save, late) = self.ranks.agree(0, self.ranks.main and now - last_ckpt >= cfg.ckpt_every_s,
                                               self.ranks.main and self.out_of_time(t_run))  # rank 0's clock decides
            if save:
                self.checkpoint()
                last_ckpt = time.perf_counter()
            if run.seen >= self.budget or (cfg.max_steps and run.step >= cfg.max_steps) or late:
                break
        bar.close()
        run.elapsed += time.perf_counter() - t_run
        if not run.history or run.history[-1]["seen"] != run.seen:
            self.evaluate()
        self.checkpoint()
        log.info("done: %d tokens in %d steps, %.0f s", run.seen, run.step, run.elapsed)


def _round(x: Any):
    return [round(v, 4) for v in x] if isinstance(x, list) else round(x, 4)


def train_student(cfg: LoopConfig, student: Student, s: Setup) -> RunState:
    """Train `student` on the set-up data under `cfg`, resuming from the set-up checkpoint if any.
    Returns the final counters and history."""
    loop = _Loop(cfg, student, s)
    loop.train()
    student.module.eval()
    return loop.run

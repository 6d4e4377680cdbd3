"""The one training loop behind `spd train`: data order, AdamW, the learning-rate schedule, gradient
accumulation, held-out evaluation, checkpoint + resume. What is trained plugs in as a `Student`
(the PDM, spd.train.trainer; the EAGLE-3-style draft, spd.eagle.train).

One optimizer step accumulates `batch_tokens` loss positions; rows of the sequence that crosses the
boundary count towards the next step, so step k has seen k * batch_tokens positions (± one
sequence) and the step-based schedule (linear warm-up, then linear decay to 0 at the budget,
transformers' get_linear_schedule_with_warmup) ends where the token budget does. A sequence's rows
are counted before its forward (`Student.rows`), so the sequences of a step reach the student in
one `loss` call when the step is due (the PDM packs them into one forward): the same gradient and
the same accounting as one sequence at a time. AdamW runs fused (one kernel per step). With
--fit-seconds the budget is fitted to a time instead (a short GPU lease): the pace is measured from
the end of the first step (a cold start is not the pace: on the H200 the first step took ~12 s,
later ones ~2 s) over a tenth of that time, the budget shrinks to what that pace reaches in the time
left, and the schedule is rebuilt to end there (a resumed run fits again).

Several students train in one run (`train_plans`; `spd train --with`): one pass over the data (the
shards, their shuffled order, the epochs, --wait: `_stream`; for self-generated ids one teacher
pass per part, with the union of the students' teacher layers) feeds every student's `_Loop` the
same sequences in the same order, and each has its own optimizer, schedule, budget, batch size,
evaluations, checkpoint and export in its own run directory. Each student steps exactly as it
would alone on that data. The data flags, the order's seed and the clock are shared
(spd.config.SHARED); a student that reaches its budget or step limit finishes while the others
go on.

A checkpoint (OUT/ckpt.pt) holds the student's weights under its `name`, the optimizer state, the
run counters (RunState) at the top level, the student's own extra state, and the config. Its
counters and data position are those of the student's last optimizer step (the rows carried
towards the next one included), so resuming feeds it again the sequences counted since and
continues exactly as an uninterrupted run; at the data's end the rows after the last step are
dropped. Every student's checkpoint is written at the same moment, and a resumed run starts where
the student furthest behind stopped, the others skipping what they have trained on. Under
torchrun each rank reads its own shards and the ranks step together, per student
(spd.train.ranks); rank 0 evaluates and writes.

Beside it, OUT/ckpt-slim.pt is the same checkpoint with the weights in bf16 and no optimizer state:
a sixth of the size, small enough to commit, so a long run can go on on another machine (`--resume`
reads it where OUT/ckpt.pt is absent; AdamW's moments then start anew, the counters, data position
and schedule go on).
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
from typing import Any, Callable, Iterable, Protocol

import torch

from spd.config import SHARED, LoopConfig
from spd.train.precision import resolve_dtype
from spd.train.ranks import Ranks
from spd.train.memory import keep_freed_memory

log = logging.getLogger(__name__)


@dataclass
class RunState:
    """The counters a checkpoint resumes from."""

    step: int = 0  # optimizer steps taken
    seen: int = 0  # loss positions trained on
    shard: int = 0  # current shard among this rank's shards of the cache
    seq: int = 0  # next index into that shard's shuffled order
    epoch: int = 0  # pass over the cache
    pending: int = 0  # loss rows counted towards the next optimizer step (past batch_tokens at the last)
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
    """OUT/ckpt.pt (else OUT/ckpt-slim.pt) when resuming (None otherwise); ValueError if it was
    trained with a different value of any config field named in `same`."""
    path = next((p for p in (Path(cfg.out) / n for n in ("ckpt.pt", "ckpt-slim.pt")) if p.exists()), None)
    if not cfg.resume or path is None:
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


def resolve_cache(model_dir: Path, name: str, device: str = "cpu", layers: Iterable[int] = ()):
    """A teacher cache directory, or a self-generated id directory (part_*.npz) read with online
    teacher features (those also hold `layers`)."""
    from spd.train.teacher import TeacherCache, teacher_dir

    path = Path(name) if "/" in name else teacher_dir(model_dir, name)
    if any(path.glob("part_*.npz")):
        from spd.models.loading import load_tokenizer
        from spd.train.online import OnlineCache

        return OnlineCache(path, model_dir, load_tokenizer(model_dir), device=device, layers=layers)
    return TeacherCache(path)


@dataclass
class Setup:
    """What a student starts from: the run's data (the same for every student) and its own checkpoint
    and vocabulary."""

    model_dir: Path  # the target model
    config: Any  # its HF config
    cache: Any  # training data (TeacherCache, or OnlineCache over self-generated ids)
    held_seqs: list[dict]  # held-out sequences evaluated on
    state: dict | None  # the checkpoint resumed from
    d2t: torch.Tensor  # [V_s] draft vocabulary: draft id -> target id
    vocab_info: dict  # its size and coverage


@dataclass
class Plan:
    """One student of a run, before the data is open (`train_plans` opens it once for all)."""

    cfg: LoopConfig  # its flags: its own out, lr, batch_tokens, ...; the SHARED ones are the run's
    same: tuple[str, ...]  # config fields a resume must find unchanged (load_checkpoint)
    layers: Callable[[Any], Iterable[int]]  # HF config -> the teacher layers the student reads
    build: Callable[[Setup], Student]  # its Setup -> the student, on cfg.device
    d2t: torch.Tensor | None = None  # a warm start's vocabulary (else the checkpoint's, else chosen from the data)
    vocab_info: dict = field(default_factory=dict)  # with d2t: how its draft chose it (V_s, coverage), for the export


def check_plans(plans: list[Plan]) -> None:
    """ValueError unless the plans share the SHARED flags and each has its own run directory."""
    first = plans[0].cfg
    for p in plans[1:]:
        for k in SHARED:
            if getattr(p.cfg, k) != getattr(first, k):
                raise ValueError(f"every student of a run has the same --{k.replace('_', '-')}: "
                                 f"{getattr(first, k)!r} ({first.out}), {getattr(p.cfg, k)!r} ({p.cfg.out})")
    outs = [Path(p.cfg.out).resolve() for p in plans]
    if len(set(outs)) < len(outs):
        raise ValueError(f"every student needs its own --out: {[p.cfg.out for p in plans]}")


def _open_data(cfg: LoopConfig, plans: list[Plan]) -> tuple[Path, Any, Any, Any]:
    """(model_dir, HF config, cache, held-out cache) with every plan's teacher layers: an online
    teacher computes them all; a cache on disk must hold them."""
    from spd.models.loading import load_config, resolve_model

    torch.set_num_threads(cfg.threads)
    keep_freed_memory()
    model_dir = resolve_model(cfg.model)
    config = load_config(model_dir)
    needs = [(p.cfg.out, set(p.layers(config))) for p in plans]
    layers = set().union(*(b for _, b in needs))
    cache = resolve_cache(model_dir, cfg.data, cfg.device, layers)
    held = resolve_cache(model_dir, cfg.heldout, cfg.device, layers) if cfg.heldout else None
    if held is not None and hasattr(cache, "_teacher") and hasattr(held, "_teacher"):  # (`teacher` would load one)
        held._teacher = cache.teacher  # one target in memory
    for out, b in needs:
        if missing := sorted(b - set(cache.layers)):
            raise ValueError(f"{out}: the student reads teacher layers {missing}, which {cache.root} does not "
                             f"hold (it has {cache.layers}); build a cache with them or train on self-generated ids")
    return model_dir, config, cache, held


def _student_setup(p: Plan, data: tuple[Path, Any, Any, Any], held_seqs: list[dict], vocabs: dict[int, tuple]) -> Setup:
    """Its checkpoint (if resuming: see load_checkpoint) and the draft vocabulary
    (the checkpoint's, else the plan's, else chosen from the data: one per size V_s, in `vocabs`)."""
    from spd.train.vocab import choose_vocab

    model_dir, config, cache, held = data
    cfg = p.cfg
    state = load_checkpoint(cfg, p.same)
    if state is not None:
        d2t, vocab_info = state["d2t"], state["vocab_info"]
    elif p.d2t is not None:
        d2t, vocab_info = p.d2t, {**p.vocab_info, "V_s": len(p.d2t), "from": cfg.init_from}
    else:
        if cfg.vocab not in vocabs:
            vocabs[cfg.vocab] = choose_vocab(cfg.vocab, model_dir, config, cache, held)
            log.info("vocab: %s", vocabs[cfg.vocab][1])
        d2t, vocab_info = vocabs[cfg.vocab]
    return Setup(model_dir, config, cache, held_seqs, state, d2t, vocab_info)


def slim(state: dict, name: str) -> dict:
    """The checkpoint `state` without the optimizer state, the student's weights (under `name`) in bf16."""
    weights = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in state[name].items()}
    return {**{k: v for k, v in state.items() if k != "opt"}, name: weights}


def _atomic_save(obj, path: Path) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


class _Loop:
    """One student's side of a run: fed the run's sequences in order (`feed`), it counts their rows,
    steps when batch_tokens are pending, evaluates, and checkpoints when the run says so."""

    def __init__(self, cfg: LoopConfig, student: Student, s: Setup, ranks: Ranks, line: int = 0):
        self.cfg, self.student, self.held_seqs, self.ranks, self.line = cfg, student, s.held_seqs, ranks, line  # line: of its progress bar
        self.saved = {"d2t": s.d2t, "vocab_info": s.vocab_info}  # what rebuilds the student's vocabulary
        state = s.state
        self.out = Path(cfg.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.params = [p for p in student.module.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(self.params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay,
                                     fused=torch.device(cfg.device).type in ("cpu", "cuda"))  # one kernel per step
        self.budget = cfg.tokens or int(s.cache.progress().get("loss_tokens", 0)) * cfg.epochs
        self.run = RunState(shard=cfg.skip_shards)
        if state is not None:
            student.module.load_state_dict(state[student.name])
            if "opt" in state:
                self.opt.load_state_dict(state["opt"])
            else:
                log.warning("[resume] a slim checkpoint (%s): AdamW's moments start anew", self.out)
            self.run = RunState(**{f.name: state[f.name] for f in fields(RunState) if f.name in state})
            own = state.get("ranks", [{}])
            if len(own) != ranks.world:
                raise ValueError(f"--resume with {ranks.world} ranks: the checkpoint was written by {len(own)}")
            self.run.shard, self.run.seq, self.run.epoch = (own[ranks.rank].get(k, getattr(self.run, k))
                                                            for k in ("shard", "seq", "epoch"))
            student.load_extra_state({**state, **own[ranks.rank]})
            log.info("resuming %s at step %d (%d tokens)", self.out, self.run.step, self.run.seen)
        for g in self.opt.param_groups:
            g["initial_lr"] = cfg.lr
        self.sched = self.schedule()
        self.fitted = not cfg.fit_seconds  # --fit-seconds: the budget not fitted yet
        self.warm: tuple[float, int] | None = None  # --fit-seconds: (elapsed, seen) after this process's first step
        self.start = (self.run.epoch, self.run.shard, self.run.seq)  # the data position it has trained up to
        self.mark = self.counters()  # what a checkpoint holds: the counters as of the last optimizer step
        self.done = state is not None and self.finished()
        self.step_seqs: list[dict] = []  # this rank's sequences of the coming step: one loss call when it is due
        self.rows_s, self.kl_s, self.hits_s = 0, 0.0, 0  # since the last optimizer step, for the logs

    def schedule(self):
        """Warm-up, then linear decay to 0 at the budget: a function of the step alone, rebuilt at the
        resumed step (or a fitted budget), never saved."""
        from transformers import get_linear_schedule_with_warmup

        total = max(math.ceil(self.budget / self.cfg.batch_tokens), self.cfg.warmup + 1)
        return get_linear_schedule_with_warmup(self.opt, self.cfg.warmup, total, last_epoch=self.run.step - 1)

    def fit_budget(self) -> None:
        """--fit-seconds: the pace from the end of the first step on, once it has run a tenth of the
        time, sets the budget (what it reaches in the time left) and the schedule that ends there."""
        run, fit = self.run, self.cfg.fit_seconds
        if self.fitted:
            return
        if self.warm is None:
            self.warm = (run.elapsed, run.seen)
            return
        e0, s0 = self.warm
        if not self.ranks.agree(0, run.elapsed - e0 >= fit / 10)[1][0]:  # the ranks decide together
            return
        self.fitted = True
        elapsed = max(self.ranks.gather(run.elapsed - e0))  # the slowest rank's pace (run.seen counts every rank's)
        pace = (run.seen - s0) / elapsed
        reach = run.seen + int(pace * (fit - run.elapsed))
        if reach < self.budget:
            self.budget = max(reach, run.seen + 1)
            self.sched = self.schedule()
            self.bar.total = self.budget
        log.info("[fit] %.0f positions/s over %.0f s after the first step: budget %d tokens for %.0f s %s", pace,
                 elapsed, self.budget, fit, self.out)

    def counters(self) -> dict:
        return {k: getattr(self.run, k) for k in ("seen", "pending", "shard", "seq", "epoch")}

    def finished(self) -> bool:
        """Its budget or step limit reached (asked after an optimizer step)."""
        return self.run.seen >= self.budget or bool(self.cfg.max_steps and self.run.step >= self.cfg.max_steps)

    def checkpoint(self) -> None:
        """On every rank (it gathers each rank's data position); rank 0 writes. The counters and data
        position are those of the last step: a resume feeds it the sequences counted since again."""
        m = self.mark
        own = self.ranks.gather({"shard": m["shard"], "seq": m["seq"], "epoch": m["epoch"], **self.student.extra_state()})
        if not self.ranks.main:
            return
        state = {self.student.name: self.student.module.state_dict(), "opt": self.opt.state_dict(),
                 **asdict(self.run), "seen": m["seen"], "pending": m["pending"], **own[0], "ranks": own,
                 **self.saved, "budget": self.budget, "cfg": asdict(self.cfg)}
        _atomic_save(state, self.out / "ckpt.pt")
        _atomic_save(slim(state, self.student.name), self.out / "ckpt-slim.pt")
        self.student.export(self.out / self.student.name, self.run)
        log.info("checkpoint at step %d (%d tokens) %s", self.run.step, m["seen"], self.out)

    def evaluate(self) -> None:
        if not self.held_seqs or not self.ranks.main:
            return
        t0 = time.perf_counter()
        r = self.student.evaluate(self.held_seqs)
        self.run.history.append({"step": self.run.step, "seen": self.run.seen, **r, "elapsed_s": round(self.run.elapsed, 1),
                                 "eval_s": round(time.perf_counter() - t0, 1)})
        with open(self.out / "history.jsonl", "a") as f:
            f.write(json.dumps(self.run.history[-1]) + "\n")
        log.info("[eval] step %d, %d tokens: held-out loss %s p %s %s", self.run.step, self.run.seen,
                 _round(r["heldout_loss"]), _round(r["heldout_p"]), self.out)

    def out_of_time(self) -> bool:
        return bool(self.cfg.max_seconds and self.run.elapsed + time.perf_counter() - self.t_run >= self.cfg.max_seconds)

    def begin(self) -> None:
        from tqdm import tqdm

        cfg = self.cfg
        if not self.run.history:
            self.evaluate()
        self.bar = tqdm(total=self.budget, initial=self.run.seen, unit="tok", disable=not (cfg.progress and self.ranks.main),
                        dynamic_ncols=True, mininterval=5, desc=cfg.out, position=self.line)
        amp = resolve_dtype(cfg.amp, cfg.device)
        self.autocast = torch.autocast(torch.device(cfg.device).type, dtype=amp, enabled=amp != torch.float32)
        self.last_eval = self.t_run = time.perf_counter()
        self.student.module.train()
        self.opt.zero_grad(set_to_none=True)

    def feed(self, at: tuple[int, int, int], seq: dict | None) -> bool:
        """Count the sequence (None: this rank's data ran out) and take the step when it is due;
        True when any rank's data ran out (agreed over the ranks, which step together)."""
        run = self.run
        rows, (exhausted,) = self.ranks.agree(self.student.rows(seq) if seq is not None else 0, seq is None)
        if exhausted:
            return True
        assert seq is not None  # (else exhausted)
        self.step_seqs.append(seq)
        run.epoch, run.shard, run.seq = at
        run.pending, self.rows_s, run.seen = run.pending + rows, self.rows_s + rows, run.seen + rows
        self.bar.update(rows)
        if run.pending >= self.cfg.batch_tokens:
            self.step()
        return False

    def step(self) -> None:
        """One optimizer step on the pending sequences (the rows past batch_tokens count towards the next)."""
        cfg, run = self.cfg, self.run
        run.pending -= cfg.batch_tokens
        with self.autocast:
            kl, _, hits = self.student.loss(self.step_seqs)
        self.step_seqs = []
        if kl is not None:
            (kl / cfg.batch_tokens).backward()
            self.kl_s, self.hits_s = self.kl_s + kl.item(), self.hits_s + hits
        self.ranks.sum_grads(self.params)
        torch.nn.utils.clip_grad_norm_(self.params, 1.0)
        self.opt.step()
        self.sched.step()
        self.opt.zero_grad(set_to_none=True)
        run.step += 1
        rows = max(self.rows_s, 1)  # (0 where the rows carried over already make a step)
        self.bar.set_postfix({"loss": f"{self.kl_s / rows:.3f}", "p_train": f"{self.hits_s / rows:.3f}"}, refresh=False)
        if self.ranks.main and (run.step % 20 == 0 or run.step == 1):  # kl, hits: rank 0's rows
            log.info("step %d: %d/%d tokens, loss %.4f, p_train %.3f, lr %.2e %s", run.step, run.seen, self.budget,
                     self.kl_s * self.ranks.world / rows, self.hits_s * self.ranks.world / rows,
                     self.sched.get_last_lr()[0], self.out)
        self.rows_s, self.kl_s, self.hits_s = 0, 0.0, 0
        now = time.perf_counter()
        run.elapsed, self.t_run = run.elapsed + now - self.t_run, now
        self.fit_budget()
        if self.ranks.main and now - self.last_eval >= cfg.eval_every_s:
            self.evaluate()
            self.last_eval = time.perf_counter()
        self.mark = self.counters()
        self.done = self.finished()

    def end(self, at: tuple[int, int, int]) -> None:
        """The data ran out at `at`: finish there; the rows counted since the last step are dropped
        (a resume does not feed them again)."""
        self.run.epoch, self.run.shard, self.run.seq = at
        self.mark = {**self.counters(), "pending": 0}
        self.finish()

    def finish(self) -> None:
        """The last evaluation and checkpoint (and export); the student in eval mode."""
        run = self.run
        self.bar.close()
        run.elapsed += time.perf_counter() - self.t_run
        if not run.history or run.history[-1]["seen"] != run.seen:
            self.evaluate()
        self.checkpoint()
        self.student.module.eval()
        self.done = True
        log.info("done: %d tokens in %d steps, %.0f s %s", run.seen, run.step, run.elapsed, self.out)


def _round(x: Any):
    return [round(v, 4) for v in x] if isinstance(x, list) else round(x, 4)


def _stream(cache, ranks: Ranks, cfg: LoopConfig, start: tuple[int, int, int], wait: Callable[[], bool]):
    """(data position after it: (epoch, shard, seq), sequence) in training order from `start` on;
    (position, None) once the cache runs out, unless --wait and `wait()` (a budget not met yet)."""
    epoch, shard, seq = start
    while True:
        shards = ranks.mine(cache.shards())
        if shard >= len(shards):
            if epoch + 1 < cfg.epochs and shards:
                epoch, shard, seq = epoch + 1, 0, 0
                continue
            if cfg.wait and wait():
                time.sleep(30)  # the cache is still being generated by another process
                continue
            yield (epoch, shard, seq), None
            return
        order = shard_order(cache.count(shards[shard]), cfg.seed, shard * ranks.world + ranks.rank, epoch)
        while seq < len(order):
            # a chunk at a time (for self-generated ids, the teacher pass over it): a run that stops
            # inside the part computes no features past the chunk it stops in
            pick = order[seq:seq + (cache.chunk or len(order))]
            for s in cache.sequences(shards[shard], pick):
                seq += 1
                yield (epoch, shard, seq), s
        shard, seq = shard + 1, 0


def _drive(loops: list[_Loop], cache, ranks: Ranks) -> None:
    """One pass over the data feeds every student's loop the same sequences in the same order. It
    starts where the student that is furthest behind resumes; the others skip what they have
    trained on (each rank the same number of sequences, so the collectives stay in step). After any
    optimizer step rank 0's clock decides on a checkpoint (every student's, together) or a stop."""
    cfg = loops[0].cfg
    for loop in loops:
        loop.begin()
    for loop in loops:
        if loop.done:  # resumed after its budget or step limit
            loop.finish()
    live = [loop for loop in loops if not loop.done]
    if not live:
        return
    stream = _stream(cache, ranks, cfg, min(loop.start for loop in live),
                     wait=lambda: any(loop.run.seen < loop.budget for loop in live))
    last_ckpt = time.perf_counter()
    while live:
        at, seq = next(stream)
        steps = sum(loop.run.step for loop in live)
        if any(loop.feed(at, seq) for loop in live if seq is None or at > loop.start):  # (stops at the first True)
            for loop in live:
                loop.end(at)
            return
        if sum(loop.run.step for loop in live) == steps:
            continue
        now = time.perf_counter()
        _, (save, late) = ranks.agree(0, ranks.main and now - last_ckpt >= cfg.ckpt_every_s,
                                      ranks.main and any(loop.out_of_time() for loop in live))
        if save:
            for loop in live:
                loop.checkpoint()
            last_ckpt = time.perf_counter()
        for loop in live:
            if loop.done or late:
                loop.finish()
        live = [loop for loop in live if not loop.done]


def train_together(jobs: list[tuple[LoopConfig, Student, Setup]]) -> list[RunState]:
    """Train each (cfg, student, setup) on one pass over the data of the first setup's cache (the
    first cfg's data order and clock), resuming each from its own setup's checkpoint if any.
    Returns every student's final counters and history."""
    ranks = Ranks(jobs[0][0].device)
    loops = [_Loop(cfg, student, s, ranks, i) for i, (cfg, student, s) in enumerate(jobs)]
    _drive(loops, jobs[0][2].cache, ranks)
    return [loop.run for loop in loops]


def train_student(cfg: LoopConfig, student: Student, s: Setup) -> RunState:
    """Train `student` on the set-up data under `cfg`, resuming from the set-up checkpoint if any.
    Returns the final counters and history."""
    return train_together([(cfg, student, s)])[0]


def train_plans(plans: list[Plan]) -> list[Student]:
    """Train the plans' students in one run: the data (and for self-generated ids the teacher pass
    over each part) is opened and read once for all of them. Returns them, in eval mode."""
    check_plans(plans)
    cfg = plans[0].cfg
    data = _open_data(cfg, plans)
    held_seqs = held_sequences(data[3], cfg.eval_seqs)
    vocabs: dict[int, tuple] = {}
    jobs = []
    for p in plans:
        s = _student_setup(p, data, held_seqs, vocabs)
        jobs.append((p.cfg, p.build(s), s))
    train_together(jobs)
    return [student for _, student, _ in jobs]

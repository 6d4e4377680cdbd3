"""One request inside the orchestrator's driver: its slot, epoch, verifier and the exits it waits
for; it turns EXITs into commits, rejections into RESEEDs, and faults into a re-prefill.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import torch

from spd import wire
from spd.core.schedule import staircase_offset, drafts
from spd.core.verifier import Verdict, Verifier
from spd.runtime import metrics
from spd.runtime.jobs import Job
from spd.runtime.stats import RequestStats
from spd import settings

if TYPE_CHECKING:
    from spd.runtime.driver import Driver

log = logging.getLogger(__name__)


class Fault(Exception):
    """A worker died or stalled: recover by re-prefilling."""


class Unavailable(Exception):
    pass


class Run:
    """The state of one request inside the driver: its slot, epoch, verifier and exits."""

    def __init__(self, driver: Driver, job: Job, slot: int):
        self.d, self.job, self.slot, cfg = driver, job, slot, driver.cfg
        P = len(job.prompt_ids)
        max_new = min(job.stop.max_tokens, cfg.context - P + 1)
        self.verifier = Verifier(job.prompt_ids, job.params, job.stop, max_new, driver.n)
        self.draft_limit = min(P + max_new, cfg.context)  # drafts may take positions < this
        # position the first exit of the current fill judges, with no draft for it: the prompt length
        # after a prefill (whose wire `base` is 0), the reseed position (= `base`) after a reseed
        self.first_judged = P
        self.epoch = 0  # this request's current epoch (its last PREFILL / RESEED)
        self.exits: dict[int, tuple[wire.Exit, float]] = {}  # pos -> (EXIT of the current epoch, arrival)
        self.stats = RequestStats(driver.n, P, queue_ms=1e3 * (time.monotonic() - job.submitted))
        metrics.QUEUE_TIME.observe(self.stats.queue_ms / 1e3)
        metrics.PROMPT_TOKENS.inc(P)
        self.t0 = time.monotonic()
        self.t_first: float | None = None  # when the first token was committed
        self.last_commit = 0.0  # when the last one was
        self.last_accept = False
        self.cycle_ms: list[float] = []  # steady-state cycle times (accept after accept)

    def start(self) -> None:
        self._prefill(self.job.prompt_ids)

    def _prefill(self, ids: list[int], prompt_len: int | None = None) -> None:
        self.first_judged = len(ids)
        self.epoch = self.d.broadcast(wire.Prefill(
            rid=self.job.rid, slot=self.slot, params=self.job.params, prompt_len=prompt_len or len(ids),
            s0=staircase_offset(self.d.cfg.schedule), draft_limit=self.draft_limit, routes=self.d.routes,
            ids=torch.tensor(ids, dtype=torch.int64)))
        self.progress = time.monotonic() + len(ids) * settings.PREFILL_ALLOWANCE_S  # a prefill on a slow CPU

    def reprefill(self) -> None:
        """After a fault: re-prefill the committed prefix under a new epoch."""
        log.warning("[recover] %s: re-prefilling %d committed tokens", self.job.rid, len(self.verifier.tokens))
        self.verifier.restart()
        self.exits = {}
        self._prefill(self.verifier.tokens, prompt_len=len(self.job.prompt_ids))

    def on_message(self, msg: wire.Draft | wire.Exit) -> None:
        """A DRAFT or EXIT of this request's current epoch."""
        if isinstance(msg, wire.Draft):
            self._offer(msg)
        else:
            self.exits[msg.pos] = (msg, time.monotonic())

    def tick(self) -> None:
        """Judge every exit that can be judged now; a stalled request raises a fault."""
        if self.job.cancelled.is_set():
            self._finish("cancelled")
            return
        while (nxt := self.exits.get(len(self.verifier.tokens) - 1)) is not None and self._judgeable(*nxt):
            if self._judge(nxt[0]):
                return
        if time.monotonic() - self.progress > self.d.cfg.progress_timeout_s:
            missing = self.d.registry.missing(need_drafter=False)
            raise Fault(f"{self.job.rid}: no progress for {self.d.cfg.progress_timeout_s:.0f} s" +
                         (f" ({', '.join(missing)} down)" if missing else ""))

    def _dense(self, dist: wire.SparseDist | None) -> torch.Tensor | None:
        return dist.dense(self.d.cfg.vocab_size) if dist is not None else None

    def _offer(self, msg: wire.Draft) -> None:
        self.verifier.offer(msg.pos, msg.token, self._dense(msg.q))
        self.stats.draft_ms += msg.t_ms
        self.stats.drafts += 1
        metrics.PHASE.labels("draft").observe(msg.t_ms / 1e3)

    def _judgeable(self, exit: wire.Exit, seen: float) -> bool:
        """Judge now, or wait a little for the draft that will arrive for this position?"""
        judged = exit.pos + 1
        if judged in self.verifier.drafts or judged <= self.first_judged:
            return True
        expect = (self.d.registry.alive("drafter") and self.verifier.wants_draft(judged, self.d.cfg.context)
                  and drafts(self.d.cfg.schedule, self.d.n))
        return not expect or time.monotonic() - seen > self.d.cfg.draft_wait_s

    def _judge(self, msg: wire.Exit) -> bool:
        del self.exits[msg.pos]
        t0 = time.perf_counter()
        v = self.verifier.judge(msg.pos, p=self._dense(msg.dist), argmax=msg.argmax)
        self.stats.verify_ms += 1e3 * (time.perf_counter() - t0)
        metrics.PHASE.labels("verify").observe(time.perf_counter() - t0)
        for j, ms in enumerate(msg.stage_ms[: self.d.n]):
            self.stats.stage_ms[j] += ms
            metrics.PHASE.labels(f"stage{j + 1}").observe(ms / 1e3)
        for j, rows in enumerate(msg.batch[: self.d.n]):
            self.stats.batch[j] += rows
            metrics.BATCH.observe(rows)
        self._commit(v)
        if v.finish:
            self._finish(v.finish)
            return True
        if v.reseed:
            self.stats.flushes += v.accepted is False
            if v.accepted is False:
                metrics.FLUSHES.inc()
                log.info("[flush] %s: reject at %d (draft %s, target %d)", self.job.rid, v.position, v.draft, v.token)
            self.first_judged = v.position
            self.exits = {}
            self.epoch = self.d.broadcast(wire.Reseed(rid=self.job.rid, slot=self.slot, pos=v.position, base=v.position,
                                                      token=v.token))
        return False

    def _commit(self, v: Verdict) -> None:
        now = time.monotonic()
        if self.t_first is None:
            self.t_first = now
            metrics.TTFT.observe(now - self.job.submitted)
        else:
            metrics.INTER_TOKEN.observe(now - self.last_commit)
        if self.last_accept and v.accepted:
            self.cycle_ms.append(1e3 * (now - self.last_commit))
            metrics.CYCLE.observe(self.cycle_ms[-1] / 1e3)
        self.last_commit, self.last_accept, self.progress = now, bool(v.accepted), now
        metrics.COMMITS.inc()
        metrics.ACCEPTS.inc(v.accepted is True)
        metrics.REJECTS.inc(v.accepted is False)
        self.job.emit("token", v.token)

    def _finish(self, reason: str) -> None:
        v, now, s = self.verifier, time.monotonic(), self.stats
        first = self.t_first or now
        N, K = len(v.generated), v.cycles
        decode_s = now - first
        s.finish(N, K, exits=N)  # each commit came from one exiting token
        s.accepts, s.rejects = v.accepts, v.rejects
        s.prefill_ms = 1e3 * (first - self.t0)
        s.ttft_ms, s.decode_ms = s.prefill_ms + s.queue_ms, 1e3 * decode_s
        s.tokens_per_s = (N - 1) / decode_s if N > 1 and decode_s > 0 else 0.0
        if self.cycle_ms:
            ordered = sorted(self.cycle_ms)
            s.cycle_ms_p50 = ordered[len(ordered) // 2]
            s.cycle_ms_p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
        metrics.CYCLES.inc(K)
        metrics.E2E.observe(now - self.job.submitted)
        self.job.emit("done", reason, s)
        self.d.end(self, "cancelled" if reason == "cancelled" else "ok")

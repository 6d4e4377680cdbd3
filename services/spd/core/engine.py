"""The SPD engine, in one process: cycle-accurate pipeline decoding per DESIGN §3–4.

State of a running request: `tokens` (committed prefix, then the in-flight tokens, then at most one
fresh draft waiting to enter stage 1) and `slots[j]`, the input that stage j+1 processes in the next
cycle. One cycle:

1. pre-step: the drafter proposes x̂[t+1] from the staircase as it stands before the cycle;
2. every stage forwards the token it holds (deepest first here, in parallel in the services);
3. the token leaving stage n judges its successor (sampling.verify); the judged token is committed;
4. accept -> the draft enters stage 1; reject -> truncate every stage's KV cache and the drafter to
   the committed length, flush all slots, reseed stage 1 with the correction;
   post-step drafts here instead of in 1.

Counting (tested): with a drafter that is always right, the first token comes from prefill and
each cycle from the n-th on commits one, so K = N + n - 2. With one that is always wrong every
commit after the first costs n cycles, K = n (N - 1) and α = N/K -> 1/n.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Iterator

import torch

from spd.core.drafter import Draft
from spd.core.results import Generation, Stats
from spd.core.sampling import SamplingParams
from spd.core.stage import Stage
from spd.core.stopping import StopRule
from spd.core.verifier import Verifier
from spd.core.target import check_prompt, max_new_tokens, run_through

log = logging.getLogger(__name__)


@dataclass
class _Run:
    verifier: Verifier  # committed tokens, waiting drafts, judgement and stop rules
    tokens: list[int]  # committed prefix + in-flight tokens (+ a draft waiting for stage 1)
    slots: list  # slots[j] = (position, input) for stage j+1, or None
    waiting: int | None = None  # position of a fresh draft waiting to enter stage 1
    base: int = 0  # first position of the current pipeline fill (the last reseed)
    finish: str | None = None


class SPDEngine:
    """Drives in-process stages and a drafter (a DrafterState, a ScriptedDrafter, or None)."""

    def __init__(self, stages: list[Stage], drafter=None, schedule: str = "pre", trace: bool = False):
        if schedule not in ("pre", "post"):
            raise ValueError(f"schedule must be 'pre' or 'post', got {schedule!r}")
        self.stages, self.drafter, self.schedule, self.tracing = stages, drafter, schedule, trace
        self.n = len(stages)

    def generate(self, prompt_ids: list[int], params: SamplingParams, stop: StopRule) -> Generation:
        stats, trace = Stats(n=self.n), []
        tokens = list(self.stream(prompt_ids, params, stop, stats, trace))
        return Generation(tokens, stop.finish_reason(tokens) or "length", stats, trace)

    def stream(self, prompt_ids: list[int], params: SamplingParams, stop: StopRule,
               stats: Stats | None = None, trace: list | None = None) -> Iterator[int]:
        """Yield each committed token as soon as it is verified."""
        check_prompt(prompt_ids, self.stages)
        stats = stats if stats is not None else Stats(n=self.n)
        stats.stage_s = [0.0] * self.n
        trace = trace if trace is not None else []
        run = self._prefill(prompt_ids, params, stop, stats)
        yield run.verifier.tokens[-1]
        t0 = time.perf_counter()
        while run.finish is None:
            committed = self._cycle(run, stats, trace)
            if committed is not None:
                stats.generated_tokens += 1
                yield committed
        stats.decode_s = time.perf_counter() - t0

    # -- phases -------------------------------------------------------------------------------

    def _prefill(self, prompt_ids: list[int], params: SamplingParams, stop: StopRule, stats: Stats) -> _Run:
        t0 = time.perf_counter()
        for stage in self.stages:
            stage.truncate(0)
        ids = torch.tensor(prompt_ids)
        if self.drafter is not None:
            self.drafter.reset()
            self.drafter.enter(0, ids)
        on_stage = (lambda j, out: self.drafter.observe(0, len(ids), j, out.anchors)) if self.drafter else None
        out = run_through(self.stages, ids, 0, on_stage)
        verifier = Verifier(list(prompt_ids), params, stop, max_new_tokens(len(prompt_ids), stop, self.stages), self.n)
        first = verifier.first(out.logits[-1])
        run = _Run(verifier, list(verifier.tokens), [None] * self.n, finish=first.finish)
        if run.finish is None:
            self._reseed(run, first.position, first.token)
        stats.generated_tokens = 1
        stats.prefill_s = time.perf_counter() - t0
        return run

    def _cycle(self, run: _Run, stats: Stats, trace: list) -> int | None:
        """One lockstep cycle. Returns the token it committed, or None (refill cycle)."""
        stats.cycles += 1
        record = {"cycle": stats.cycles, "in_flight": sum(s is not None for s in run.slots)}
        if self.schedule == "pre":
            self._draft(run, stats, record)
        exiting = self._forward_stages(run, stats)
        committed = None
        if exiting is not None:
            t0 = time.perf_counter()
            committed = self._judge(run, *exiting, stats, record)
            stats.verify_s += time.perf_counter() - t0
        if self.schedule == "post" and run.finish is None and run.slots[0] is None:
            self._draft(run, stats, record)
        self._admit_draft(run)
        if self.tracing:
            trace.append(record)
        return committed

    def _forward_stages(self, run: _Run, stats: Stats) -> tuple[int, torch.Tensor] | None:
        """Every occupied stage forwards one token; returns (position, logits [V]) of the exiting one."""
        exiting = None
        for j in reversed(range(self.n)):  # deepest first: stage j+1 consumes last cycle's output of j
            if run.slots[j] is None:
                continue
            pos, x = run.slots[j]
            run.slots[j] = None
            t0 = time.perf_counter()
            out = self.stages[j](x, pos)
            stats.stage_s[j] += time.perf_counter() - t0
            if self.drafter is not None:
                self.drafter.observe(pos, 1, j + 1, out.anchors)
            if j == self.n - 1:
                exiting = (pos, out.logits[-1])
            else:
                run.slots[j + 1] = (pos, out.hidden)
        return exiting

    def _judge(self, run: _Run, pos: int, logits: torch.Tensor, stats: Stats, record: dict) -> int:
        """The token at `pos` left stage n: its distribution decides position pos+1. Commit it."""
        v = run.verifier.judge(pos, logits)
        stats.accepts, stats.rejects = run.verifier.accepts, run.verifier.rejects
        record.update(judged=v.position, draft=v.draft, token=v.token, accepted=v.accepted)
        run.finish = v.finish
        if v.accepted:
            return v.token
        if v.accepted is False:
            log.debug("[flush] reject at position %d: draft %d, target %d", v.position, v.draft, v.token)
        run.tokens[v.position:] = [v.token]  # everything behind the committed token is void
        run.waiting = None
        if run.finish is None:
            self._reseed(run, v.position, v.token)
        return v.token

    def _reseed(self, run: _Run, pos: int, token: int) -> None:
        """Truncate every KV cache and the drafter to `pos`, flush, and put `token` into stage 1."""
        for stage in self.stages:
            stage.truncate(pos)
        run.base = pos
        run.slots = [None] * self.n
        run.slots[0] = (pos, torch.tensor([token]))
        if self.drafter is not None:
            self.drafter.truncate(pos)
            self.drafter.enter(pos, torch.tensor([token]))

    def _draft(self, run: _Run, stats: Stats, record: dict) -> None:
        """Ask the drafter for the next token; it waits in `tokens` until the cycle's verdict."""
        next_pos = len(run.tokens)
        if self.drafter is None or not run.verifier.wants_draft(next_pos, self._ctx):
            return
        t0 = time.perf_counter()
        depths = self.drafter.staircase(run.base, s0=0 if self.schedule == "pre" else 1)
        assert self.drafter.ready(depths), "lockstep invariant: the staircase is exactly what was observed"
        draft: Draft = self.drafter.draft(run.verifier.params, depths)
        stats.draft_s += time.perf_counter() - t0
        assert draft.position == next_pos, (draft.position, next_pos)
        run.tokens.append(draft.token)
        run.waiting = next_pos
        run.verifier.offer(next_pos, draft.token, draft.q)
        record.update(drafted=draft.token, fill=draft.fill)

    def _admit_draft(self, run: _Run) -> None:
        """A draft that survived the cycle's verdict enters stage 1."""
        pos, run.waiting = run.waiting, None
        if pos is not None and run.finish is None:
            run.slots[0] = (pos, torch.tensor([run.tokens[pos]]))
            self.drafter.enter(pos, torch.tensor([run.tokens[pos]]))

    # -- helpers --------------------------------------------------------------------------------

    @property
    def _ctx(self) -> int:
        return self.stages[0].config.max_position_embeddings

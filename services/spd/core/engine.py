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
from dataclasses import dataclass, field
from typing import Iterator

import torch

from spd.core.drafter import Draft
from spd.core.results import Generation, Stats
from spd.core.sampling import SamplingParams, choose, process, verify
from spd.core.stage import Stage
from spd.core.stopping import StopRule
from spd.core.target import check_prompt, max_new_tokens, run_through

log = logging.getLogger(__name__)


@dataclass
class _Run:
    prompt_len: int
    params: SamplingParams
    limit: StopRule
    max_new: int
    tokens: list[int]  # committed prefix + in-flight tokens (+ a draft waiting for stage 1)
    committed: int  # tokens[:committed] are verified
    slots: list  # slots[j] = (position, input) for stage j+1, or None
    q: dict[int, torch.Tensor] = field(default_factory=dict)  # position -> draft distribution (sampling)
    waiting: int | None = None  # position of a fresh draft waiting to enter stage 1
    finish: str | None = None

    @property
    def generated(self) -> list[int]:
        return self.tokens[self.prompt_len:self.committed]


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
        yield run.tokens[run.committed - 1]
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
        P = len(prompt_ids)
        first, _ = choose(out.logits[-1], params, P)
        run = _Run(P, params, stop, max_new_tokens(P, stop, self.stages), list(prompt_ids) + [first], P + 1,
                   [None] * self.n)
        run.finish = self._finish_reason(run)
        if run.finish is None:
            self._reseed(run, P, first)
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
        judged = pos + 1
        assert judged == run.committed, (judged, run.committed)
        if judged < len(run.tokens):  # a draft is waiting for this verdict
            draft = run.tokens[judged]
            p = None if run.params.greedy else process(logits, run.params)
            accepted, token = verify(p, int(torch.argmax(logits)), draft, run.q.pop(judged, None), run.params, judged)
            stats.accepts += accepted
            stats.rejects += not accepted
            record.update(judged=judged, draft=draft, token=token, accepted=accepted)
        else:  # nothing in flight behind it (no drafter, or the pipeline was draining)
            token, _ = choose(logits, run.params, judged)
            accepted = None
            record.update(judged=judged, token=token, accepted=None)
        run.committed = judged + 1
        if accepted:
            run.finish = self._finish_reason(run)
            return token
        # Rejected, or no successor: everything after `judged` is void; `token` becomes the only one in flight.
        if accepted is False:
            log.debug("[flush] reject at position %d: draft %d, target %d", judged, draft, token)
        run.tokens[judged:] = [token]
        run.q.clear()
        run.waiting = None
        run.finish = self._finish_reason(run)
        if run.finish is None:
            self._reseed(run, judged, token)
        return token

    def _reseed(self, run: _Run, pos: int, token: int) -> None:
        """Truncate every KV cache and the drafter to `pos`, flush, and put `token` into stage 1."""
        for stage in self.stages:
            stage.truncate(pos)
        run.slots = [None] * self.n
        run.slots[0] = (pos, torch.tensor([token]))
        if self.drafter is not None:
            self.drafter.truncate(pos)
            self.drafter.enter(pos, torch.tensor([token]))

    def _draft(self, run: _Run, stats: Stats, record: dict) -> None:
        """Ask the drafter for the next token; it waits in `tokens` until the cycle's verdict."""
        next_pos = len(run.tokens)
        if self.drafter is None or next_pos - run.prompt_len >= run.max_new or next_pos >= self._ctx:
            return
        t0 = time.perf_counter()
        draft: Draft = self.drafter.draft(run.params)
        stats.draft_s += time.perf_counter() - t0
        assert draft.position == next_pos, (draft.position, next_pos)
        run.tokens.append(draft.token)
        run.waiting = next_pos
        if draft.q is not None:
            run.q[next_pos] = draft.q
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

    def _finish_reason(self, run: _Run) -> str | None:
        generated = run.generated
        reason = run.limit.finish_reason(generated)
        if reason is None and len(generated) >= run.max_new:
            reason = "length"
        return reason

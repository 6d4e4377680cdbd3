"""The SPD engine, in one process: cycle-accurate pipeline decoding per design §3–4.

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

Many requests (`generate_many`): each keeps its own pipeline (its own tokens in flight, drafter
state, epochs of flushes) in its own KV slot of every stage; in a cycle each stage runs the tokens
that all requests hold for it as one batched forward (`Stage.forward_rows`, batch-invariant), so a
request's tokens are exactly what it would produce alone. A request joins with its prefill
between two cycles, without draining the others.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Iterator, NamedTuple

import torch

from spd.core.drafter import Draft, Drafter
from spd.core.results import Generation, Stats
from spd.core.sampling import SamplingParams
from spd.core.schedule import check, staircase_offset
from spd.core.stage import Stage
from spd.core.stopping import StopRule
from spd.core.verifier import Verifier
from spd.core.target import check_prompt, max_new_tokens, prefill

log = logging.getLogger(__name__)


@dataclass
class _Decoding:
    verifier: Verifier  # committed tokens, waiting drafts, judgement and stop rules
    tokens: list[int]  # committed prefix + in-flight tokens (+ a draft waiting for stage 1)
    slots: list  # slots[j] = (position, input) for stage j+1, or None
    slot: int = 0  # its KV cache slot in every stage
    drafter: Drafter | None = None  # its own drafter state (None: no drafting)
    stats: Stats = field(default_factory=Stats)
    trace: list[dict] = field(default_factory=list)  # per-cycle records when tracing
    waiting: int | None = None  # position of a fresh draft waiting to enter stage 1
    base: int = 0  # first position of the current pipeline fill (the last reseed)
    finish: str | None = None


class Request(NamedTuple):
    prompt_ids: list[int]
    params: SamplingParams
    stop: StopRule


class SPDEngine:
    """Drives in-process stages and a drafter (a DrafterState, a ScriptedDrafter, or None)."""

    def __init__(self, stages: list[Stage], drafter: Drafter | None = None, schedule: str = "pre", trace: bool = False):
        self.stages, self.drafter, self.schedule, self.tracing = stages, drafter, check(schedule), trace
        self.n = len(stages)

    def generate(self, prompt_ids: list[int], params: SamplingParams, stop: StopRule) -> Generation:
        stats, trace = Stats(n=self.n), list[dict]()
        tokens = list(self.stream(prompt_ids, params, stop, stats, trace))
        return Generation(tokens, stop.finish_reason(tokens) or "length", stats, trace)

    def stream(self, prompt_ids: list[int], params: SamplingParams, stop: StopRule,
               stats: Stats | None = None, trace: list | None = None) -> Iterator[int]:
        """Yield each committed token as soon as it is verified."""
        run = self._start(Request(prompt_ids, params, stop), 0, self.drafter, stats, trace)
        yield run.verifier.tokens[-1]
        t0 = time.perf_counter()
        while run.finish is None:
            committed = self._cycle([run])[0]
            if committed is not None:
                yield committed
        run.stats.decode_s = time.perf_counter() - t0

    def generate_many(self, requests: list[Request], join_at: list[int] | None = None) -> list[Generation]:
        """Decode several requests together; request i joins before cycle join_at[i] (default 0).

        Each gets its own KV slot and drafter state (`fork` of the engine's drafter); stages batch
        across requests up to their `rows`.
        """
        join_at = join_at or [0] * len(requests)
        waiting = sorted(range(len(requests)), key=lambda i: join_at[i])
        runs: dict[int, _Decoding] = {}
        done: dict[int, Generation] = {}
        started: dict[int, float] = {}
        cycle = 0
        while waiting or runs:
            while waiting and join_at[waiting[0]] <= cycle:
                i = waiting.pop(0)
                drafter = self.drafter.fork() if self.drafter is not None else None
                runs[i] = self._start(requests[i], i, drafter, Stats(n=self.n), [])
                started[i] = time.perf_counter()
            if runs:
                self._cycle(list(runs.values()))
            for i in [i for i, run in runs.items() if run.finish is not None]:
                run = runs.pop(i)
                run.stats.decode_s = time.perf_counter() - started[i]
                for stage in self.stages:
                    stage.release(run.slot)
                tokens = run.verifier.generated
                done[i] = Generation(tokens, run.finish or "length", run.stats, run.trace)
            cycle += 1
        return [done[i] for i in range(len(requests))]

    # -- phases -------------------------------------------------------------------------------

    def _start(self, request: Request, slot: int, drafter, stats: Stats | None, trace: list | None) -> _Decoding:
        """Prefill one request into `slot`; the run holds its first token."""
        prompt_ids, params, stop = request
        check_prompt(prompt_ids, self.stages)
        stats = stats if stats is not None else Stats(n=self.n)
        stats.stage_s = [0.0] * self.n
        t0 = time.perf_counter()
        for stage in self.stages:
            stage.truncate(0, slot)
        ids = torch.tensor(prompt_ids)
        if drafter is not None:
            drafter.reset()
            drafter.enter(0, ids)
        on_stage = (lambda j, out, start: drafter.observe(start, len(out.hidden), j, out.anchors)) if drafter else None
        out = prefill(self.stages, ids, on_stage, slot)
        verifier = Verifier(list(prompt_ids), params, stop, max_new_tokens(len(prompt_ids), stop, self.stages), self.n)
        first = verifier.first(out.last_logits)
        run = _Decoding(verifier, list(verifier.tokens), [None] * self.n, slot, drafter, stats,
                   trace if trace is not None else [], finish=first.finish)
        if run.finish is None:
            self._reseed(run, first.position, first.token)
        stats.generated_tokens = 1
        stats.prefill_s = time.perf_counter() - t0
        return run

    def _cycle(self, runs: list[_Decoding]) -> list[int | None]:
        """One lockstep cycle of every run. Returns the token each committed, or None (refill)."""
        records = []
        for run in runs:
            run.stats.cycles += 1
            records.append({"cycle": run.stats.cycles, "in_flight": sum(s is not None for s in run.slots)})
        if self.schedule == "pre":
            self._draft(list(zip(runs, records)))
        exits = self._forward_stages(runs)
        committed = []
        for run, record, exiting in zip(runs, records, exits):
            token = None
            if exiting is not None:
                t0 = time.perf_counter()
                token = self._judge(run, *exiting, record)
                run.stats.verify_s += time.perf_counter() - t0
                run.stats.generated_tokens += 1
            committed.append(token)
        if self.schedule == "post":
            self._draft([(run, record) for run, record in zip(runs, records)
                         if run.finish is None and run.slots[0] is None])
        for run, record in zip(runs, records):
            self._admit_draft(run)
            if self.tracing:
                run.trace.append(record)
        return committed

    def _forward_stages(self, runs: list[_Decoding]) -> list[tuple[int, torch.Tensor] | None]:
        """Every occupied stage forwards the token each run holds for it (one batched forward per
        stage, at most `rows` tokens each); returns each run's exiting (position, logits [V]) or None."""
        exits: list = [None] * len(runs)
        for j in reversed(range(self.n)):  # deepest first: stage j+1 consumes last cycle's output of j
            stage = self.stages[j]
            ready = [(i, run) for i, run in enumerate(runs) if run.slots[j] is not None]
            for g in range(0, len(ready), max(stage.rows, 1)):
                group = ready[g:g + max(stage.rows, 1)]
                inputs = [(run.slot, run.slots[j][1], run.slots[j][0]) for _, run in group]
                t0 = time.perf_counter()
                outs = stage.forward_rows(inputs)
                dt = time.perf_counter() - t0
                for (i, run), out in zip(group, outs):
                    pos, _ = run.slots[j]
                    run.slots[j] = None
                    run.stats.stage_s[j] += dt
                    if run.drafter is not None:
                        run.drafter.observe(pos, 1, j + 1, out.anchors)
                    if j == self.n - 1:
                        exits[i] = (pos, out.last_logits)
                    else:
                        run.slots[j + 1] = (pos, out.hidden)
        return exits

    def _judge(self, run: _Decoding, pos: int, logits: torch.Tensor, record: dict) -> int:
        """The token at `pos` left stage n: its distribution decides position pos+1. Commit it."""
        v = run.verifier.judge(pos, logits)
        run.stats.accepts, run.stats.rejects = run.verifier.accepts, run.verifier.rejects
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

    def _reseed(self, run: _Decoding, pos: int, token: int) -> None:
        """Truncate the run's KV caches and drafter to `pos`, flush, and put `token` into stage 1."""
        for stage in self.stages:
            stage.truncate(pos, run.slot)
        run.base = pos
        run.slots = [None] * self.n
        run.slots[0] = (pos, torch.tensor([token]))
        if run.drafter is not None:
            run.drafter.truncate(pos)
            run.drafter.enter(pos, torch.tensor([token]))

    def _draft(self, runs: list[tuple[_Decoding, dict]]) -> None:
        """Ask each run's drafter for its next token, all in one batched draft; a draft waits in
        `tokens` until the cycle's verdict."""
        wanting = [(run, record) for run, record in runs
                   if run.drafter is not None and run.verifier.wants_draft(len(run.tokens), self._ctx)]
        if not wanting:
            return
        t0 = time.perf_counter()
        jobs = []
        for run, _ in wanting:
            drafter = run.drafter
            assert drafter is not None
            depths = drafter.staircase(run.base, staircase_offset(self.schedule))
            assert drafter.ready(depths), "lockstep invariant: the staircase is exactly what was observed"
            jobs.append((drafter, run.verifier.params, depths))
        drafts: list[Draft] = type(jobs[0][0]).draft_many(jobs)
        dt = time.perf_counter() - t0
        for (run, record), draft in zip(wanting, drafts):
            next_pos = len(run.tokens)
            run.stats.draft_s += dt  # what this request waited for its draft
            assert draft.position == next_pos, (draft.position, next_pos)
            run.tokens.append(draft.token)
            run.waiting = next_pos
            run.verifier.offer(next_pos, draft.token, draft.q)
            record.update(drafted=draft.token, fill=draft.fill)

    def _admit_draft(self, run: _Decoding) -> None:
        """A draft that survived the cycle's verdict enters stage 1."""
        pos, run.waiting = run.waiting, None
        if pos is not None and run.finish is None and run.drafter is not None:
            run.slots[0] = (pos, torch.tensor([run.tokens[pos]]))
            run.drafter.enter(pos, torch.tensor([run.tokens[pos]]))

    # -- helpers --------------------------------------------------------------------------------

    @property
    def _ctx(self) -> int:
        return self.stages[0].config.max_position_embeddings

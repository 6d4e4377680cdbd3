"""The drafter's inference state: anchor states per position, depths, and the PDM's KV cache.

Depth of a position = stages it has completed (design §2). Stages report anchor states as they
produce them (`observe`); a token entering stage 1 is depth 0 and its only anchor, the embedding,
is computed here from the drafter's own copy of the embedding table (`enter`).

`draft()` runs the PDM on every position not yet in its cache. Positions at depth n form a
contiguous prefix; their PDM keys/values never change again (depth-n positions only attend to
depth-n positions), so they stay cached. The staircase of in-flight positions is recomputed each
call and dropped from the cache afterwards (design §3: attention rule, inference = training).

Several requests draft together (`DrafterState.draft_many`, up to `rows` per forward), and a draft
never depends on what else is drafted with it (batch invariance, as for the stages): every draft
runs its newest `block` = n + 2 positions (the n in flight, and those that reached depth n since
the last draft) as one block padded to that length, the block of each of `rows` requests stacked
into one fixed shape [rows, block] (fusions, layers and head run at that shape; attention per
request over its own cache). Older positions not yet cached are all at depth n; they first run
into the cache alone, as one chunk of their own length (after a prefill: the prompt). Alone or
batched, a request takes this same path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

from spd.core.kv_cache import KVCache
from spd.core.masks import causal_mask
from spd.core.pdm import PDM
from spd.core.row_attention import RowsCache
from spd.core.sampling import STREAM_DRAFT, SamplingParams, coupled_sample, keyed_generator, sampling_probs, sample
from spd.core.split import PipelineSplit


@dataclass
class Draft:
    position: int  # where the drafted token will sit in the sequence
    token: int  # target vocabulary id
    q: torch.Tensor | None  # [V] processed draft distribution over the target vocab (None when greedy)
    fill: int  # staircase length a: positions with depth < n that the PDM saw


BLOCK_SLACK = 2  # a draft block holds the n in-flight positions and this many more


def staircase(length: int, base: int, s0: int, n: int) -> list[int]:
    """Depths the staircase prescribes for each of `length` positions (design §3).

    In-flight positions (>= base, the first token of the current pipeline fill) at offset o from
    the newest have depth s0 + o (capped at n); everything older has left the pipeline: depth n.
    """
    start = min(base, length)
    return [n] * start + [min(n, s0 + length - 1 - i) for i in range(start, length)]


class Drafter(Protocol):
    """What the engine and the drafter process need of a drafter state (DrafterState, ScriptedDrafter)."""

    depth: list[int]  # per position: stages it has completed

    @property
    def length(self) -> int: ...
    def fork(self) -> "Drafter": ...
    def reset(self) -> None: ...
    def truncate(self, length: int) -> None: ...
    def enter(self, position: int, tokens: torch.Tensor) -> None: ...
    def observe(self, position: int, count: int, stage: int, anchors: dict[int, torch.Tensor]) -> None: ...
    def staircase(self, base: int, s0: int) -> list[int]: ...
    def ready(self, depths: list[int]) -> bool: ...
    def draft(self, params: SamplingParams, depths: list[int] | None = None) -> "Draft": ...
    @staticmethod
    def draft_many(jobs: list) -> list["Draft"]: ...


class DrafterState:
    def __init__(self, pdm: PDM, embed: nn.Embedding, split: PipelineSplit, rows: int = 1):
        self.pdm, self.embed, self.split = pdm, embed, split
        self.rows = rows  # draft_many's batch shape: drafts of up to `rows` requests run as one forward
        self.block = split.n + BLOCK_SLACK  # positions of a draft block (see the module docstring)
        self.anchors = tuple(pdm.config.anchors)
        self._slot = {b: i for i, b in enumerate(self.anchors)}
        # eligible-prefix length for each depth 0..n
        self._eligible = [len(split.eligible(self.anchors, k)) for k in range(split.n + 1)]
        self.cache = KVCache(list(range(pdm.config.num_layers)))
        self.reset()

    def fork(self) -> "DrafterState":
        """A fresh state for another request, sharing the PDM and the embedding."""
        return DrafterState(self.pdm, self.embed, self.split, self.rows)

    def reset(self) -> None:
        self.states = torch.zeros(0, len(self.anchors), self.pdm.config.target_hidden, device=self.pdm.d2t.device)  # [T, m, d]
        self.depth: list[int] = []
        self.cache.truncate(0)

    @property
    def length(self) -> int:
        return len(self.depth)

    def truncate(self, length: int) -> None:
        """Forget positions >= length (flush after a rejection)."""
        self.depth = self.depth[:length]
        self.cache.truncate(min(self.cache.length, length))

    @torch.inference_mode()
    def enter(self, position: int, tokens: torch.Tensor) -> None:
        """Tokens [T] enter stage 1 at `position`: depth 0, anchor 0 from the embedding."""
        if position != self.length:
            raise RuntimeError(f"drafter: token enters at {position} but state has {self.length} positions")
        self._ensure(position + len(tokens))
        self.states[position:position + len(tokens), 0] = self.embed(tokens.to(self.states.device)).to(self.states.dtype)
        self.depth.extend([0] * len(tokens))

    @torch.inference_mode()
    def observe(self, position: int, count: int, stage: int, anchors: dict[int, torch.Tensor]) -> None:
        """Stage `stage` (1-based) finished positions position..position+count-1; anchors b -> [count, d]."""
        T = count
        for b, h in anchors.items():
            if b != 0:  # anchor 0 is the embedding, already set on entry
                self.states[position:position + T, self._slot[b]] = h.to(self.states.device, self.states.dtype)
        for i in range(position, min(position + T, self.length)):
            self.depth[i] = max(self.depth[i], stage)

    def staircase(self, base: int, s0: int) -> list[int]:
        return staircase(self.length, base, s0, self.split.n)

    def ready(self, depths: list[int]) -> bool:
        """Whether every position has been observed at least as deep as `depths` asks (positions
        already in the PDM cache were seen at depth n)."""
        C = self.cache.length
        return len(depths) == self.length and all(seen >= want for seen, want in zip(self.depth[C:], depths[C:]))

    def draft(self, params: SamplingParams, depths: list[int] | None = None) -> Draft:
        """Propose the token after the newest position.

        `depths` (one per position) fixes the staircase to use; by default, the depths observed so
        far (in the lockstep engine these are exactly the staircase). Anchors deeper than asked are
        ignored, so a distributed drafter drafts exactly what the lockstep engine would.
        """
        return DrafterState.draft_many([(self, params, depths)])[0]

    @staticmethod
    @torch.inference_mode()
    def draft_many(jobs: list[tuple["DrafterState", SamplingParams, list[int] | None]]) -> list[Draft]:
        """`draft` for several requests' states (of one PDM), `rows` of them per forward."""
        rows = max(jobs[0][0].rows, 1) if jobs else 1
        return [d for g in range(0, len(jobs), rows) for d in _draft_block(jobs[g:g + rows], rows)]

    def _catch_up(self, depths: list[int]) -> None:
        """Run the uncached positions older than the draft block into the PDM cache, alone."""
        C, end, n = self.cache.length, self.length - self.block, self.split.n
        if end <= C:
            return
        if any(k < n for k in depths[C:end]):
            raise RuntimeError(f"drafter: a position before the last {self.block} is still in flight")
        prev = self._prev(range(C, end), [n] * end) if self.pdm.config.prev else None
        g = self.pdm.fuse(self.states[C:end], torch.full((end - C,), self._eligible[n]), prev)  # [end - C, w]
        self.pdm.hidden(g, torch.arange(C, end, device=g.device), causal_mask(end - C, C, g.device), cache=self.cache)
        self.cache.commit()

    def _prev(self, positions: range, depths: list[int], pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """pdm.fuse's `prev` for `positions` (a PDM with config.prev): each one's predecessor's
        anchors [Q, m, d] and eligible count at the predecessor's depth [Q] (0: none), then `pad`
        empty rows."""
        before = [i - 1 for i in positions]
        states = self.states[[max(j, 0) for j in before]]  # [Q, m, d]
        counts = torch.tensor([self._eligible[depths[j]] if j >= 0 else 0 for j in before] + [0] * pad)
        return torch.cat([states, states.new_zeros(pad, *states.shape[1:])]), counts

    def _pick(self, logits: torch.Tensor, position: int, params: SamplingParams, fill: int) -> Draft:
        """logits: [V_s] over the draft vocabulary -> a target-vocabulary token (and q when sampling)."""
        d2t = self.pdm.d2t
        if params.greedy:
            return Draft(position, int(d2t[int(torch.argmax(logits))]), None, fill)
        q = torch.zeros(self.pdm.config.target_vocab)
        q[d2t.cpu()] = sampling_probs(logits, params)
        if params.coupling == "gumbel":  # same noise as the target: judged by equality, q not needed
            return Draft(position, coupled_sample(q, params.seed, position), None, fill)
        return Draft(position, sample(q, keyed_generator(params.seed, position, STREAM_DRAFT)), q, fill)

    def _ensure(self, length: int) -> None:
        if self.states.shape[0] < length:
            grow = self.states.new_zeros(max(length, 2 * self.states.shape[0]) - self.states.shape[0], *self.states.shape[1:])
            self.states = torch.cat([self.states, grow])


def _draft_block(jobs: list[tuple[DrafterState, SamplingParams, list[int] | None]], P: int) -> list[Draft]:
    """Drafts for up to P states as one forward at the fixed shape [P, Q] (see the module docstring)."""
    first = jobs[0][0]
    pdm, Q, n, m = first.pdm, first.block, first.split.n, len(first.anchors)
    anchors = first.states.new_zeros(P, Q, m, pdm.config.target_hidden)  # [P, Q, m, d]; padding stays zero
    eligible = torch.ones(P, Q, dtype=torch.long)  # [P, Q]; padding rows: the embedding-only fusion
    positions = torch.zeros(P, Q, dtype=torch.long, device=anchors.device)  # [P, Q]
    spans, masks, newest = [], [], [0] * P  # spans[b] = (C, real positions q, leading depth-n positions)
    prevs = []  # per request, pdm.fuse's `prev` for its block (a PDM with config.prev)
    for b, (state, _, depths) in enumerate(jobs):
        depths = list(depths if depths is not None else state.depth)
        state._catch_up(depths)
        C, T = state.cache.length, state.length
        q = T - C  # 1..Q: the block's real positions C..T-1
        anchors[b, :q] = state.states[C:T]
        eligible[b, :q] = torch.tensor([state._eligible[k] for k in depths[C:T]])
        if pdm.config.prev:
            prevs.append(state._prev(range(C, T), depths, pad=Q - q))
        positions[b] = torch.arange(C, C + Q)
        mask = causal_mask(Q, C, anchors.device)  # [1, 1, Q, C + Q]: padding sits after the real rows
        assert mask is not None  # Q = n + 2 >= 3 positions
        masks.append(mask)
        spans.append((C, q, next((i for i, k in enumerate(depths[C:T]) if k < n), q)))
        newest[b] = q - 1
    prev = None
    if pdm.config.prev:  # padding requests: no predecessors
        prevs += [(anchors.new_zeros(Q, m, pdm.config.target_hidden), torch.zeros(Q, dtype=torch.long))] * (P - len(jobs))
        prev = torch.cat([x for x, _ in prevs]), torch.cat([c for _, c in prevs])  # [P * Q, m, d], [P * Q]
    g = pdm.fuse(anchors.view(P * Q, m, -1), eligible.view(-1), prev, fixed=True).view(P, Q, -1)  # [P, Q, w]
    h = pdm.hidden(g, positions, None, cache=RowsCache([s.cache for s, _, _ in jobs], masks))  # [P, Q, w]
    logits = pdm.logits(h[torch.arange(P), torch.tensor(newest)])  # [P, V_s]: each request's newest row
    drafts = []
    for b, ((state, params, _), (C, q, done)) in enumerate(zip(jobs, spans)):
        state.cache.commit()
        state.cache.truncate(C + done)  # keep the depth-n prefix; the staircase is recomputed next time
        drafts.append(state._pick(logits[b], state.length, params, fill=q - done))
    return drafts

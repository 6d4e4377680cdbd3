"""The drafter's inference state: anchor states per position, depths, and the PDM's KV cache.

Depth of a position = stages it has completed (design §2). Stages report anchor states as they
produce them (`observe`); a token entering stage 1 is depth 0 and its only anchor, the embedding,
is computed here from the drafter's own copy of the embedding table (`enter`).

`draft()` runs the PDM on every position not yet in its cache. Positions at depth n form a
contiguous prefix; their PDM keys/values never change again (depth-n positions only attend to
depth-n positions), so they stay cached. The staircase of in-flight positions is recomputed each
call and dropped from the cache afterwards (design §3: attention rule, inference = training).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from spd.core.kv_cache import KVCache
from spd.core.masks import causal_mask
from spd.core.pdm import PDM
from spd.core.sampling import STREAM_DRAFT, SamplingParams, coupled_sample, keyed_generator, process, sample
from spd.core.split import PipelineSplit


@dataclass
class Draft:
    position: int  # where the drafted token will sit in the sequence
    token: int  # target vocabulary id
    q: torch.Tensor | None  # [V] processed draft distribution over the target vocab (None when greedy)
    fill: int  # staircase length a: positions with depth < n that the PDM saw


class DrafterState:
    def __init__(self, pdm: PDM, embed: nn.Embedding, split: PipelineSplit):
        self.pdm, self.embed, self.split = pdm, embed, split
        self.anchors = tuple(pdm.config.anchors)
        self._slot = {b: i for i, b in enumerate(self.anchors)}
        # eligible-prefix length for each depth 0..n
        self._eligible = [len(split.eligible(self.anchors, k)) for k in range(split.n + 1)]
        self.cache = KVCache(list(range(pdm.config.num_layers)))
        self.reset()

    def fork(self) -> "DrafterState":
        """A fresh state for another request, sharing the PDM and the embedding."""
        return DrafterState(self.pdm, self.embed, self.split)

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
        """Depths the staircase prescribes for every position (design §3).

        In-flight positions (>= base, the first token of the current pipeline fill) at offset o from
        the newest have depth s0 + o (capped at n); everything older has left the pipeline: depth n.
        """
        T, n = self.length, self.split.n
        start = min(base, T)
        return [n] * start + [min(n, s0 + T - 1 - i) for i in range(start, T)]

    def ready(self, depths: list[int]) -> bool:
        """Whether every position has been observed at least as deep as `depths` asks (positions
        already in the PDM cache were seen at depth n)."""
        C = self.cache.length
        return len(depths) == self.length and all(seen >= want for seen, want in zip(self.depth[C:], depths[C:]))

    @torch.inference_mode()
    def draft(self, params: SamplingParams, depths: list[int] | None = None) -> Draft:
        """Propose the token after the newest position.

        `depths` (one per position) fixes the staircase to use; by default, the depths observed so
        far (in the lockstep engine these are exactly the staircase). Anchors deeper than asked are
        ignored, so a distributed drafter drafts exactly what the lockstep engine would.
        """
        n, C, T = self.split.n, self.cache.length, self.length
        depths = (depths if depths is not None else self.depth)[C:]
        num_eligible = torch.tensor([self._eligible[k] for k in depths])
        g = self.pdm.fuse(self.states[C:T], num_eligible)  # [Q, w]
        h = self.pdm.hidden(g, torch.arange(C, T, device=g.device), causal_mask(T - C, C, g.device), cache=self.cache)  # [Q, w]
        self.cache.commit()
        done = next((i for i, k in enumerate(depths) if k < n), len(depths))  # leading depth-n positions
        self.cache.truncate(C + done)
        return self._pick(self.pdm.logits(h[-1]), T, params, fill=len(depths) - done)  # only the newest row

    def _pick(self, logits: torch.Tensor, position: int, params: SamplingParams, fill: int) -> Draft:
        """logits: [V_s] over the draft vocabulary -> a target-vocabulary token (and q when sampling)."""
        d2t = self.pdm.d2t
        if params.greedy:
            return Draft(position, int(d2t[int(torch.argmax(logits))]), None, fill)
        q = torch.zeros(self.pdm.config.target_vocab)
        q[d2t.cpu()] = process(logits, params)
        if params.coupling == "gumbel":  # same noise as the target: judged by equality, q not needed
            return Draft(position, coupled_sample(q, params.seed, position), None, fill)
        return Draft(position, sample(q, keyed_generator(params.seed, position, STREAM_DRAFT)), q, fill)

    def _ensure(self, length: int) -> None:
        if self.states.shape[0] < length:
            grow = self.states.new_zeros(max(length, 2 * self.states.shape[0]) - self.states.shape[0], *self.states.shape[1:])
            self.states = torch.cat([self.states, grow])

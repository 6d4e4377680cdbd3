"""Scripted drafters for tests and diagnostics (not PDMs): they propose from a known token list.

`ScriptedDrafter(oracle)` proposes oracle[position] (e.g. the target's own greedy output, so every
judgement accepts); `wrong=True` proposes a token that is never the oracle's (so every judgement
rejects); `wrong_every=k` is wrong at every k-th position only. They keep the same position
bookkeeping as the real drafter so the engine drives them identically; `spd drafter --script`
runs one as a process (for tests of the distributed runtime).
"""

from __future__ import annotations

import torch

from spd.core.drafter import Draft, staircase
from spd.core.sampling import SamplingParams


class ScriptedDrafter:
    def __init__(self, oracle: list[int], vocab_size: int, wrong: bool = False, wrong_every: int = 0,
                 continuation: list[int] | None = None, n: int | None = None):
        self.oracle, self.vocab_size = oracle, vocab_size
        self.n = n  # if set, drafting waits for the staircase like the PDM drafter (timing-faithful)
        self.continuation = continuation  # if set, the oracle becomes prompt + continuation at each prefill
        self.wrong, self.wrong_every = wrong, wrong_every
        self.depth: list[int] = []

    def fork(self) -> "ScriptedDrafter":
        """The same script for another request (with `continuation`, its own oracle per prompt)."""
        return ScriptedDrafter(list(self.oracle), self.vocab_size, self.wrong, self.wrong_every, self.continuation, self.n)

    @property
    def length(self) -> int:
        return len(self.depth)

    def reset(self) -> None:
        self.depth = []

    def truncate(self, length: int) -> None:
        self.depth = self.depth[:length]

    def enter(self, position: int, tokens: torch.Tensor) -> None:
        assert position == self.length, (position, self.length)
        if position == 0 and self.continuation is not None:
            self.oracle = tokens.tolist() + list(self.continuation)
        self.depth.extend([0] * len(tokens))

    def observe(self, position: int, count: int, stage: int, anchors) -> None:
        for i in range(position, min(position + count, self.length)):
            self.depth[i] = max(self.depth[i], stage)

    def staircase(self, base: int, s0: int) -> list[int]:
        return list(self.depth) if self.n is None else staircase(self.length, base, s0, self.n)

    def ready(self, depths: list[int]) -> bool:
        return all(seen >= want for seen, want in zip(self.depth, depths))

    @staticmethod
    def draft_many(jobs: list[tuple["ScriptedDrafter", SamplingParams, list[int] | None]]) -> list[Draft]:
        return [state.draft(params, depths) for state, params, depths in jobs]

    def draft(self, params: SamplingParams, depths: list[int] | None = None) -> Draft:
        pos = self.length
        token = self.oracle[pos] if pos < len(self.oracle) else 0
        if self.wrong or (self.wrong_every and pos % self.wrong_every == 0):
            token = (token + 1) % self.vocab_size
        q = None
        if not params.greedy:
            q = torch.zeros(self.vocab_size)
            q[token] = 1.0
        return Draft(pos, token, q, fill=0)

"""BENCHMARK ONLY: a stage that computes nothing, to measure the runtime's own per-cycle cost.

It keeps the KV-length bookkeeping of a real stage and passes a [T, d] hidden state on whose first
component carries the token id; the last stage "predicts" token + 1 (one-hot logits), so a
scripted drafter proposing x+1, x+2, ... is always accepted and every cycle is a steady-state one.
"""

from __future__ import annotations

import torch

from spd.core.stage import StageOutput


class ZeroComputeStage:
    def __init__(self, index: int, n: int, hidden: int, vocab: int):
        self.is_first, self.is_last = index == 1, index == n
        self.hidden_size, self.vocab = hidden, vocab
        self.layer_ids = [index - 1]
        self._length = 0

    @property
    def kv_length(self) -> int:
        return self._length

    def truncate(self, length: int) -> None:
        self._length = min(self._length, length)

    def __call__(self, x: torch.Tensor, start: int) -> StageOutput:
        if start != self._length:
            raise RuntimeError(f"zero stage: KV length {self._length} != position {start}")
        T = x.shape[0]
        self._length += T
        if self.is_first:
            h = torch.zeros(T, self.hidden_size)
            h[:, 0] = x.float()  # h: [T, d], the token id rides along
        else:
            h = x
        logits = None
        if self.is_last:
            logits = torch.zeros(T, self.vocab)
            logits[torch.arange(T), (h[:, 0].long() + 1) % self.vocab] = 1.0
        return StageOutput(hidden=h, anchors={}, logits=logits)

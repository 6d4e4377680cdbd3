"""BENCHMARK ONLY: a stage that computes nothing, to measure the runtime's own per-cycle cost.

It keeps the KV-length bookkeeping of a real stage and passes a [T, d] hidden state on whose first
component carries the token id; the last stage "predicts" token + 1 (one-hot logits), so a
scripted drafter proposing x+1, x+2, ... is always accepted and every cycle is a steady-state one.
"""

from __future__ import annotations

import torch

from spd.core.stage import StageOutput


class ZeroComputeStage:
    def __init__(self, index: int, n: int, hidden: int, vocab: int, rows: int = 1):
        self.is_first, self.is_last = index == 1, index == n
        self.hidden_size, self.vocab, self.rows = hidden, vocab, rows
        self.layer_ids = [index - 1]
        self._lengths: dict[int, int] = {}  # slot -> KV length

    @property
    def kv_length(self) -> int:
        return self.kv_length_of(0)

    def kv_length_of(self, slot: int) -> int:
        return self._lengths.get(slot, 0)

    def truncate(self, length: int, slot: int = 0) -> None:
        self._lengths[slot] = min(self.kv_length_of(slot), length)

    def release(self, slot: int) -> None:
        self._lengths.pop(slot, None)

    def forward_rows(self, batch: list[tuple[int, torch.Tensor, int]]) -> list[StageOutput]:
        return [self(x, start, slot) for slot, x, start in batch]

    def __call__(self, x: torch.Tensor, start: int, slot: int = 0) -> StageOutput:
        if start != self.kv_length_of(slot):
            raise RuntimeError(f"zero stage: KV length {self.kv_length_of(slot)} != position {start}")
        T = x.shape[0]
        self._lengths[slot] = start + T
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

"""A per-stage KV cache that the HF attention modules can write into, with cheap `truncate`.

HF decoder layers call `cache.update(k, v, layer_idx)` and attend over what it returns. We keep one
preallocated buffer per owned layer (capacity doubles on demand) so a decode step costs no copy of
the history, and a pipeline flush is just `truncate(length)`.
"""

from __future__ import annotations

import torch


class KVCache:
    """KV buffers for a contiguous range of decoder layers (global layer indices)."""

    def __init__(self, layer_ids: list[int], initial_capacity: int = 256):
        self._slot = {layer: i for i, layer in enumerate(layer_ids)}
        self._k: list[torch.Tensor | None] = [None] * len(layer_ids)  # each [1, H_kv, cap, D]
        self._v: list[torch.Tensor | None] = [None] * len(layer_ids)
        self._capacity = initial_capacity
        self._length = 0  # committed length: positions [0, length) are valid in every layer
        self._pending = 0  # tokens written by the forward in progress

    @property
    def length(self) -> int:
        return self._length

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self._length

    def truncate(self, length: int) -> None:
        """Forget every position >= length (a flush after a rejection)."""
        if not 0 <= length <= self._length:
            raise ValueError(f"cannot truncate KV of length {self._length} to {length}")
        self._length = length

    def update(self, k: torch.Tensor, v: torch.Tensor, layer_idx: int, *args, **kwargs):
        """Append k, v: [1, H_kv, T, D] for one layer; return the full history [1, H_kv, len+T, D]."""
        slot = self._slot[layer_idx]
        start, end = self._length, self._length + k.shape[2]
        buf_k, buf_v = self._k[slot], self._v[slot]
        if buf_k is None or buf_v is None or buf_k.shape[2] < end:
            buf_k, buf_v = self._grow(buf_k, k, end), self._grow(buf_v, v, end)
            self._k[slot], self._v[slot] = buf_k, buf_v
        buf_k[:, :, start:end] = k
        buf_v[:, :, start:end] = v
        self._pending = end - start
        return buf_k[:, :, :end], buf_v[:, :, :end]

    def commit(self) -> None:
        """Called once after all owned layers ran a forward: the new positions become history."""
        self._length += self._pending
        self._pending = 0

    def _grow(self, old: torch.Tensor | None, like: torch.Tensor, needed: int) -> torch.Tensor:
        while self._capacity < needed:
            self._capacity *= 2
        shape = (like.shape[0], like.shape[1], self._capacity, like.shape[3])
        new = torch.empty(shape, dtype=like.dtype, device=like.device)
        if old is not None:
            new[:, :, : self._length] = old[:, :, : self._length]
        return new

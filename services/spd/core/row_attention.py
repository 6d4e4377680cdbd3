"""Attention for a batch of requests that each attend over their own KV cache.

A batched decode step stacks one token of each of several requests into the batch dimension so
that the projections and the MLP read the weights once for all of them. Their caches have
different lengths, so attention cannot be one padded call without changing what each row
computes; instead the cache view returns `Rows` (one [1, H_kv, L_b, D] history per request) and
this attention runs the very same sdpa call per row that a request running alone makes. It is
registered with transformers as ROWS and passes ordinary tensors straight to sdpa, so prefill and
training paths are unchanged. Rows of several query positions (the drafter's blocks) carry one
mask per request.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

ROWS = "spd_rows"  # the attn_implementation name stages use


class Rows(list):
    """Per-request K or V histories, in batch order (padding rows have none); `masks`: per request a
    bool [1, 1, T, L_b] (True = may attend), or None (each query attends to the whole history)."""

    masks: list[torch.Tensor] | None = None


def rows_attention(module, query: torch.Tensor, key, value, attention_mask, **kwargs):
    """query: [P, H, T, D]; key/value: a tensor [P, H_kv, L, D] (plain sdpa) or Rows of [1, H_kv, L_b, D]."""
    if not isinstance(key, Rows):
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    P, H, T, D = query.shape
    out = query.new_zeros(P, T, H, D)  # [P, T, H, D], sdpa's output layout; padding rows stay zero
    for b, (k, v) in enumerate(zip(key, value)):
        mask = key.masks[b] if key.masks is not None else None
        out[b:b + 1] = sdpa_attention_forward(module, query[b:b + 1], k, v, mask, **kwargs)[0]
    return out, None


class RowsCache:
    """What the HF layers see as `past_key_values` in a batched decode: row b appends to caches[b]."""

    def __init__(self, caches: list, masks: list[torch.Tensor] | None = None):
        self.caches, self.masks = caches, masks

    def update(self, k: torch.Tensor, v: torch.Tensor, layer_idx: int, *args, **kwargs):
        """k, v: [P, H_kv, T, D] -> Rows of each request's full history (rows past the caches: padding)."""
        ks, vs = Rows(), Rows()
        ks.masks = self.masks
        for b, cache in enumerate(self.caches):
            K, V = cache.update(k[b:b + 1], v[b:b + 1], layer_idx)
            ks.append(K)
            vs.append(V)
        return ks, vs


AttentionInterface.register(ROWS, rows_attention)

"""Attention masks (boolean, True = may attend) in the [1, 1, Q, K] layout HF's sdpa path takes."""

from __future__ import annotations

import torch


def causal_mask(q_len: int, past: int, device) -> torch.Tensor | None:
    """Query i (absolute position past+i) sees keys 0..past+i. None when q_len == 1 (sees all)."""
    if q_len == 1:
        return None
    q = torch.arange(past, past + q_len, device=device).unsqueeze(1)  # [Q, 1]
    k = torch.arange(past + q_len, device=device).unsqueeze(0)  # [1, K]
    return (k <= q)[None, None]  # [1, 1, Q, K]

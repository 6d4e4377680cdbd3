"""Aligned training forward (DESIGN §3, §7): every position's staircase in one masked PDM forward.

For a sequence of T positions, a fill level `a` and a schedule `s0` (pre 0, post 1), the staircase
ending at position t holds t-o at depth s0+o for o < a; everything older is at depth n. The
state of position i inside the staircase ending at t = i+o depends only on (i, o): it sees its
predecessor δ steps back at depth s0+o+δ if o+δ < a, else at depth n. So one copy of the sequence
per depth in D = {s0, ..., s0+a-1} ∪ {n} (rows (k, i)) with the mask

    query (k, i) may attend key (k', j)  iff  j <= i  and  k' = depth_at(k, i-j)
    depth_at(k, δ) = k+δ if k < s0+a and k-s0+δ < a else n

reproduces exactly, for every t at once, what the incremental inference staircase computes (the
drafter runs a plain causal forward over [cached depth-n positions, staircase]); this holds for any
number of PDM layers. The newest position of the staircase ending at t is row (s0, t): that is
where the loss is taken.
"""

from __future__ import annotations

import torch

from spd.core.pdm import PDM
from spd.core.split import PipelineSplit


def copy_depths(n: int, a: int, s0: int) -> list[int]:
    """Depths with a copy of the sequence: the staircase depths and n (deduplicated, ascending)."""
    if not 1 <= a <= n:
        raise ValueError(f"fill level must be in 1..{n}, got {a}")
    return sorted({min(s0 + o, n) for o in range(a)} | {n})


def layout(T: int, n: int, a: int, s0: int, device=None):
    """Rows of the replicated sequence: depth [R], position [R], and the structural mask [R, R]
    (True = may attend). Rows are grouped by copy: row c*T + i is position i of copy depths[c]."""
    depths = copy_depths(n, a, s0)
    C = len(depths)
    dep = torch.tensor(depths, device=device).repeat_interleave(T)  # [R]
    pos = torch.arange(T, device=device).repeat(C)  # [R]
    delta = pos[:, None] - pos[None, :]  # [R, R] i - j
    in_stair = dep < s0 + a  # queries that sit in the staircase (offset o = dep - s0)
    o = (dep - s0)[:, None]
    want = torch.where(in_stair[:, None] & (o + delta < a), dep[:, None] + delta, torch.full_like(delta, n))
    want = want.clamp(max=n)
    mask = (delta >= 0) & (dep[None, :] == want)
    return dep, pos, mask


def eligible_counts(pdm: PDM, split: PipelineSplit) -> torch.Tensor:
    """Number of eligible anchors (a prefix of the sorted anchors) for each depth 0..n."""
    anchors = tuple(pdm.config.anchors)
    return torch.tensor([len(split.eligible(anchors, k)) for k in range(split.n + 1)])


def aligned_hidden(pdm: PDM, anchors: torch.Tensor, split: PipelineSplit, a: int, s0: int) -> tuple[torch.Tensor, int]:
    """anchors: [T, m, d] (the PDM's anchors, in order) -> PDM hidden states of every row [R, w],
    and the index of the copy at depth s0 (rows c*T .. c*T+T-1 are the newest positions)."""
    T = anchors.shape[0]
    n = split.n
    dep, pos, mask = layout(T, n, a, s0, anchors.device)
    ne = eligible_counts(pdm, split).to(anchors.device)[dep]
    g = pdm.fuse(anchors[pos], ne)  # [R, w]
    h = pdm.hidden(g, pos, mask[None, None])
    c = copy_depths(n, a, s0).index(min(s0, n))
    return h, c


def aligned_logits(pdm: PDM, anchors: torch.Tensor, split: PipelineSplit, a: int, s0: int,
                   rows: torch.Tensor | None = None) -> torch.Tensor:
    """Draft logits at the newest staircase position for each t (or the positions `rows`): [T|len(rows), V_s]."""
    T = anchors.shape[0]
    h, c = aligned_hidden(pdm, anchors, split, a, s0)
    newest = h[c * T:(c + 1) * T]
    if rows is not None:
        newest = newest[rows]
    return pdm.logits(newest)

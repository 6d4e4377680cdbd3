"""Aligned training forward (design §3, §7): every position's staircase in one masked PDM forward.

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

Each query reads exactly one copy per predecessor: the depth-n copy beyond a band of at most a
offsets. `aligned_hidden_fast` (the training path) computes attention that way, one [T, T] product
per copy plus the band diagonals, instead of one [C*T, C*T] masked product (C x less work; equal to
`aligned_hidden`, the masked reference, to rounding; tested).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

import torch
from transformers.models.qwen3.modeling_qwen3 import Qwen3DecoderLayer

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
                   rows: torch.Tensor | None = None, dense: bool = False) -> torch.Tensor:
    """Draft logits at the newest staircase position for each t (or the positions `rows`): [T|len(rows), V_s].
    `dense`: the reference path through the full [R, R] mask (same result, slower)."""
    T = anchors.shape[0]
    h, c = (aligned_hidden if dense else aligned_hidden_fast)(pdm, anchors, split, a, s0)
    newest = h[c * T:(c + 1) * T]
    if rows is not None:
        newest = newest[rows]
    return pdm.logits(newest)


def _copy_sources(n: int, a: int, s0: int) -> list[list[int]]:
    """For each copy c, src[c][δ] = the copy whose keys position i of copy c reads at offset δ, for
    the band δ < len(src[c]) (beyond it: the depth-n copy, the last one)."""
    depths = copy_depths(n, a, s0)
    out = []
    for k in depths:
        o = k - s0
        band = a - o if k < s0 + a else 0
        out.append([depths.index(min(k + d, n)) for d in range(max(band, 0))])
    return out


def _staircase_attention(q, k, v, T: int, sources: list[list[int]], scale: float):
    """Attention under the layout's mask without forming it: q, k, v [H, C*T, D] (k, v already
    repeated to H heads). Copy c's query at i reads copy sources[c][δ] at j = i - δ inside its band
    and the depth-n copy (the last) further back; so each copy costs one [T, T] product against
    the depth-n keys plus a few diagonals, instead of a [C*T, C*T] one."""
    H, _, D = q.shape
    C = len(sources)
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    kn, vn = k[:, (C - 1) * T:], v[:, (C - 1) * T:]  # depth-n copy: [H, T, D]
    outs = []
    for c, band in enumerate(sources):
        qc = q[:, c * T:(c + 1) * T]  # [H, T, D]
        s = (qc @ kn.transpose(1, 2)) * scale  # [H, T, T]
        keep = causal.clone()
        diags = []
        for d, src in enumerate(band):
            i = torch.arange(d, T, device=q.device)
            keep[i, i - d] = False  # these entries come from copy `src`, not from depth n
            ks = k[:, src * T:(src + 1) * T]
            diags.append(((qc[:, d:] * ks[:, :T - d]).sum(-1) * scale, d, src))  # [H, T - d]
        s = s.masked_fill(~keep, float("-inf"))
        # softmax over the row's real keys: the depth-n entries and the band diagonals together
        parts = [s] + [torch.nn.functional.pad(x, (d, 0), value=float("-inf")).unsqueeze(-1) for x, d, _ in diags]
        m = torch.cat([p.amax(-1, keepdim=True) for p in parts], -1).amax(-1, keepdim=True)  # [H, T, 1]
        es = torch.exp(s - m)
        ed = [torch.exp(p - m) for p in parts[1:]]  # each [H, T, 1]
        z = es.sum(-1, keepdim=True) + sum(e for e in ed) if ed else es.sum(-1, keepdim=True)
        out = es @ vn  # [H, T, D]
        for e, (_, d, src) in zip(ed, diags):
            vs = torch.nn.functional.pad(v[:, src * T:(src + 1) * T][:, :T - d], (0, 0, d, 0))  # value at i - d, row i
            out = out + e * vs
        outs.append(out / z)
    return torch.cat(outs, 1)  # [H, C*T, D]


def aligned_hidden_fast(pdm: PDM, anchors: torch.Tensor, split: PipelineSplit, a: int, s0: int) -> tuple[torch.Tensor, int]:
    """`aligned_hidden` with the staircase attention written out (same result, ~C x less attention)."""
    import sys

    T = anchors.shape[0]
    n = split.n
    depths = copy_depths(n, a, s0)
    dep = torch.tensor(depths, device=anchors.device).repeat_interleave(T)
    pos = torch.arange(T, device=anchors.device).repeat(len(depths))
    ne = eligible_counts(pdm, split).to(anchors.device)[dep]
    h = pdm.fuse(anchors[pos], ne)[None]  # [1, R, w]
    cos, sin = pdm.rotary(h, pos[None])
    sources = _copy_sources(n, a, s0)
    for layer in cast(Iterable[Qwen3DecoderLayer], pdm.layers):  # PDM builds Qwen3 decoder layers
        attn = layer.self_attn
        rotary = sys.modules[type(attn).__module__].apply_rotary_pos_emb
        x = layer.input_layernorm(h)
        hd = attn.head_dim
        q = attn.q_norm(attn.q_proj(x).view(1, -1, attn.config.num_attention_heads, hd)).transpose(1, 2)
        k = attn.k_norm(attn.k_proj(x).view(1, -1, attn.config.num_key_value_heads, hd)).transpose(1, 2)
        v = attn.v_proj(x).view(1, -1, attn.config.num_key_value_heads, hd).transpose(1, 2)
        q, k = rotary(q, k, cos, sin)  # [1, H, R, D], [1, H_kv, R, D]
        g = q.shape[1] // k.shape[1]
        o = _staircase_attention(q[0], k[0].repeat_interleave(g, 0), v[0].repeat_interleave(g, 0), T, sources, attn.scaling)
        h = h + attn.o_proj(o.transpose(0, 1).reshape(1, -1, q.shape[1] * hd))
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    return h[0], depths.index(min(s0, n))

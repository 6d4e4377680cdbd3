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

`aligned_hidden` (the reference) runs that forward over all C·T rows through the dense [C·T, C·T]
mask. The training path `aligned_batch_hidden` computes the same states at the loss rows only:

* Rows: the copy at staircase offset o (depth s0+o < n) is read only along a loss row's diagonal,
  so only its positions t-o for loss positions t are needed; the depth-n copy up to the last loss
  position (`needed_rows`). Over a prompt, only the depth-n copy is left.
* Last layer: only the loss rows need an output; every other row there only gives keys and values.
* Attention written out: each query reads one copy per predecessor, the band diagonals (δ < its
  band, gathered per row) and the depth-n copy beyond them, in one softmax; no [R, R] mask.
* Batch: several sequences (each its own fill level) are packed row after row for the fusion,
  projections and MLP; the depth-n keys are padded per sequence.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import cast

import torch
from transformers.models.qwen3.modeling_qwen3 import Qwen3DecoderLayer, rotate_half

from spd.core.pdm import PDM
from spd.core.split import PipelineSplit


def copy_depths(n: int, a: int, s0: int) -> list[int]:
    """Depths with a copy of the sequence: the staircase depths and n (deduplicated, ascending)."""
    if not 1 <= a <= n:
        raise ValueError(f"fill level must be in 1..{n}, got {a}")
    return sorted({min(s0 + o, n) for o in range(a)} | {n})


def band(k: torch.Tensor, n: int, a, s0: int) -> torch.Tensor:
    """Staircase band of rows at depths k: a row reads its predecessors δ < band back at depth k+δ
    (at most n) and everything older at depth n; 0 for the depth-n copy (it reads depth n only)."""
    return torch.where(k < n, (s0 + a - k).clamp(min=0), 0)


def depth_at(k, delta, bl, n: int) -> torch.Tensor:
    """The depth at which a row at depth k with band bl sees its predecessor δ steps back: k + δ
    (at most n) inside the band, n beyond it. Arguments broadcast."""
    return torch.where(delta < bl, (k + delta).clamp(max=n), n)


def may_attend(qdep, qpos, kdep, kpos, n: int, a, s0: int) -> torch.Tensor:
    """The staircase mask (True = may attend) between query rows (qdep, qpos) and key rows (kdep,
    kpos); all arguments broadcast (e.g. queries [.., Q, 1], keys [.., 1, K], a int or [.., 1, 1])."""
    delta = qpos - kpos  # i - j
    return (delta >= 0) & (kdep == depth_at(qdep, delta, band(qdep, n, a, s0), n))


def prev_input(anchors: torch.Tensor, dep: torch.Tensor, pos: torch.Tensor, bl: torch.Tensor,
               ne_of_depth: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The `prev` argument of pdm.fuse (a PDM with config.prev) for rows at depth dep [R], position
    pos [R], band bl [R] of one sequence's anchors [T, m, d]: the predecessors' anchors [R, m, d] and
    eligible counts [R] (0 at position 0)."""
    ne = torch.where(pos > 0, ne_of_depth[depth_at(dep, 1, bl, int(ne_of_depth.numel()) - 1)], 0)
    return anchors[(pos - 1).clamp(min=0)], ne


def layout(T: int, n: int, a: int, s0: int, device=None):
    """Rows of the replicated sequence: depth [R], position [R], and the structural mask [R, R]
    (True = may attend). Rows are grouped by copy: row c*T + i is position i of copy depths[c]."""
    depths = copy_depths(n, a, s0)
    dep = torch.tensor(depths, device=device).repeat_interleave(T)  # [R]
    pos = torch.arange(T, device=device).repeat(len(depths))  # [R]
    return dep, pos, may_attend(dep[:, None], pos[:, None], dep[None], pos[None], n, a, s0)


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
    counts = eligible_counts(pdm, split).to(anchors.device)  # [n + 1]
    prev = prev_input(anchors, dep, pos, band(dep, n, a, s0), counts) if pdm.config.prev else None
    g = pdm.fuse(anchors[pos], counts[dep], prev)  # [R, w]
    h = pdm.hidden(g, pos, mask[None, None])
    c = copy_depths(n, a, s0).index(min(s0, n))
    return h, c


def aligned_logits(pdm: PDM, anchors: torch.Tensor, split: PipelineSplit, a: int, s0: int,
                   rows: torch.Tensor | None = None, dense: bool = False) -> torch.Tensor:
    """Draft logits at the newest staircase position for each t (or the ascending positions `rows`):
    [T|len(rows), V_s]. `dense`: the reference path through the full [R, R] mask (same result, slower)."""
    T = anchors.shape[0]
    rows = torch.arange(T, device=anchors.device) if rows is None else rows
    if not dense:
        return pdm.logits(aligned_batch_hidden(pdm, [(anchors, a, rows)], split, s0))
    h, c = aligned_hidden(pdm, anchors, split, a, s0)
    return pdm.logits(h[c * T:(c + 1) * T][rows])


def needed_rows(rows: torch.Tensor, n: int, a: int, s0: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows that the loss rows at the ascending positions `rows` depend on, through any number of
    layers: copy depth k < n (offset o = k - s0) at positions rows - o >= 0 (a copy is read only
    along a loss row's diagonal), the depth-n copy at 0..rows[-1]. Their depth [R] and position [R],
    grouped by copy (ascending depth), ascending positions."""
    pos = [torch.arange(int(rows[-1]) + 1, device=rows.device) if k == n else rows[rows >= k - s0] - (k - s0)
           for k in copy_depths(n, a, s0)]
    dep = torch.cat([torch.full_like(p, k) for k, p in zip(copy_depths(n, a, s0), pos)])
    return dep, torch.cat(pos)


@dataclass
class Packed:
    """The needed rows of several sequences packed one sequence after another (N rows), and for each
    row its keys in the written-out form of the mask: the band diagonals (δ < A = the largest fill
    level) and the depth-n copy up to `lim`. Sequence b's depth-n rows are padded to Tn."""

    dep: torch.Tensor  # [N] depth
    pos: torch.Tensor  # [N] position
    lim: torch.Tensor  # [N] the newest depth-n position it reads beyond its band (pos - band)
    band: torch.Tensor  # [N, A] packed index of the key it reads δ back inside its band (0: none)
    band_ok: torch.Tensor  # [N, A] whether there is one
    depth_n: torch.Tensor  # [B, Tn] packed index of sequence b's depth-n row j (padding: its last)
    loss: torch.Tensor  # [N_L] packed index of the loss rows (copy min(s0, n)), sequence by sequence
    counts: torch.Tensor  # [B] rows per sequence
    loss_counts: torch.Tensor  # [B] loss rows per sequence


def pack(items: list[tuple[int, torch.Tensor]], n: int, s0: int) -> Packed:
    """items: per sequence (fill level a, ascending loss positions [L_b]) -> the packed layout."""
    dev = items[0][1].device
    A = max(a for a, _ in items)
    cols: dict[str, list[torch.Tensor]] = {k: [] for k in ("dep", "pos", "lim", "band", "band_ok", "depth_n", "loss")}
    off = 0
    for a, rows in items:
        dep, pos = needed_rows(rows, n, a, s0)
        T = int(rows[-1]) + 1
        where = torch.full((n + 1, T), -1, dtype=torch.long, device=dev)  # packed index of (depth, position)
        where[dep, pos] = off + torch.arange(len(dep), device=dev)
        bl = band(dep, n, a, s0)  # [R]
        delta = torch.arange(A, device=dev)  # [A]
        src = where[(dep[:, None] + delta).clamp(max=n), (pos[:, None] - delta).clamp(min=0)]  # [R, A]
        ok = (delta < bl[:, None]) & (pos[:, None] >= delta)
        for k, v in (("dep", dep), ("pos", pos), ("lim", pos - bl),
                     ("band", torch.where(ok, src, 0)), ("band_ok", ok), ("depth_n", where[n]),
                     ("loss", where[min(s0, n), rows])):
            cols[k].append(v)
        off += len(dep)
    Tn = max(len(x) for x in cols["depth_n"])
    depth_n = torch.stack([torch.cat([x, x[-1:].expand(Tn - len(x))]) for x in cols["depth_n"]])  # [B, Tn]
    cat = {k: torch.cat(v) for k, v in cols.items() if k != "depth_n"}
    counts = torch.tensor([len(x) for x in cols["dep"]], device=dev)
    loss_counts = torch.tensor([len(x) for x in cols["loss"]], device=dev)
    return Packed(cat["dep"], cat["pos"], cat["lim"], cat["band"], cat["band_ok"], depth_n,
                  cat["loss"], counts, loss_counts)


def _padded(counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows grouped by sequence (counts [B] each) -> their padded view: index [B, W] into the rows
    (padding: 0) and where each row sits in [B * W] [sum counts]."""
    W = int(counts.max())
    j = torch.arange(W, device=counts.device)  # [W]
    starts = counts.cumsum(0) - counts  # [B]
    index = torch.where(j < counts[:, None], starts[:, None] + j, 0)  # [B, W]
    return index, (j < counts[:, None]).flatten().nonzero()[:, 0]


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [N, heads, D]; cos, sin: [N, D] -> x rotated (apply_rotary_pos_emb, for one tensor)."""
    return x * cos[:, None] + rotate_half(x) * sin[:, None]


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p: Packed, rows: torch.Tensor,
               counts: torch.Tensor, scale: float) -> torch.Tensor:
    """Staircase attention of the packed rows `rows` [N_q] (per sequence `counts` [B]): q [N_q, H, D]
    their queries, k, v [N, H_kv, D] every row's keys/values -> [N_q, H * D]. Scores against the
    sequence's depth-n keys (padded, [B, H, Q, Tn]) and the band diagonals ([N_q, A, H]) share one
    softmax (fp32)."""
    H, D = q.shape[1:]
    g = H // k.shape[1]
    index, unpad = _padded(counts)  # [B, Q], [N_q]
    B, Q = index.shape
    kn = k[p.depth_n].repeat_interleave(g, 2).transpose(1, 2)  # [B, H, Tn, D]
    vn = v[p.depth_n].repeat_interleave(g, 2).transpose(1, 2)
    s_n = q[index].transpose(1, 2) @ kn.transpose(2, 3) * scale  # [B, H, Q, Tn]
    late = torch.arange(kn.shape[2], device=q.device) > p.lim[rows][index][..., None]  # [B, Q, Tn]
    s_n = s_n.float().masked_fill(late[:, None], float("-inf"))
    kb = k[p.band[rows]].repeat_interleave(g, 2)  # [N_q, A, H, D]
    vb = v[p.band[rows]].repeat_interleave(g, 2)
    s_b = ((q[:, None] * kb).sum(-1) * scale).float().masked_fill(~p.band_ok[rows][..., None], float("-inf"))  # [N_q, A, H]
    w = torch.softmax(torch.cat([s_n, s_b[index].permute(0, 3, 1, 2)], -1), -1).to(v.dtype)  # [B, H, Q, Tn + A]
    Tn = kn.shape[2]
    o_n = (w[..., :Tn] @ vn).transpose(1, 2).reshape(B * Q, H * D)[unpad]  # [N_q, H * D]
    w_b = w[..., Tn:].permute(0, 2, 3, 1).reshape(B * Q, -1, H)[unpad]  # [N_q, A, H]
    return o_n + (w_b[..., None] * vb).sum(1).reshape(-1, H * D)


def _layer(layer: Qwen3DecoderLayer, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, p: Packed,
           last: bool) -> torch.Tensor:
    """One decoder layer over the packed rows h [N, w] (the layer's own modules and math): the new
    states of every row [N, w], or in the `last` layer of the loss rows only [N_L, w]."""
    attn = layer.self_attn
    hd = attn.head_dim
    x = layer.input_layernorm(h)  # [N, w]
    k = _rope(attn.k_norm(attn.k_proj(x).view(len(x), -1, hd)), cos, sin)  # [N, H_kv, D]
    v = attn.v_proj(x).view(len(x), -1, hd)  # [N, H_kv, D]
    rows, counts = torch.arange(len(h), device=h.device), p.counts  # queries: every row
    if last:  # only the loss rows
        rows, counts, h, x, cos, sin = p.loss, p.loss_counts, h[p.loss], x[p.loss], cos[p.loss], sin[p.loss]
    q = _rope(attn.q_norm(attn.q_proj(x).view(len(x), -1, hd)), cos, sin)  # [N_q, H, D]
    h = h + attn.o_proj(_attention(q, k, v, p, rows, counts, attn.scaling))
    return h + layer.mlp(layer.post_attention_layernorm(h))


def aligned_batch_hidden(pdm: PDM, items: list[tuple[torch.Tensor, int, torch.Tensor]], split: PipelineSplit,
                         s0: int) -> torch.Tensor:
    """items: per sequence (anchors [T_b, m, d] (any float dtype: read as fp32), fill level a_b,
    ascending loss positions [L_b]) -> PDM hidden states (before the final norm) at the loss rows of all of them, sequence after
    sequence: [sum L_b, w]. Equal to `aligned_hidden`'s rows (k = s0, t) per sequence, to rounding
    (tested)."""
    p = pack([(a, rows) for _, a, rows in items], split.n, s0)
    pos = torch.split(p.pos, p.counts.tolist())
    anchors = torch.cat([x[i].float() for (x, _, _), i in zip(items, pos)])  # [N, m, d]
    counts = eligible_counts(pdm, split).to(p.dep.device)  # [n + 1]
    prev = None
    if pdm.config.prev:  # each sequence's predecessor rows, from its own anchors
        parts = [prev_input(x, d, i, i - lim, counts) for (x, _, _), d, i, lim in
                 zip(items, torch.split(p.dep, p.counts.tolist()), pos, torch.split(p.lim, p.counts.tolist()))]
        prev = torch.cat([x.float() for x, _ in parts]), torch.cat([c for _, c in parts])  # [N, m, d], [N]
    h = pdm.fuse(anchors, counts[p.dep], prev)  # [N, w]
    cos, sin = (x[0] for x in pdm.rotary(h[None], p.pos[None]))  # [N, D] each
    layers = list(cast(Iterable[Qwen3DecoderLayer], pdm.layers))  # PDM builds Qwen3 decoder layers
    for i, layer in enumerate(layers):
        h = _layer(layer, h, cos, sin, p, last=i == len(layers) - 1)
    return h

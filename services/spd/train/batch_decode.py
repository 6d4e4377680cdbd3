"""Continuous-batching decoding of many prompts with an HF causal LM (for self-generated data).

Up to B rows decode together; a row that finishes frees its slot and a new prompt is prefilled and
placed there, so the batch stays full instead of idling on the longest answer. The model's own HF
decoder layers run with a preallocated KV buffer (no per-step copy of the history, unlike HF's
DynamicCache) and explicit masks:

  buffer  k, v: [B, H_kv, C, D] per layer; every row writes its next token at the shared column `c`
  row b   holds real entries in columns [start[b], c); its next position is c - start[b]

A new prompt of length P goes into columns [c - P, c) of a free slot (right-aligned). Attention of a
decode step reads the whole buffer (masked): a contiguous buffer is ~5x faster to multiply on this
CPU than a strided window of it, so the buffer is kept tight instead: when c reaches C, or a prompt
needs more room before c, it is re-laid out to the live window plus `slack` columns.

With a `FeatureRecorder` (spd.train.recorder) the same passes also record the teacher's anchor
states and top-k for every generated sequence: generation and teacher features in one pass.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from spd.train.recorder import FeatureRecorder


class _BufferCache:
    """What HF attention modules call as `past_key_values`: writes the step's k, v at the columns
    `cols` and returns the window [lo, hi) of every row."""

    def __init__(self, bufs: list[list[torch.Tensor]], layer_ids: list[int]):
        self.bufs = bufs
        self.slot = {layer: i for i, layer in enumerate(layer_ids)}
        self.cols = slice(0, 0)
        self.rows: torch.Tensor | slice = slice(None)
        self.window = slice(0, 0)

    def update(self, k, v, layer_idx, *args, **kwargs):  # k, v: [b, H_kv, T, D]
        bk, bv = self.bufs[self.slot[layer_idx]]
        bk[self.rows, :, self.cols] = k
        bv[self.rows, :, self.cols] = v
        return bk[self.rows, :, self.window], bv[self.rows, :, self.window]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.window.stop - self.window.start


@dataclass
class _Row:
    job: int  # caller's id
    temp: float  # 0 = greedy
    prompt: list[int]
    out: list[int] = field(default_factory=list)


class BatchDecoder:
    """Greedy / sampled decoding, rows joining and leaving (see the module docstring)."""

    def __init__(self, model, batch: int, max_new: int, eos_id: int, seed: int = 0,
                 slack: int = 32, recorder: FeatureRecorder | None = None):
        self.model, self.B, self.max_new, self.eos = model, batch, max_new, eos_id
        self.inner = model.model
        cfg = model.config
        self.slack = slack
        self.kv_shape = (cfg.num_key_value_heads, getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
        p = next(model.parameters())
        self.dtype, self.device = p.dtype, p.device
        self.C, self.c = 0, 0  # buffer width; next column every row writes
        self.bufs = self._alloc(0)
        self.cache = _BufferCache(self.bufs, list(range(cfg.num_hidden_layers)))
        self.start = torch.zeros(batch, dtype=torch.long, device=self.device)  # [B] first real column per slot (c when free)
        self.rows: list[_Row | None] = [None] * batch
        self.next = torch.zeros(batch, dtype=torch.long, device=self.device)  # [B] token each slot feeds next
        self.gen = torch.Generator(self.device).manual_seed(seed)
        self.recorder = recorder
        self.keep = set(recorder.layers) if recorder else set()  # H[b] recorded: layer b's input (H[L]: the last output)
        if recorder:
            assert recorder.layers == sorted(self.keep) and max(self.keep) <= cfg.num_hidden_layers
            recorder.allocate(batch, max_new, cfg.hidden_size, self.device)

    # -- buffer layout -----------------------------------------------------------------------------
    def _alloc(self, width: int) -> list[list[torch.Tensor]]:
        return [[torch.zeros(self.B, *self.kv_shape[:1], width, self.kv_shape[1], dtype=self.dtype, device=self.device)
                 for _ in range(2)] for _ in range(self.model.config.num_hidden_layers)]

    def _relayout(self, before: int = 0) -> None:
        """New buffers holding the live columns [lo, c) at [off, off + c - lo), with c >= `before`
        afterwards and `slack` free columns after c."""
        live = [s for s, r in enumerate(self.rows) if r is not None]
        lo = int(self.start[live].min()) if live else self.c
        off = max(0, before - (self.c - lo))
        width = off + (self.c - lo) + self.slack
        new = self._alloc(width)
        for (nk, nv), (ok, ov) in zip(new, self.bufs):
            nk[:, :, off:off + self.c - lo] = ok[:, :, lo:self.c]
            nv[:, :, off:off + self.c - lo] = ov[:, :, lo:self.c]
        self.bufs = self.cache.bufs = new
        self.start += off - lo
        self.c, self.C = off + self.c - lo, width
        free = torch.tensor([r is None for r in self.rows], device=self.device)
        self.start[free] = self.c

    # -- model calls -------------------------------------------------------------------------------
    def _layers(self, h, pos, mask):
        """h: [b, T, d], pos: [b, T], mask: [b, 1, T, W] -> last-position logits [b, V] and the
        recorded H[b], each [b, T, d]."""
        rope = self.inner.rotary_emb(h, pos)
        states = []
        for i, layer in enumerate(self.inner.layers):
            if i in self.keep:
                states.append(h)
            h = layer(h, attention_mask=mask, position_ids=pos, past_key_values=self.cache, position_embeddings=rope)
        if len(self.inner.layers) in self.keep:
            states.append(h)
        return self.model.lm_head(self.inner.norm(h[:, -1])), states

    def _layer_step(self, layer, h, cos, sin, kb, vb, bias):
        """One decoder layer for one new token per row, attending over the whole (masked) buffer.

        The model's own projections, norms and MLP; attention written out so that grouped-query
        heads read the strided buffer directly (HF's sdpa path copies and repeats K/V each step).
        h: [B, 1, d]; kb, vb: [B, H_kv, C, D]; bias: [B, 1, 1, C] (0 or -inf)."""
        attn = layer.self_attn
        B = h.shape[0]
        hk, hd = kb.shape[1], kb.shape[3]
        x = layer.input_layernorm(h)
        q = attn.q_proj(x).view(B, 1, -1, hd)  # [B, 1, H, D]
        k = attn.k_proj(x).view(B, 1, hk, hd)
        if hasattr(attn, "q_norm"):  # Qwen3
            q, k = attn.q_norm(q), attn.k_norm(k)
        rotary = sys.modules[type(attn).__module__].apply_rotary_pos_emb
        q, k = rotary(q.transpose(1, 2), k.transpose(1, 2), cos, sin)  # [B, H, 1, D], [B, H_kv, 1, D]
        kb[:, :, self.c] = k[:, :, 0]
        vb[:, :, self.c] = attn.v_proj(x).view(B, hk, hd)
        qg = q.reshape(B, hk, -1, hd).contiguous()  # [B, H_kv, g, D]: query head i uses kv head i // g
        s = (qg @ kb.transpose(-1, -2)).float() * attn.scaling + bias  # [B, H_kv, g, C]
        o = torch.softmax(s, -1).to(vb.dtype) @ vb  # [B, H_kv, g, D]
        h = h + attn.o_proj(o.reshape(B, 1, -1))
        return h + layer.mlp(layer.post_attention_layernorm(h))

    def _choose(self, logits: torch.Tensor, temps: torch.Tensor) -> torch.Tensor:
        """logits [b, V] -> ids [b]: argmax where temp == 0, else a sample at that temperature."""
        greedy = logits.float().argmax(-1)  # (bf16 argmax is 4x slower on CPU)
        if not (temps > 0).any():
            return greedy
        probs = torch.softmax(logits.float() / temps.clamp_min(1e-3)[:, None], -1)
        return torch.where(temps > 0, torch.multinomial(probs, 1, generator=self.gen)[:, 0], greedy)

    def _prefill(self, slots: list[int], prompts: list[list[int]], temps: list[float]) -> None:
        """Run the prompts (left-padded to P) and place their KV in columns [c - len, c) of `slots`."""
        P = max(len(p) for p in prompts)
        if self.c < P:
            self._relayout(before=P)
        dev = self.device
        lens = torch.tensor([len(p) for p in prompts], device=dev)
        ids = torch.tensor([[self.eos] * (P - len(p)) + list(p) for p in prompts], device=dev)  # [b, P]
        real = torch.arange(P, device=dev)[None, :] >= (P - lens)[:, None]  # [b, P]
        pos = (real.long().cumsum(-1) - 1).clamp_min(0)  # [b, P]
        causal = torch.ones(P, P, dtype=torch.bool, device=dev).tril()
        mask = (causal[None] & real[:, None, :]) | torch.eye(P, dtype=torch.bool, device=dev)[None]  # pads see themselves
        idx = torch.tensor(slots, device=dev)
        self.cache.rows, self.cache.cols, self.cache.window = idx, slice(self.c - P, self.c), slice(self.c - P, self.c)
        logits, states = self._layers(self.inner.embed_tokens(ids), pos, mask[:, None])
        self.start[idx] = self.c - lens
        self.next[idx] = self._choose(logits, torch.tensor(temps, device=dev))
        if self.recorder:
            self.recorder.prefill(idx, [len(p) for p in prompts], states, logits)
        for s, p, t in zip(slots, prompts, temps):
            self.rows[s] = _Row(job=-1, temp=t, prompt=p)

    def _step(self) -> None:
        """One decode step for every slot: column c, window [min start, c]."""
        if self.c >= self.C:
            self._relayout()
        cols = torch.arange(self.C, device=self.device)
        mask = (cols[None, :] >= self.start[:, None]) & (cols[None, :] <= self.c)  # [B, C]
        bias = torch.zeros(mask.shape, device=self.device).masked_fill_(~mask, float("-inf"))[:, None, None]
        pos = (self.c - self.start)[:, None]  # [B, 1]
        h = self.inner.embed_tokens(self.next[:, None])  # [B, 1, d]
        cos, sin = self.inner.rotary_emb(h, pos)
        states = []
        for i, (layer, (kb, vb)) in enumerate(zip(self.inner.layers, self.bufs)):
            if i in self.keep:
                states.append(h[:, 0])
            h = self._layer_step(layer, h, cos, sin, kb, vb, bias)
        if len(self.inner.layers) in self.keep:
            states.append(h[:, 0])
        logits = self.model.lm_head(self.inner.norm(h[:, -1]))
        self.c += 1
        if self.recorder:
            fed = [(s, len(r.out) - 1) for s, r in enumerate(self.rows) if r is not None]  # (slot, response index fed)
            live, j = torch.tensor(fed, device=self.device).T
            self.recorder.step(live, j, states, logits)
        temps = torch.tensor([r.temp if r else 0.0 for r in self.rows], device=self.device)
        self.next = self._choose(logits, temps)

    # -- driver ------------------------------------------------------------------------------------
    @torch.inference_mode()
    def run(self, jobs: Sequence[tuple[int, Sequence[int], float]], on_done, refill: int = 0,
            chunk: int = 32) -> None:
        """Decode every (id, prompt, temperature); `on_done(id, response ids)` as each finishes
        (eos included when produced; at most max_new tokens); a true return from on_done ends the
        run there. Free slots are refilled once `refill` of them (default B/8) wait, so that
        prefills run as batches, not a row at a time."""
        queue = list(jobs)[::-1]
        refill = refill or max(1, self.B // 8)
        while queue or any(self.rows):
            free = [s for s, r in enumerate(self.rows) if r is None]
            if queue and len(free) >= min(refill, len(queue)):
                take = free[:len(queue)]
                for i in range(0, len(take), chunk):
                    slots = take[i:i + chunk]
                    batch = [queue.pop() for _ in slots]
                    self._prefill(slots, [list(p) for _, p, _ in batch], [t for _, _, t in batch])
                    for s, (jid, _, _) in zip(slots, batch):
                        row = self.rows[s]
                        assert row is not None  # _prefill filled the slot
                        row.job = jid
            nxt = self.next.tolist()  # one device sync per step
            for s, row in enumerate(self.rows):  # the token each slot is about to feed is its output
                if row is None:
                    continue
                tok = nxt[s]
                row.out.append(tok)
                if tok == self.eos or len(row.out) >= self.max_new:
                    if self.recorder:
                        self.recorder.finish(s, row.job, row.prompt, row.out)
                    if on_done(row.job, row.out):
                        return
                    self.rows[s] = None
                    self.start[s] = self.c
            if any(self.rows):
                self._step()

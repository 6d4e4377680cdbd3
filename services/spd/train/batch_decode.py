"""Continuous-batching decoding of many prompts with an HF causal LM (for self-generated data).

Up to B rows decode together; a row that finishes frees its slot and a new prompt is prefilled and
placed there, so the batch stays full instead of idling on the longest answer. The model's own HF
decoder layers run with a preallocated KV buffer (no per-step copy of the history, unlike HF's
DynamicCache) and explicit masks:

  buffer  k, v: [B, H_kv, C, D] per layer; every row writes its next token at the shared column `c`
  row b   holds real entries in columns [start[b], c); its next position is c - start[b]

A new prompt of length P goes into columns [c - P, c) of the lowest free slot (right-aligned).
Prompts are prefilled a few at a time, right-padded and causal (no mask to build or read), at most
`prefill_tokens` padded tokens a forward so that every activation stays in cache.

Decode attention is memory-bound: a step reads every K and V it attends over. The buffer is kept
tight: when c reaches C, or a prompt needs more room before c, it is re-laid out to the live window
plus `slack` columns, into the other of two storages that are reused (a fresh multi-GB allocation
each time costs more than the copy). The re-layout also sorts the live rows by start, oldest first,
into slots [0, used): the step then runs over those slots only (a draining batch shrinks), and its
attention runs a `group` of neighbouring slots at a time, each group over its own window [its
oldest start, c] instead of the whole buffer (rows of similar age share a group, so the groups
read about half the columns a single window would).

With a `FeatureRecorder` (spd.train.recorder) the same passes also record the teacher's anchor
states and top-k for every generated sequence: generation and teacher features in one pass.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial

import torch
import torch.nn.functional as F

from spd.train.precision import has_amx
from spd.train.recorder import FeatureRecorder


def _attention_kernels(device: torch.device):
    """On CUDA, every SDPA backend but cuDNN's: its fused attention failed on the decode step's
    strided window of the buffer with a broadcast mask (H200, torch 2.11: `mha_graph.execute(...)
    .is_good()`, first seen as CUBLAS_STATUS_EXECUTION_FAILED in the next GEMM). Elsewhere, no change."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, scale: float) -> torch.Tensor:
    """One new query per row over its window, on a CPU without AMX (see attention_for): q [b, H, 1, D];
    k, v [b, H_kv, W, D] (strided views of the buffer); bias [b, 1, 1, W] -> [b, H, 1, D] in q's
    dtype. Query head i reads kv head i // g (g = H / H_kv) in place, with scores, softmax and the
    weighted sum in fp32.

    Two batched matmuls instead of SDPA: on a 2-core Zen 4 (avx512_bf16, no AMX), for 16 rows x 9
    heads over a 400-column bf16 window, SDPA takes 4.6 ms and this 0.69 ms, with the same error
    against an fp32 reference (fp32 buffers: 0.45 vs 0.40 ms).

    It is a third of the teacher's time there (33 of 96 s over 128 prompts). Timed in the real decode
    and no faster: the same maths compiled by TorchInductor (35 s), fp32 KV buffers (33 s, twice the
    memory), bf16 matmuls (42 s), one call for the whole batch (73 s), huge pages for the buffers."""
    b, H, _, D = q.shape
    hk = k.shape[1]
    qg = q.reshape(b, hk, H // hk, D).float()  # [b, H_kv, g, D]
    s = torch.matmul(qg, k.float().transpose(-1, -2)) * scale + bias.float()  # [b, H_kv, g, W]
    o = torch.matmul(torch.softmax(s, -1), v.float())  # [b, H_kv, g, D]
    return o.reshape(b, H, 1, D).to(q.dtype)


def attention_for(device: torch.device):
    """A group's decode attention on `device`: SDPA (query head i reads kv head i // g in place) on a
    GPU and on a CPU with AMX; `decode_attention`'s fp32 matmuls on a CPU without AMX.

    With AMX (Xeon, 2 threads), for 16 rows x 9 heads over a 400-column bf16 window: SDPA 0.58 ms,
    fp32 matmuls 1.06 ms, bf16 matmuls 1.34 ms; in place over the bench's 128 prompts the teacher's
    attention took 37 s against 53 s. Without AMX, see decode_attention (SDPA ~6.6x slower there;
    on a Zen 5, 3.1 ms against its 0.53)."""
    if device.type == "cpu" and not has_amx():
        return decode_attention
    return partial(F.scaled_dot_product_attention, enable_gqa=True)


def sample(logits: torch.Tensor, temps: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """logits [h, V], temps [h] (> 0) -> ids [h], each drawn from softmax(logits / T) (fp32) by
    inverting its CDF with one uniform a row: with F(v) = p_0 + ... + p_v and u ~ U[0, F(V-1)),
    id = the first v with F(v) > u, so P(id = v) = F(v) - F(v-1) = p_v, up to fp32 rounding (a
    zero-probability id is not drawn). One cumsum and a binary search: at [128, 49152], 89 ms against
    torch.multinomial's 251 ms on a 2-core Zen 1."""
    probs = torch.softmax(logits.float() / temps[:, None].clamp_min(1e-3), -1)  # [h, V]
    cdf = probs.cumsum(-1)  # [h, V]
    u = torch.rand(len(cdf), 1, generator=gen, device=cdf.device) * cdf[:, -1:]  # [h, 1]
    return torch.searchsorted(cdf, u, right=True)[:, 0].clamp_max(cdf.shape[1] - 1)


class _KVCapture:
    """What HF attention modules call as `past_key_values` in a prefill: each layer attends over
    exactly its new k, v, kept here to be placed in the buffer afterwards."""

    def __init__(self):
        self.kv: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # layer -> k, v: [b, H_kv, P, D]

    def update(self, k, v, layer_idx, *args, **kwargs):
        self.kv[layer_idx] = (k, v)
        return k, v

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0


@dataclass
class _Row:
    job: int  # caller's id
    temp: float  # 0 = greedy
    prompt: list[int]
    out: list[int] = field(default_factory=list)


class BatchDecoder:
    """Greedy / sampled decoding, rows joining and leaving (see the module docstring)."""

    def __init__(self, model, batch: int, max_new: int, eos_id: int, seed: int = 0,
                 slack: int = 32, group: int = 0, recorder: FeatureRecorder | None = None):
        self.model, self.B, self.max_new, self.eos = model, batch, max_new, eos_id
        self.inner = model.model
        cfg = model.config
        self.slack = slack
        self.kv_shape = (cfg.num_key_value_heads, getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
        p = next(model.parameters())
        self.dtype, self.device = p.dtype, p.device
        # rows per attention call: on a CPU, groups over their own windows read less (measured: 2/3 of
        # the attention time); elsewhere one call for the batch, as before (groups not measured there)
        self.group = group or (16 if self.device.type == "cpu" else batch)
        self.attend = attention_for(self.device)  # a group's decode attention
        self.C, self.c = 0, 0  # buffer width; next column every row writes
        self.store = self.spare = torch.zeros(0, dtype=self.dtype, device=self.device)  # the two storages
        self.widest = 0  # buffer width the storages are sized for: a live row spans <= prompt + max_new
        self.bufs = self._alloc(0)
        self.start = torch.zeros(batch, dtype=torch.long, device=self.device)  # [B] first real column per slot (c when free)
        self.rows: list[_Row | None] = [None] * batch
        self.used = 0  # slots [0, used) hold every live row: a step runs over these
        self.home = torch.arange(batch, device=self.device)  # [B] the recorder's slot of each slot's row (fixed for its life)
        self.next = torch.zeros(batch, dtype=torch.long, device=self.device)  # [B] token each slot feeds next
        self.gen = torch.Generator(self.device).manual_seed(seed)
        self.recorder = recorder
        self.keep = set(recorder.layers) if recorder else set()  # H[b] recorded: layer b's input (H[L]: the last output)
        if recorder:
            assert recorder.layers == sorted(self.keep) and max(self.keep) <= cfg.num_hidden_layers
            recorder.allocate(batch, max_new, cfg.hidden_size, self.device)

    # -- buffer layout -----------------------------------------------------------------------------
    def _alloc(self, width: int) -> list[list[torch.Tensor]]:
        """Contiguous k, v buffers [B, H_kv, width, D] per layer, in the spare storage, which becomes
        the current one. Reused columns hold stale but finite values: outside a row's window they
        are masked to -inf, so they weigh exactly 0."""
        need = self._numel(width)
        if self.spare.numel() < need:  # (once per run: first touching GBs of fresh memory is slow)
            self.spare = torch.zeros(max(need, self._numel(self.widest)), dtype=self.dtype, device=self.device)
        self.store, self.spare = self.spare, self.store
        L, (hk, hd) = self.model.config.num_hidden_layers, self.kv_shape
        view = self.store[:need].view(L, 2, self.B, hk, width, hd)
        return [[view[i, 0], view[i, 1]] for i in range(L)]

    def _numel(self, width: int) -> int:
        return self.model.config.num_hidden_layers * 2 * self.B * self.kv_shape[0] * width * self.kv_shape[1]

    def _relayout(self, before: int = 0) -> None:
        """New buffers holding the live rows, oldest first, in slots [0, used), their columns [lo, c)
        at [off, off + c - lo), with c >= `before` afterwards and `slack` free columns after c."""
        starts = self.start.tolist()  # (one device sync)
        live = sorted((s for s, r in enumerate(self.rows) if r is not None), key=starts.__getitem__)
        order = live + [s for s, r in enumerate(self.rows) if r is None]
        lo = starts[live[0]] if live else self.c
        off = max(0, before - (self.c - lo))
        width = off + (self.c - lo) + self.slack
        old, self.bufs = self.bufs, self._alloc(width)
        n, w, idx = len(live), self.c - lo, torch.tensor(live, dtype=torch.long, device=self.device)
        if n and w:
            for (nk, nv), (ok, ov) in zip(self.bufs, old):
                nk[:n, :, off:off + w] = ok[:, :, lo:self.c].index_select(0, idx)
                nv[:n, :, off:off + w] = ov[:, :, lo:self.c].index_select(0, idx)
        perm = torch.tensor(order, device=self.device)
        self.rows = [self.rows[s] for s in order]
        self.next, self.home = self.next[perm], self.home[perm]
        self.start = self.start[perm] + off - lo
        self.c, self.C, self.used = off + w, width, n
        self.start[n:] = self.c

    # -- model calls -------------------------------------------------------------------------------
    def _layers(self, ids, lens, cap: _KVCapture):
        """ids: [b, P] right-padded, lens [b] -> the logits of each row's last prompt position [b, V]
        and the recorded H[b], each [b, P, d]; the k, v of every layer land in `cap`."""
        h = self.inner.embed_tokens(ids)  # [b, P, d]
        pos = torch.arange(ids.shape[1], device=self.device)[None].expand(ids.shape[0], -1)  # [b, P]
        rope = self.inner.rotary_emb(h, pos)
        states = []
        for i, layer in enumerate(self.inner.layers):
            if i in self.keep:
                states.append(h)
            h = layer(h, attention_mask=None, position_ids=pos, past_key_values=cap, position_embeddings=rope)
        if len(self.inner.layers) in self.keep:
            states.append(h)
        last = h[torch.arange(len(lens), device=self.device), lens - 1]  # [b, d]
        return self.model.lm_head(self.inner.norm(last)), states

    def _layer_step(self, layer, h, cos, sin, kb, vb, bias, windows):
        """One decoder layer for one new token per row of slots [0, U), each group of rows attending
        over its own window of the buffer (masked within it).

        The model's own projections, norms and MLP; attention written out so that grouped-query
        heads read the strided buffer directly (HF's sdpa path copies and repeats K/V each step).
        h: [U, 1, d]; kb, vb: [B, H_kv, C, D]; bias: [U, 1, 1, C] (0 or -inf); windows: (a, b, lo),
        rows [a, b) attend over columns [lo, c]."""
        attn = layer.self_attn
        U = h.shape[0]
        hk, hd = kb.shape[1], kb.shape[3]
        x = layer.input_layernorm(h)
        q = attn.q_proj(x).view(U, 1, -1, hd)  # [U, 1, H, D]
        k = attn.k_proj(x).view(U, 1, hk, hd)
        if hasattr(attn, "q_norm"):  # Qwen3
            q, k = attn.q_norm(q), attn.k_norm(k)
        rotary = sys.modules[type(attn).__module__].apply_rotary_pos_emb
        q, k = rotary(q.transpose(1, 2), k.transpose(1, 2), cos, sin)  # [U, H, 1, D], [U, H_kv, 1, D]
        c = self.c
        kb[:U, :, c] = k[:, :, 0]
        vb[:U, :, c] = attn.v_proj(x).view(U, hk, hd)
        # one call per group (query head i reads kv head i // g in place)
        o = torch.cat([self.attend(q[a:b], kb[a:b, :, lo:c + 1], vb[a:b, :, lo:c + 1], bias[a:b, ..., lo:c + 1], scale=attn.scaling)
                       for a, b, lo in windows])  # [U, H, 1, D]
        h = h + attn.o_proj(o.transpose(1, 2).reshape(U, 1, -1))
        return h + layer.mlp(layer.post_attention_layernorm(h))

    def _choose(self, logits: torch.Tensor, temps: torch.Tensor) -> torch.Tensor:
        """logits [b, V] (the model's dtype: its fp32 upcast is exact, so the argmax is the same) -> ids
        [b]: argmax where temp == 0, else a sample at that temperature (fp32 softmax, sampled rows only)."""
        ids = logits.max(-1).indices  # the first maximal index, as argmax (~4x faster on bf16 here)
        hot = (temps > 0).nonzero()[:, 0]  # [h]
        if len(hot):
            ids[hot] = sample(logits[hot], temps[hot], self.gen)
        return ids

    @staticmethod
    def _prefill_groups(free: int, queue: list, tokens: int):
        """Pop at most `free` jobs off `queue`, in groups of at most `tokens` padded tokens."""
        batch: list = []
        for _ in range(free):
            if not queue:
                break
            if batch and (len(batch) + 1) * max(len(queue[-1][1]), *(len(p) for _, p, _ in batch)) > tokens:
                yield batch
                batch = []
            batch.append(queue.pop())
        if batch:
            yield batch

    def _prefill(self, batch: list[tuple[int, Sequence[int], float]]) -> None:
        """Run the jobs' prompts (right-padded to P) and place their KV in columns [c - len, c) of
        the lowest free slots."""
        prompts = [list(p) for _, p, _ in batch]
        P = max(len(p) for p in prompts)
        if self.c < P:
            self._relayout(before=P)
        slots = [s for s, r in enumerate(self.rows) if r is None][:len(batch)]
        dev = self.device
        lens = torch.tensor([len(p) for p in prompts], device=dev)
        ids = torch.tensor([list(p) + [self.eos] * (P - len(p)) for p in prompts], device=dev)  # [b, P]
        cap = _KVCapture()
        logits, states = self._layers(ids, lens, cap)
        for layer, (kb, vb) in enumerate(self.bufs):
            k, v = cap.kv[layer]  # [b, H_kv, P, D]
            for i, (s, n) in enumerate(zip(slots, lens.tolist())):
                kb[s, :, self.c - n:self.c] = k[i, :, :n]
                vb[s, :, self.c - n:self.c] = v[i, :, :n]
        idx = torch.tensor(slots, device=dev)
        self.start[idx] = self.c - lens
        self.next[idx] = self._choose(logits, torch.tensor([t for _, _, t in batch], device=dev))
        if self.recorder:
            self.recorder.prefill(self.home[idx], lens.tolist(), states, logits)
        for s, p, (job, _, t) in zip(slots, prompts, batch):
            self.rows[s] = _Row(job=job, temp=t, prompt=p)
        self.used = max(self.used, slots[-1] + 1)

    def _windows(self) -> list[tuple[int, int, int]]:
        """(a, b, lo): the step's attention groups, rows [a, b) of [0, used) over columns [lo, c]."""
        U, G = self.used, self.group
        firsts = self.start[:U].tolist()
        return [(a, min(a + G, U), min(firsts[a:a + G])) for a in range(0, U, G)]

    def _step(self) -> None:
        """One decode step for the slots [0, used): column c, each group of rows over its window."""
        if self.c >= self.C:
            self._relayout()
        U, dev = self.used, self.device
        start = self.start[:U]
        cols = torch.arange(self.C, device=dev)
        mask = (cols[None, :] >= start[:, None]) & (cols[None, :] <= self.c)  # [U, C]
        bias = torch.zeros(mask.shape, dtype=self.dtype, device=dev).masked_fill_(~mask, float("-inf"))[:, None, None]
        windows = self._windows()
        pos = (self.c - start)[:, None]  # [U, 1]
        h = self.inner.embed_tokens(self.next[:U, None])  # [U, 1, d]
        cos, sin = self.inner.rotary_emb(h, pos)
        states = []
        for i, (layer, (kb, vb)) in enumerate(zip(self.inner.layers, self.bufs)):
            if i in self.keep:
                states.append(h[:, 0])
            h = self._layer_step(layer, h, cos, sin, kb, vb, bias, windows)
        if len(self.inner.layers) in self.keep:
            states.append(h[:, 0])
        logits = self.model.lm_head(self.inner.norm(h[:, -1]))  # [U, V]
        self.c += 1
        if self.recorder:
            fed = [(s, len(r.out) - 1) for s, r in enumerate(self.rows[:U]) if r is not None]  # (slot, response index fed)
            live, j = torch.tensor(fed, device=dev).T
            h_rec, z_rec = torch.stack(states, 1), logits  # [U, m, d], [U, V]
            if len(fed) < U:  # free slots among them (a full batch skips copying the logits)
                h_rec, z_rec = h_rec[live], z_rec[live]
            self.recorder.step(self.home[live], j, h_rec, z_rec)
        temps = torch.tensor([r.temp if r else 0.0 for r in self.rows[:U]], device=dev)
        self.next[:U] = self._choose(logits, temps)

    # -- driver ------------------------------------------------------------------------------------
    @torch.inference_mode()
    def run(self, jobs: Sequence[tuple[int, Sequence[int], float]], on_done, refill: int = 0,
            prefill_tokens: int = 0) -> None:
        """Decode every (id, prompt, temperature); `on_done(id, response ids)` as each finishes
        (eos included when produced; at most max_new tokens); a true return from on_done ends the
        run there. Free slots are refilled once `refill` of them (default B/8) wait, so that
        prefills run as batches (of at most `prefill_tokens` padded tokens: by default 2k on a CPU,
        where each activation then stays in cache, 32k elsewhere), not a row at a time."""
        queue = list(jobs)[::-1]
        self.widest = max([self.widest, *(len(p) + self.max_new + self.slack for _, p, _ in queue)])
        refill = refill or max(1, self.B // 8)
        prefill_tokens = prefill_tokens or (2048 if self.device.type == "cpu" else 32768)
        with _attention_kernels(self.device):
            self._loop(queue, on_done, refill, prefill_tokens)

    def _loop(self, queue: list, on_done, refill: int, prefill_tokens: int) -> None:
        while queue or any(self.rows):
            free = sum(r is None for r in self.rows)
            if queue and free >= min(refill, len(queue)):
                for batch in self._prefill_groups(free, queue, prefill_tokens):
                    self._prefill(batch)
            nxt = self.next.tolist()  # one device sync per step
            for s, row in enumerate(self.rows):  # the token each slot is about to feed is its output
                if row is None:
                    continue
                tok = nxt[s]
                row.out.append(tok)
                if tok == self.eos or len(row.out) >= self.max_new:
                    if self.recorder:
                        self.recorder.finish(int(self.home[s]), row.job, row.prompt, row.out)
                    if on_done(row.job, row.out):
                        return
                    self.rows[s] = None
                    self.start[s] = self.c
            if any(self.rows):
                self._step()

"""Teacher cache: the frozen target's anchor states and top-k next-token probabilities, on disk.

The target forward is the bottleneck of PDM training on a CPU, so it runs once and its outputs are
reused by every run and variant. Two producers write the same shard format:

- `generate_teacher`: the target's OWN responses to ShareGPT prompts (batched greedy, or sampled,
  generation). The anchor states and logits are captured while generating (forward hooks), so a
  response costs one target pass. At inference the drafter only ever sees the target's own text.
- `forward_teacher`: a plain teacher forward over ShareGPT conversations (their human-written
  assistant turns), for comparison.

A shard (`shard_00000.safetensors`) holds S sequences, N positions in all:
  tokens  int32 [N]        token at each position
  offsets int64 [S+1]      sequence boundaries
  loss    uint8 [N]        1 where the NEXT token is assistant text (a training target)
  anchors fp16  [N, m, d]  H[b] for the cache's layers (a superset of the anchors of several n)
  top_ids int32 [N, k]     the teacher's k most likely next tokens (loss positions only; else 0)
  top_p   fp16  [N, k]     their probabilities at temperature 1
Everything is written atomically (tmp + rename) and `progress.json` says how many source items
were consumed, so an interrupted job resumes where it stopped.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from spd.core.split import default_anchors, uniform_split
from spd.models.loading import cache_dir

log = logging.getLogger(__name__)

TOP_K = 32


def cache_layers(num_layers: int, ns=(3, 4, 5, 6)) -> list[int]:
    """Union of the default anchors for the pipeline widths we may train for."""
    layers: set[int] = set()
    for n in ns:
        if n <= num_layers:
            layers.update(default_anchors(uniform_split(num_layers, n)))
    return sorted(layers)


def teacher_dir(model_dir: Path, name: str) -> Path:
    return cache_dir() / "teacher" / Path(model_dir).name / name


class ShardWriter:
    def __init__(self, root: Path, layers: list[int], meta: dict, shard_tokens: int = 16384):
        self.root, self.layers, self.meta, self.shard_tokens = Path(root), layers, meta, shard_tokens
        self.root.mkdir(parents=True, exist_ok=True)
        prog = self.root / "progress.json"
        fresh = {"consumed": 0, "shards": 0, "tokens": 0, "loss_tokens": 0, "seconds": 0.0}
        self.progress: dict[str, Any] = json.loads(prog.read_text()) if prog.exists() else fresh
        (self.root / "meta.json").write_text(json.dumps({**meta, "layers": layers, "top_k": TOP_K}, indent=2))
        self._buf: list[dict] = []
        self._buf_tokens = 0

    @property
    def consumed(self) -> int:
        return self.progress["consumed"]

    def add(self, tokens, loss, anchors, top_ids, top_p) -> None:
        self._buf.append(dict(tokens=tokens, loss=loss, anchors=anchors, top_ids=top_ids, top_p=top_p))
        self._buf_tokens += len(tokens)

    def flush_if_full(self, consumed: int, seconds: float, force: bool = False) -> None:
        """Write a shard once enough tokens are buffered; record that `consumed` items are done."""
        if not self._buf or (self._buf_tokens < self.shard_tokens and not force):
            return
        lens = [len(b["tokens"]) for b in self._buf]
        offsets = torch.tensor([0] + lens).cumsum(0)
        shard = {
            "tokens": torch.cat([torch.as_tensor(b["tokens"], dtype=torch.int32) for b in self._buf]),
            "offsets": offsets.long(),
            "loss": torch.cat([torch.as_tensor(b["loss"], dtype=torch.uint8) for b in self._buf]),
            "anchors": torch.cat([b["anchors"] for b in self._buf]).half().contiguous(),
            "top_ids": torch.cat([b["top_ids"] for b in self._buf]).int().contiguous(),
            "top_p": torch.cat([b["top_p"] for b in self._buf]).half().contiguous(),
        }
        idx = self.progress["shards"]
        tmp = self.root / f".shard_{idx:05d}.tmp"
        save_file(shard, tmp)
        os.replace(tmp, self.root / f"shard_{idx:05d}.safetensors")
        p = self.progress
        p.update(consumed=consumed, shards=idx + 1, tokens=p["tokens"] + int(offsets[-1]),
                 loss_tokens=p["loss_tokens"] + int(shard["loss"].sum()), seconds=p["seconds"] + seconds)
        tmp = self.root / ".progress.tmp"
        tmp.write_text(json.dumps(p, indent=2))
        os.replace(tmp, self.root / "progress.json")
        self._buf, self._buf_tokens = [], 0


def load_hf(model_dir: Path, dtype=torch.bfloat16):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation="sdpa")
    return model.eval()


class _Capture:
    """Forward hooks that record H[b] (embedding output, decoder layer outputs) and LM-head top-k."""

    def __init__(self, model, layers: list[int]):
        self.layers = layers
        self.states: list[torch.Tensor] = []  # [B, T, m, d] per forward
        self.tops: list[tuple[torch.Tensor, torch.Tensor]] = []  # (ids, probs) [B, k] per forward
        self.handles = []
        inner = model.model
        self.handles.append(inner.embed_tokens.register_forward_hook(self._hook(0)) if 0 in layers else None)
        for b in layers:
            if b > 0:
                self.handles.append(inner.layers[b - 1].register_forward_hook(self._hook(b)))
        self.handles.append(model.lm_head.register_forward_hook(self._head))
        self._step: dict[int, torch.Tensor] = {}

    def _hook(self, b):
        def fn(mod, inp, out):
            h = out[0] if isinstance(out, tuple) else out
            self._step[b] = h.detach().to("cpu", torch.float16)
            if len(self._step) == len(self.layers):
                self.states.append(torch.stack([self._step[x] for x in self.layers], dim=2))  # [B, T, m, d]
                self._step = {}
        return fn

    def _head(self, mod, inp, out):
        probs = torch.softmax(out[:, -1].float(), dim=-1)  # [B, V]: only the newest position matters
        p, i = probs.topk(TOP_K, dim=-1)
        self.tops.append((i.int().cpu(), p.half().cpu()))

    def close(self):
        for h in self.handles:
            if h is not None:
                h.remove()


@torch.inference_mode()
def generate_teacher(model_dir: Path, prompts: list[list[int]], out: Path, batch: int = 16, max_new: int = 256,
                     temperature: float = 0.0, eos_id: int = 2, limit_tokens: int | None = None,
                     meta: dict | None = None, ns=(3, 4, 5, 6), dtype=torch.bfloat16, device="cpu") -> Path:
    """Self-generated data: the target's responses to `prompts` (token ids, already templated).

    Prompts are taken in order (the caller shuffles/sorts), `batch` at a time, left-padded. The
    teacher runs in bf16 by default: on an AVX512-BF16 CPU it is ~2x faster than fp32; its greedy
    text is still the target's own (rare near-tie flips aside).
    """
    model = load_hf(model_dir, dtype).to(device)
    L = model.config.num_hidden_layers
    layers = cache_layers(L, ns)
    writer = ShardWriter(out, layers, {"source": "self-generated", "max_new": max_new, "temperature": temperature,
                                       "dtype": str(dtype), **(meta or {})})
    cap = _Capture(model, layers)
    pad = eos_id
    i = writer.consumed
    t_start = time.perf_counter()
    while i < len(prompts):
        if limit_tokens and writer.progress["tokens"] >= limit_tokens:
            break
        t0 = time.perf_counter()
        chunk = prompts[i:i + batch]
        P = max(len(p) for p in chunk)
        ids = torch.tensor([[pad] * (P - len(p)) + p for p in chunk])
        attn = torch.tensor([[0] * (P - len(p)) + [1] * len(p) for p in chunk])
        cap.states, cap.tops = [], []
        kw: dict[str, Any] = dict(do_sample=temperature > 0, max_new_tokens=max_new, pad_token_id=pad,
                                  eos_token_id=eos_id)
        if temperature > 0:
            kw.update(temperature=temperature, top_k=0, top_p=1.0)
            torch.manual_seed(i)
        gen = model.generate(input_ids=ids.to(device), attention_mask=attn.to(device), **kw)[:, P:].cpu()  # [B, G]
        states = torch.cat(cap.states, dim=1)  # [B, P + steps, m, d]
        top_i = torch.stack([t[0] for t in cap.tops], dim=1)  # [B, steps, k]; step s predicts gen[s]
        top_p = torch.stack([t[1] for t in cap.tops], dim=1)
        for b, p in enumerate(chunk):
            g = gen[b].tolist()
            stop = g.index(eos_id) + 1 if eos_id in g else len(g)
            g = g[:stop]  # generated tokens incl. eos
            # positions with states: prompt + g[:-1]; position P0-1+s predicts g[s]
            P0 = len(p)
            npos = P0 + len(g) - 1
            st = states[b, P - P0:P - P0 + npos]
            tokens = p + g[:-1]
            loss = [0] * (P0 - 1) + [1] * len(g)
            ti = torch.zeros(npos, TOP_K, dtype=torch.int32)
            tp = torch.zeros(npos, TOP_K, dtype=torch.float16)
            ti[P0 - 1:] = top_i[b, :len(g)]
            tp[P0 - 1:] = top_p[b, :len(g)]
            writer.add(tokens, loss, st.clone(), ti, tp)
        i += len(chunk)
        writer.flush_if_full(i, time.perf_counter() - t0 + 0.0)
        el = time.perf_counter() - t_start
        log.info("selfgen: %d/%d prompts, %d tokens cached, %.0f s", i, len(prompts), writer.progress["tokens"], el)
    writer.flush_if_full(i, 0.0, force=True)
    cap.close()
    return out


@torch.inference_mode()
def forward_teacher(model_dir: Path, seqs: list[tuple[list[int], list[bool]]], out: Path, batch: int = 8,
                    limit_tokens: int | None = None, meta: dict | None = None, ns=(3, 4, 5, 6),
                    dtype=torch.bfloat16, device="cpu", shard_tokens: int = 16384) -> Path:
    """Teacher forward over given sequences (ids, assistant mask), e.g. ShareGPT text."""
    model = load_hf(model_dir, dtype).to(device)
    L = model.config.num_hidden_layers
    layers = cache_layers(L, ns)
    writer = ShardWriter(out, layers, {"source": "text", "dtype": str(dtype), **(meta or {})}, shard_tokens)
    cap = _Capture(model, layers)
    head = model.lm_head
    head_hook = cap.handles[-1]  # full-sequence logits instead: compute top-k at loss positions only
    assert head_hook is not None  # the LM-head hook, added last
    head_hook.remove()
    cap.handles[-1] = None
    i = writer.consumed
    while i < len(seqs):
        if limit_tokens and writer.progress["tokens"] >= limit_tokens:
            break
        t0 = time.perf_counter()
        chunk = seqs[i:i + batch]
        T = max(len(s[0]) for s in chunk)
        ids = torch.tensor([s[0] + [0] * (T - len(s[0])) for s in chunk])
        attn = torch.tensor([[1] * len(s[0]) + [0] * (T - len(s[0])) for s in chunk])
        cap.states = []
        hidden = model.model(input_ids=ids.to(device), attention_mask=attn.to(device)).last_hidden_state  # [B, T, d]
        states = torch.cat(cap.states, dim=1)
        for b, (tok, amask) in enumerate(chunk):
            n = len(tok)
            loss = torch.tensor([bool(amask[j + 1]) for j in range(n - 1)] + [False])
            ti = torch.zeros(n, TOP_K, dtype=torch.int32)
            tp = torch.zeros(n, TOP_K, dtype=torch.float16)
            rows = loss.nonzero()[:, 0]
            if len(rows):
                probs = torch.softmax(head(hidden[b, rows.to(device)]).float(), -1)
                p, ix = (x.cpu() for x in probs.topk(TOP_K, -1))
                ti[rows], tp[rows] = ix.int(), p.half()
            writer.add(tok, loss.to(torch.uint8).tolist(), states[b, :n].clone(), ti, tp)
        i += len(chunk)
        writer.flush_if_full(i, time.perf_counter() - t0)
        log.info("text teacher: %d/%d seqs, %d tokens cached", i, len(seqs), writer.progress["tokens"])
    writer.flush_if_full(i, 0.0, force=True)
    cap.close()
    return out


class TeacherCache:
    """Read side: shards of one cache directory, as a list of sequences (loaded lazily per shard)."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.meta = json.loads((self.root / "meta.json").read_text())
        self.layers: list[int] = self.meta["layers"]

    def shards(self) -> list[Path]:
        return sorted(self.root.glob("shard_*.safetensors"))

    def progress(self) -> dict:
        p = self.root / "progress.json"
        return json.loads(p.read_text()) if p.exists() else {}

    def sequences(self, shard: Path) -> list[dict]:
        t = load_file(shard)
        off = t["offsets"].tolist()
        return [{k: t[k][a:b] for k in ("tokens", "loss", "anchors", "top_ids", "top_p")}
                for a, b in zip(off, off[1:])]

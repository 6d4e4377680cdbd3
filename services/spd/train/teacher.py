"""Teacher cache: the frozen target's anchor states and top-k next-token probabilities, on disk.

The target forward is the bottleneck of PDM training on a CPU, so it runs once and its outputs are
reused by every run and variant. Two producers write the same shard format:

- `record_teacher`: the target's OWN responses to ShareGPT prompts (continuous-batching greedy, or
  sampled, generation: spd.train.batch_decode). The anchor states and top-k are recorded while
  generating (spd.train.recorder), so a response costs one target pass. At inference the drafter
  only ever sees the target's own text.
- `forward_teacher`: a plain teacher forward over ShareGPT conversations (their human-written
  assistant turns), for comparison.

A shard (`shard_00000.safetensors`) holds S sequences, N positions in all:
  tokens  int32 [N]        token at each position
  offsets int64 [S+1]      sequence boundaries
  loss    uint8 [N]        1 where the NEXT token is assistant text (a training target)
  anchors fp16  [N, m, d]  H[b] for the cache's layers (a superset of the anchors of several n)
  top_ids int32 [N, k]     the teacher's k most likely next tokens (loss positions only; else 0)
  top_p   fp16  [N, k]     their probabilities at temperature 1
  job     int64 [S]        (record_teacher) the index of each sequence's prompt
Everything is written atomically (tmp + rename) and `progress.json` says how many source items
were consumed (record_teacher: the prompts whose sequences are in a shard, in any order), so an
interrupted job resumes where it stopped.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from spd.core.split import default_anchors, uniform_split
from spd.models.loading import cache_dir
from spd.train.precision import batched_dtype

log = logging.getLogger(__name__)

TOP_K = 32


def top_k_probs(logits: torch.Tensor, k: int = TOP_K) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [b, V] -> the k most likely ids [b, k] (int32) and their probabilities at temperature 1 (fp16).
    The top-k runs on the logits as they come (bf16 from the teacher: half the bytes to scan, same order
    as their exact fp32 upcast), the softmax in fp32 (on an fp32 copy: ~4x faster here than softmax's
    own bf16 -> fp32 path)."""
    ix = logits.topk(k, -1).indices  # [b, k]
    p = torch.softmax(logits.float(), -1).gather(-1, ix)  # [b, k]
    return ix.int(), p.half()


def sequence_dict(tokens: list[int], start: int, anchors: torch.Tensor, top_ids: torch.Tensor,
                  top_p: torch.Tensor) -> dict:
    """One teacher-cache sequence: tokens [T]; anchors [T, m, d] fp16; the top-k [T - start, k] of the
    positions from `start` on (the predicting ones: loss 1 there), padded with zeros before it."""
    T = len(tokens)
    loss = torch.zeros(T, dtype=torch.uint8)
    loss[start:] = 1
    ids = torch.zeros(T, top_ids.shape[-1], dtype=torch.int32)
    p = torch.zeros(T, top_p.shape[-1], dtype=torch.float16)
    ids[start:], p[start:] = top_ids.cpu(), top_p.cpu()
    return {"tokens": torch.tensor(tokens, dtype=torch.int32), "loss": loss, "anchors": anchors.to("cpu", torch.float16),
            "top_ids": ids, "top_p": p}


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

    @property
    def tokens(self) -> int:
        """Positions written or buffered."""
        return self.progress["tokens"] + self._buf_tokens

    def add(self, tokens, loss, anchors, top_ids, top_p, job: int | None = None) -> None:
        self._buf.append(dict(tokens=tokens, loss=loss, anchors=anchors, top_ids=top_ids, top_p=top_p, job=job))
        self._buf_tokens += len(tokens)

    def jobs_done(self) -> set[int]:
        """The prompt indices already in a shard (shards written with `job`)."""
        done: set[int] = set()
        for path in sorted(self.root.glob("shard_*.safetensors")):
            with safe_open(path, "pt") as f:
                if "job" not in f.keys():
                    raise ValueError(f"{path} has no prompt indices (written by the former generator): use a new cache name")
                done.update(f.get_tensor("job").tolist())
        return done

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
        if self._buf[0]["job"] is not None:
            shard["job"] = torch.tensor([b["job"] for b in self._buf], dtype=torch.int64)
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


def load_hf(model_dir, dtype=None, device="cpu"):
    """The target for batched teacher work on `device`, in `dtype` (default: the device's batched
    dtype, spd.train.precision)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype or batched_dtype(device),
                                                 attn_implementation="sdpa")
    return model.to(device).eval()


class HookCapture:
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
        i, p = top_k_probs(out[:, -1])  # only the newest position matters
        self.tops.append((i.cpu(), p.cpu()))

    def close(self):
        for h in self.handles:
            if h is not None:
                h.remove()


def record_teacher(model_dir: Path, prompts: list[list[int]], out: Path, batch: int = 128, max_new: int = 256,
                   temperature: float = 0.0, eos_id: int = 2, limit_tokens: int | None = None,
                   meta: dict | None = None, ns=(3, 4, 5, 6), dtype=None, device="cpu") -> Path:
    """Self-generated data: the target's responses to `prompts` (token ids, already templated) with
    the teacher features recorded as they are generated.

    `batch` rows decode together and a finished row's slot takes the next prompt (no batch waits on
    its longest answer). Sequences are written as they finish, each with its prompt index, so a
    resumed job skips exactly the prompts already written. The teacher runs in the device's batched
    dtype by default (bf16 where the hardware has it: ~4x fp32 for batched work on a CPU with bf16
    units); its greedy text is still the target's own, rare near-tie flips aside.
    """
    from spd.train.batch_decode import BatchDecoder
    from spd.train.recorder import FeatureRecorder

    model = load_hf(model_dir, dtype, device)
    layers = cache_layers(model.config.num_hidden_layers, ns)
    writer = ShardWriter(out, layers, {"source": "self-generated", "max_new": max_new, "temperature": temperature,
                                       "dtype": str(model.dtype), **(meta or {})})
    done = writer.jobs_done()
    todo = [(i, p, temperature) for i, p in enumerate(prompts) if i not in done]
    clock = [time.perf_counter()]  # start of the shard being filled

    def add(job: int, seq: dict) -> None:
        writer.add(**seq, job=job)
        done.add(job)
        shards = writer.progress["shards"]
        writer.flush_if_full(len(done), time.perf_counter() - clock[0])
        if writer.progress["shards"] > shards:
            clock[0] = time.perf_counter()
            log.info("[selfgen] %d/%d prompts, %d tokens cached", len(done), len(prompts), writer.progress["tokens"])

    def enough(job: int, response: list[int]) -> bool:
        return bool(limit_tokens and writer.tokens >= limit_tokens)

    decoder = BatchDecoder(model, batch, max_new, eos_id, seed=len(done), recorder=FeatureRecorder(layers, add))
    decoder.run(todo, enough)
    writer.flush_if_full(len(done), time.perf_counter() - clock[0], force=True)
    return out


@torch.inference_mode()
def forward_teacher(model_dir: Path, seqs: list[tuple[list[int], list[bool]]], out: Path, batch: int = 8,
                    limit_tokens: int | None = None, meta: dict | None = None, ns=(3, 4, 5, 6),
                    dtype=None, device="cpu", shard_tokens: int = 16384) -> Path:
    """Teacher forward over given sequences (ids, assistant mask), e.g. ShareGPT text."""
    model = load_hf(model_dir, dtype, device)
    L = model.config.num_hidden_layers
    layers = cache_layers(L, ns)
    writer = ShardWriter(out, layers, {"source": "text", "dtype": str(model.dtype), **(meta or {})}, shard_tokens)
    cap = HookCapture(model, layers)
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
                ix, p = top_k_probs(head(hidden[b, rows.to(device)]))
                ti[rows], tp[rows] = ix.cpu(), p.cpu()
            writer.add(tok, loss.to(torch.uint8).tolist(), states[b, :n].clone(), ti, tp)
        i += len(chunk)
        writer.flush_if_full(i, time.perf_counter() - t0)
        log.info("text teacher: %d/%d seqs, %d tokens cached", i, len(seqs), writer.progress["tokens"])
    writer.flush_if_full(i, 0.0, force=True)
    cap.close()
    return out


class TeacherCache:
    """Read side: shards of one cache directory, as a list of sequences (loaded lazily per shard)."""

    chunk = 0  # sequences read at a time by the training stream (0: a whole shard; reading is cheap)

    def __init__(self, root: Path):
        self.root = Path(root)
        self.meta = json.loads((self.root / "meta.json").read_text())
        self.layers: list[int] = self.meta["layers"]

    def shards(self) -> list[Path]:
        return sorted(self.root.glob("shard_*.safetensors"))

    def progress(self) -> dict:
        p = self.root / "progress.json"
        return json.loads(p.read_text()) if p.exists() else {}

    def count(self, shard: Path) -> int:
        with safe_open(shard, "pt") as f:
            return f.get_slice("offsets").get_shape()[0] - 1

    def sequences(self, shard: Path, pick: list[int] | None = None) -> list[dict]:
        """The shard's sequences (those at the indices `pick`, in that order, if given)."""
        t = load_file(shard)
        off = t["offsets"].tolist()
        seqs = [{k: t[k][a:b] for k in ("tokens", "loss", "anchors", "top_ids", "top_p")}
                for a, b in zip(off, off[1:])]
        return seqs if pick is None else [seqs[i] for i in pick]

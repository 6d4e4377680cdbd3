"""Teacher features computed online from self-generated token ids (no multi-GB anchor cache on disk).

A directory of `spd.train.selfgen` parts (prompts are rebuilt from the deterministic job list, the
responses are stored) reads like a `TeacherCache`: `shards()` are the parts, and `sequences(part,
pick)` runs the frozen target over the picked sequences of a part in batched prefills (bf16 or fp32,
`spd.train.precision`) and returns the same per-sequence dicts a cache shard holds (tokens, loss,
anchors, top_ids, top_p).
The training stream asks for `chunk` sequences at a time, so a run that ends inside a part does not
pay for the rest of it. One target pass (~1-1.5k tok/s on 2 AMX cores in bf16, ~150 tok/s on 2
AVX2-only cores in fp32, far more on a GPU; each pass logs its rate as `[teacher]`) replaces ~6 KB a
token of disk.

Sequence = prompt + response[:-1]; position P-1+s predicts response[s] (loss 1 there), exactly the
layout `record_teacher` writes.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Iterable

import numpy as np
import torch

from spd.train.selfgen import IdStore, Job, rebuild_jobs
from spd.train.teacher import cache_layers, load_hf, sequence_dict, top_k_probs

log = logging.getLogger(__name__)


class OnlineTeacher:
    """The target in the device's batched dtype (or `dtype`); `features(batch)` -> cache-style dicts
    (anchors from its hidden states)."""

    def __init__(self, model_dir: Path, layers: list[int], dtype: torch.dtype | None = None, device: str = "cpu",
                 batch_tokens: int = 0):
        self.model = load_hf(model_dir, dtype, device)
        # padded tokens per forward: on a CPU ~2k keeps each activation in cache (faster than 8k here)
        self.layers, self.device = layers, device
        self.batch_tokens = batch_tokens or (2048 if device == "cpu" else 32768)
        self._last = torch.empty(0)
        self.model.model.layers[-1].register_forward_hook(self._keep_last)

    def _raw(self, out, b: int) -> torch.Tensor:
        """H[b], the residual stream after b layers, as the pipeline's stages send it: HF's
        hidden_states[L] is the final norm's output instead, so H[L] is taken before that norm
        (the last layer's output, kept by a forward hook)."""
        return self._last if b == len(self.model.model.layers) else out.hidden_states[b]

    def _keep_last(self, module, args, output) -> None:
        self._last = output[0] if isinstance(output, tuple) else output  # [B, T, d]

    @torch.inference_mode()
    def _forward(self, seqs: list[tuple[list[int], int]]) -> list[dict]:
        """seqs: (tokens, first loss position) right-padded into one batch. No padding mask: under the
        causal mask a real position sees only the real ones before it (the pads come after), and
        the causal kernel skips the masked half instead of reading a [T, T] mask."""
        T = max(len(t) for t, _ in seqs)
        ids = torch.tensor([t + [0] * (T - len(t)) for t, _ in seqs], device=self.device)  # [B, T]
        out = self.model.model(input_ids=ids, output_hidden_states=True)
        states = torch.stack([self._raw(out, b) for b in self.layers], dim=2)  # [B, T, m, d]
        rows = []
        for i, (tok, start) in enumerate(seqs):
            ix, p = top_k_probs(self.model.lm_head(out.last_hidden_state[i, start:len(tok)]))  # [n - start, k]
            rows.append(sequence_dict(tok, start, states[i, :len(tok)], ix, p))
        return rows

    def features(self, seqs: list[tuple[list[int], int]]) -> list[dict]:
        """Batches of about batch_tokens padded tokens, similar lengths together; input order kept."""
        order = sorted(range(len(seqs)), key=lambda i: len(seqs[i][0]))
        out: list[dict | None] = [None] * len(seqs)
        i = 0
        while i < len(order):
            j = i + 1
            while j < len(order) and (j + 1 - i) * len(seqs[order[j]][0]) <= self.batch_tokens:
                j += 1
            for k, row in zip(order[i:j], self._forward([seqs[k] for k in order[i:j]])):
                out[k] = row
            i = j
        return out  # type: ignore[return-value]


class OnlineCache:
    """A selfgen id directory read as a TeacherCache (see the module docstring). Its features hold
    exactly `layers` (a run's students' teacher layers; a part's features take ~2 B x d a layer and
    position, so no more than needed), or by default the default anchors of every pipeline width `ns`."""

    def __init__(self, root: Path, model_dir: Path, tokenizer, ns=(3, 4, 5, 6), device: str = "cpu",
                 layers: Iterable[int] = ()):
        from spd.models.loading import load_config

        self.root = Path(root)
        self.meta = json.loads((self.root / "meta.json").read_text())
        self.layers = sorted(set(layers)) or cache_layers(load_config(model_dir).num_hidden_layers, ns)
        self.meta = {**self.meta, "source": "self-generated ids, features online", "layers": self.layers}
        self.jobs: list[Job] = rebuild_jobs(tokenizer, self.meta, self.root)
        self.model_dir, self.device = model_dir, device
        # sequences per teacher pass in the training stream: a run that ends inside a part prefills at
        # most this many it does not use (a whole part is ~2k), and one chunk's features are in memory
        self.chunk = 384
        self._teacher: OnlineTeacher | None = None

    @property
    def teacher(self) -> OnlineTeacher:
        if self._teacher is None:
            self._teacher = OnlineTeacher(self.model_dir, self.layers, device=self.device)
        return self._teacher

    def shards(self) -> list[Path]:
        return sorted(self.root.glob("part_*.npz"))

    def progress(self) -> dict:
        tokens = sum(int(np.load(p)["offsets"][-1]) for p in self.shards())
        return {"loss_tokens": tokens, "shards": len(self.shards())}

    def id_sequences(self, part: Path) -> list[tuple[list[int], int]]:
        """(prompt + response[:-1], first loss position) for every response of `part`."""
        out = []
        for job, resp in IdStore.read(part):
            prompt = list(self.jobs[job].prompt)
            out.append((prompt + resp[:-1].tolist(), len(prompt) - 1))
        return out

    def count(self, part: Path) -> int:
        return len(np.load(part)["offsets"]) - 1

    def sequences(self, part: Path, pick: list[int] | None = None) -> list[dict]:
        """The teacher's features of the part's sequences (those at the indices `pick`, in that order)."""
        seqs = self.id_sequences(part)
        seqs = seqs if pick is None else [seqs[i] for i in pick]
        teacher, t0 = self.teacher, time.perf_counter()
        rows = teacher.features(seqs)
        dt, tokens = time.perf_counter() - t0, sum(len(t) for t, _ in seqs)
        log.info("[teacher] %s: %d sequences, %d tokens (%d loss) in %.0f s, %.0f tok/s", part.name, len(seqs),
                 tokens, sum(len(t) - s for t, s in seqs), dt, tokens / max(dt, 1e-9))
        return rows

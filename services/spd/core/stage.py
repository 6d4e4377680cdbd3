"""One pipeline stage of the target model: its own decoder layers, KV cache, and anchor outputs.

A stage built by `load_stage` reads only its own tensors from the safetensors files (stage 1 adds
the embedding, stage n the final norm and LM head), so a stage process holds only its share of the
weights. The decoder layers are the model's own HF modules (Llama, Qwen2, Qwen3, Mistral), driven
with our KV cache and explicit masks so that one token at a time reproduces the full model exactly.

Several requests share a stage through slots: each slot has its own KV cache, and `forward_rows`
runs one token of each of several slots as one batched forward (projections and MLP batched,
attention per slot over its own cache, `core/row_attention.py`).

Batch invariance. A GEMM's result for one row depends on how many rows it was computed with (on
this CPU: 1, 2-3 and >= 4 rows give three different roundings), so a request's tokens could
depend on what else runs. A stage with `rows = R > 1` therefore runs every single-token forward,
alone or batched, at the one fixed shape of R rows (the batch padded with zero rows): a row's
result then depends only on its own input, never on the other rows or on how many there are.
Prompts run as one chunk of their own length, as they do alone. `rows = 1` (one request at a
time) is the plain unpadded forward.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
from safetensors import safe_open
from torch import nn
from transformers import AutoModelForCausalLM, PretrainedConfig

from spd.core.kv_cache import KVCache
from spd.core.masks import causal_mask
from spd.core.row_attention import ROWS, RowsCache
from spd.core.split import produces


@dataclass
class StageOutput:
    hidden: torch.Tensor  # [T, d] residual stream after this stage's last layer
    anchors: dict[int, torch.Tensor]  # b -> H[b]: [T, d] for the anchors this stage produces
    logits: torch.Tensor | None  # [T, V] from the LM head (last stage only)

    @property
    def last_logits(self) -> torch.Tensor:
        """logits[-1]: [V], the next-token distribution after the last position (last stage only)."""
        if self.logits is None:
            raise RuntimeError("only the last stage has logits")
        return self.logits[-1]


class Stage(nn.Module):
    """Layers (first, last] of the target, optionally with the embedding and the LM head."""

    def __init__(self, config: PretrainedConfig, layers: range, anchors: tuple[int, ...], modules: dict[str, Any],
                 rows: int = 1):
        super().__init__()
        self.config = config
        self.rows = rows  # the fixed batch shape of single-token forwards (see the module docstring)
        self.layer_ids = list(layers)
        self.is_first = self.layer_ids[0] == 0
        self.is_last = self.layer_ids[-1] == config.num_hidden_layers - 1
        self.embed: Any = modules.get("embed")  # the token embedding (first stage only)
        self.layers = nn.ModuleList(modules["layers"])
        self.rotary: Any = modules["rotary"]
        self.norm: Any = modules.get("norm")  # final norm and LM head (last stage only)
        self.lm_head: Any = modules.get("lm_head")
        self.layer_range = range(self.layer_ids[0], self.layer_ids[-1] + 1)  # global indices of its layers
        self.anchors = tuple(b for b in anchors if produces(self.layer_range, b))
        self.caches: dict[int, KVCache] = {}  # slot -> its request's KV cache
        for layer in self.layers:  # attention that also takes per-slot histories (plain sdpa otherwise)
            attention: Any = layer.self_attn
            attention.config = _with_attention(attention.config, ROWS)

    @property
    def device(self) -> torch.device:
        return next(self.layers[0].parameters()).device

    def cache(self, slot: int = 0) -> KVCache:
        if slot not in self.caches:
            self.caches[slot] = KVCache(self.layer_ids)
        return self.caches[slot]

    @property
    def kv_length(self) -> int:
        return self.kv_length_of(0)

    def kv_length_of(self, slot: int) -> int:
        return self.caches[slot].length if slot in self.caches else 0

    def truncate(self, length: int, slot: int = 0) -> None:
        self.cache(slot).truncate(length)

    def release(self, slot: int) -> None:
        """The slot's request is over: free its KV cache."""
        self.caches.pop(slot, None)

    def _check(self, slot: int, start: int) -> KVCache:
        cache = self.cache(slot)
        if cache.length != start:
            raise RuntimeError(f"stage layers {self.layer_ids[0]}..{self.layer_ids[-1]} slot {slot}: KV length "
                               f"{cache.length} != position {start} (protocol bug)")
        return cache

    @torch.inference_mode()
    def forward(self, x: torch.Tensor, start: int, slot: int = 0) -> StageOutput:
        """x: token ids [T] (first stage) or hidden states [T, d]; positions start..start+T-1."""
        if x.shape[0] == 1 and self.rows > 1:  # one token: the batch shape, exactly as in a batch
            return self.forward_rows([(slot, x, start)])[0]
        cache = self._check(slot, start)
        x = x.to(self.device)
        h = self.embed(x) if self.is_first else x  # h: [T, d]
        h = h.unsqueeze(0)  # [1, T, d]
        T = h.shape[1]
        pos = torch.arange(start, start + T, device=h.device).unsqueeze(0)  # [1, T]
        rope = self.rotary(h, pos)
        mask = causal_mask(T, start, h.device)  # None for T == 1 (attend to everything)
        anchors = {0: h[0].clone()} if 0 in self.anchors else {}
        for layer_id, layer in zip(self.layer_ids, self.layers):
            h = layer(h, attention_mask=mask, position_ids=pos, past_key_values=cache,
                      position_embeddings=rope)
            if layer_id + 1 in self.anchors:
                anchors[layer_id + 1] = h[0].clone()
        cache.commit()
        logits = self.lm_head(self.norm(h))[0] if self.is_last else None  # [T, V]
        return StageOutput(hidden=h[0], anchors=anchors, logits=logits)

    @torch.inference_mode()
    def forward_rows(self, batch: list[tuple[int, torch.Tensor, int]]) -> list[StageOutput]:
        """One token for each of several slots: batch = [(slot, x [1] ids or [1, d] hidden, position)].

        Runs as `rows` sequences of one token (padded), each at its own position over its own cache.
        """
        B, P = len(batch), max(self.rows, 1)
        if not 1 <= B <= P or len({slot for slot, _, _ in batch}) != B:
            raise ValueError(f"forward_rows takes 1..{P} tokens of distinct slots, got {[s for s, _, _ in batch]}")
        caches = [self._check(slot, start) for slot, _, start in batch]
        x = torch.cat([x.to(self.device) for _, x, _ in batch])  # [B] ids or [B, d]
        h = self.embed(x) if self.is_first else x  # h: [B, d]
        h = torch.cat([h, h.new_zeros(P - B, h.shape[1])]).unsqueeze(1)  # [P, 1, d]: padding rows are zero
        pos = torch.tensor([start for _, _, start in batch] + [0] * (P - B), device=h.device).unsqueeze(1)  # [P, 1]
        rope = self.rotary(h, pos)
        view = RowsCache(caches)
        anchors = {0: h[:B, 0].clone()} if 0 in self.anchors else {}  # b -> [B, d]
        for layer_id, layer in zip(self.layer_ids, self.layers):
            h = layer(h, attention_mask=None, position_ids=pos, past_key_values=view, position_embeddings=rope)
            if layer_id + 1 in self.anchors:
                anchors[layer_id + 1] = h[:B, 0].clone()
        for cache in caches:
            cache.commit()
        logits = self.lm_head(self.norm(h))[:B, 0] if self.is_last else None  # [B, V]
        return [StageOutput(hidden=h[b], anchors={a: v[b:b + 1] for a, v in anchors.items()},
                            logits=logits[b:b + 1] if logits is not None else None) for b in range(B)]


def _with_attention(config: PretrainedConfig, implementation: str) -> PretrainedConfig:
    """A shallow copy of `config` whose attention implementation is `implementation`."""
    config = copy.copy(config)
    config._attn_implementation = implementation
    return config


def _weight_index(model_dir: Path) -> dict[str, Path]:
    """tensor name -> safetensors file holding it."""
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        mapping = json.loads(index.read_text())["weight_map"]
        return {k: model_dir / f for k, f in mapping.items()}
    with safe_open(model_dir / "model.safetensors", "pt") as f:
        return {k: model_dir / "model.safetensors" for k in f.keys()}


def _read_tensors(index: dict[str, Path], names: list[str]) -> dict[str, torch.Tensor]:
    by_file: dict[Path, list[str]] = {}
    for name in names:
        by_file.setdefault(index[name], []).append(name)
    out = {}
    for path, keys in by_file.items():
        with safe_open(path, "pt") as f:
            for k in keys:
                out[k] = f.get_tensor(k)
    return out


M = TypeVar("M", bound=nn.Module)


def _materialise(module: M, prefix: str, index: dict[str, Path], device, dtype,
                 aliases: dict[str, str] | None = None) -> M:
    """Allocate a meta-built module on `device` and fill it with exactly its own tensors."""
    module = module.to_empty(device=device)
    names = [k for k, _ in module.named_parameters()]
    aliases = aliases or {}
    files = {prefix + k: aliases.get(prefix + k, prefix + k) for k in names}
    tensors = _read_tensors(index, list(files.values()))
    state = {k: tensors[files[prefix + k]].to(dtype) for k in names}
    module.load_state_dict(state, strict=True)
    return module.to(dtype).eval()


def load_stage(model_dir: Path, config: PretrainedConfig, layers: range, anchors: tuple[int, ...],
               device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32, rows: int = 1) -> Stage:
    """Build the stage owning `layers` from `model_dir`, reading only its own tensors."""
    L = config.num_hidden_layers
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    index = _weight_index(model_dir)
    modules: dict[str, Any] = {
        "layers": [_materialise(skeleton.model.layers[i], f"model.layers.{i}.", index, device, dtype) for i in layers],
        "rotary": type(skeleton.model.rotary_emb)(config=config).to(device),  # buffers computed, not loaded
    }
    if layers[0] == 0:
        modules["embed"] = _materialise(skeleton.model.embed_tokens, "model.embed_tokens.", index, device, dtype)
    if layers[-1] == L - 1:
        modules["norm"] = _materialise(skeleton.model.norm, "model.norm.", index, device, dtype)
        tied = {"lm_head.weight": "model.embed_tokens.weight"} if "lm_head.weight" not in index else {}
        modules["lm_head"] = _materialise(skeleton.lm_head, "lm_head.", index, device, dtype, tied)
    del skeleton
    return Stage(config, layers, anchors, modules, rows)


def load_embedding(model_dir: Path, config: PretrainedConfig, device="cpu", dtype=torch.float32) -> nn.Embedding:
    """Only the token embedding (the drafter's own copy, for depth-0 features)."""
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    return _materialise(skeleton.model.embed_tokens, "model.embed_tokens.", _weight_index(model_dir), device, dtype)

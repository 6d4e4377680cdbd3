"""One pipeline stage of the target model: its own decoder layers, KV cache, and anchor outputs.

A stage built by `load_stage` reads only its own tensors from the safetensors files (stage 1 adds
the embedding, stage n the final norm and LM head), so a stage process holds only its share of the
weights. The decoder layers are the model's own HF modules (Llama, Qwen2, Qwen3, Mistral), driven
with our KV cache and explicit masks so that one token at a time reproduces the full model exactly.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn
from transformers import AutoModelForCausalLM, PretrainedConfig

from spd.core.kv_cache import KVCache
from spd.core.masks import causal_mask


@dataclass
class StageOutput:
    hidden: torch.Tensor  # [T, d] residual stream after this stage's last layer
    anchors: dict[int, torch.Tensor]  # b -> H[b]: [T, d] for the anchors this stage produces
    logits: torch.Tensor | None  # [T, V] from the LM head (last stage only)


class Stage(nn.Module):
    """Layers (first, last] of the target, optionally with the embedding and the LM head."""

    def __init__(self, config: PretrainedConfig, layers: range, anchors: tuple[int, ...], modules: dict[str, nn.Module]):
        super().__init__()
        self.config = config
        self.layer_ids = list(layers)
        self.is_first = self.layer_ids[0] == 0
        self.is_last = self.layer_ids[-1] == config.num_hidden_layers - 1
        self.embed = modules.get("embed")
        self.layers = nn.ModuleList(modules["layers"])
        self.rotary = modules["rotary"]
        self.norm = modules.get("norm")
        self.lm_head = modules.get("lm_head")
        lo, hi = self.layer_ids[0], self.layer_ids[-1] + 1
        self.anchors = tuple(b for b in anchors if lo < b <= hi or (b == 0 and self.is_first))
        self.cache = KVCache(self.layer_ids)

    @property
    def device(self) -> torch.device:
        return self.layers[0].input_layernorm.weight.device

    @property
    def kv_length(self) -> int:
        return self.cache.length

    def truncate(self, length: int) -> None:
        self.cache.truncate(length)

    @torch.inference_mode()
    def forward(self, x: torch.Tensor, start: int) -> StageOutput:
        """x: token ids [T] (first stage) or hidden states [T, d]; positions start..start+T-1."""
        if self.cache.length != start:
            raise RuntimeError(f"stage layers {self.layer_ids[0]}..{self.layer_ids[-1]}: KV length "
                               f"{self.cache.length} != position {start} (protocol bug)")
        x = x.to(self.device)
        h = self.embed(x) if self.is_first else x  # h: [T, d]
        h = h.unsqueeze(0)  # [1, T, d]
        T = h.shape[1]
        pos = torch.arange(start, start + T, device=h.device).unsqueeze(0)  # [1, T]
        rope = self.rotary(h, pos)
        mask = causal_mask(T, start, h.device)  # None for T == 1 (attend to everything)
        anchors = {0: h[0].clone()} if 0 in self.anchors else {}
        for layer_id, layer in zip(self.layer_ids, self.layers):
            h = layer(h, attention_mask=mask, position_ids=pos, past_key_values=self.cache,
                      position_embeddings=rope)
            if layer_id + 1 in self.anchors:
                anchors[layer_id + 1] = h[0].clone()
        self.cache.commit()
        logits = self.lm_head(self.norm(h))[0] if self.is_last else None  # [T, V]
        return StageOutput(hidden=h[0], anchors=anchors, logits=logits)


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


def _materialise(module: nn.Module, prefix: str, index: dict[str, Path], device, dtype,
                 aliases: dict[str, str] | None = None) -> nn.Module:
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
               device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> Stage:
    """Build the stage owning `layers` from `model_dir`, reading only its own tensors."""
    L = config.num_hidden_layers
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    index = _weight_index(model_dir)
    modules: dict[str, nn.Module] = {
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
    return Stage(config, layers, anchors, modules)


def load_embedding(model_dir: Path, config: PretrainedConfig, device="cpu", dtype=torch.float32) -> nn.Module:
    """Only the token embedding (the drafter's own copy, for depth-0 features)."""
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    return _materialise(skeleton.model.embed_tokens, "model.embed_tokens.", _weight_index(model_dir), device, dtype)

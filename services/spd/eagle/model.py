"""The EAGLE-3-style draft model: one Qwen3-style decoder layer over fused target features.

Draft position i takes (feature_i, token x_{i+1}) and predicts x_{i+2}. feature_i is
fuse(RMSNorm(H[b_lo][i]), RMSNorm(H[b_mid][i]), RMSNorm(H[b_hi][i])) for positions the target has
verified, and the draft's own hidden output (before the final norm) at position i-1 for speculative
positions (EAGLE-3: "its own hidden states for later steps"). The input of the layer is
Linear(concat(RMSNorm(embed(x_{i+1})), RMSNorm(feature_i))); a final norm and a reduced head over
V_s draft tokens (draft id -> target id via `d2t`) give the logits. The token embedding is the
target's (frozen, a non-persistent buffer: never saved with the draft).

Training (spd.eagle.train, masked, all TTT steps) and inference (spd.eagle.engine, KV-cached) call
the same `hidden` / `logits`, so they cannot drift apart.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import (
    Qwen3DecoderLayer,
    Qwen3RMSNorm,
    Qwen3RotaryEmbedding,
)

from spd.core.kv_cache import KVCache
from spd.core.pdm import AnchorFusion

WEIGHTS = "eagle.safetensors"


def default_feature_layers(num_layers: int) -> tuple[int, int, int]:
    """Low / mid / high target states: (5, 15, 29) for a 30-layer target."""
    return (num_layers // 6, num_layers // 2, num_layers - 1)


@dataclass
class EagleConfig:
    target_hidden: int  # d: width of the target's residual stream (also the draft's width)
    feature_layers: list[int] = field(default_factory=lambda: [5, 15, 29])  # H[b] after b layers: low, mid, high
    intermediate_size: int = 1536  # SwiGLU width of the decoder layer
    num_heads: int = 9  # attention heads
    num_kv_heads: int = 3  # GQA key/value heads
    head_dim: int = 64  # per-head width
    rope_theta: float = 100000.0  # RoPE base
    rms_norm_eps: float = 1e-5  # RMSNorm epsilon
    draft_vocab: int = 0  # V_s: rows of the reduced head
    target_vocab: int = 0  # V of the target, for mapping drafts back
    ttt_steps: int = 0  # TTT unroll depth it was trained with (0 = untrained)
    trained_tokens: int = 0  # loss positions seen in training (step-1 count)
    notes: dict = field(default_factory=dict)  # provenance: data, vocab, held-out agreement per step

    def __post_init__(self):
        self.feature_layers = list(self.feature_layers)

    @classmethod
    def from_saved(cls, raw: dict) -> EagleConfig:
        """The config of a saved draft's config.json (`EagleDraft.save`: these fields and a "kind" tag)."""
        return cls(**{k: v for k, v in raw.items() if k != "kind"})

    def qwen3(self) -> Qwen3Config:
        return Qwen3Config(  # type: ignore[call-arg]  # attn_implementation is a PretrainedConfig kwarg
            vocab_size=self.draft_vocab, hidden_size=self.target_hidden, intermediate_size=self.intermediate_size,
            num_hidden_layers=1, num_attention_heads=self.num_heads, num_key_value_heads=self.num_kv_heads,
            head_dim=self.head_dim, rms_norm_eps=self.rms_norm_eps,
            rope_parameters={"rope_type": "default", "rope_theta": self.rope_theta}, attn_implementation="sdpa",
        )


class EagleDraft(nn.Module):
    d2t: torch.Tensor  # buffers (see __init__)
    embed_weight: torch.Tensor

    def __init__(self, config: EagleConfig, d2t: torch.Tensor, embed_weight: torch.Tensor | None = None):
        super().__init__()
        self.config = config
        qc, d, eps = config.qwen3(), config.target_hidden, config.rms_norm_eps
        self.fuse = AnchorFusion(len(config.feature_layers), d, d, eps)  # 3 target states -> d
        self.input = AnchorFusion(2, d, d, eps)  # (embed(token), feature) -> d
        self.layer = Qwen3DecoderLayer(qc, 0)
        self.rotary = Qwen3RotaryEmbedding(qc)
        self.norm = Qwen3RMSNorm(d, eps=eps)
        self.head = nn.Linear(d, config.draft_vocab, bias=False)
        self.register_buffer("d2t", d2t.long().clone())  # [V_s] draft id -> target id
        self.register_buffer("embed_weight", torch.empty(0), persistent=False)  # [V, d] the target's, frozen
        for mod in self.modules():
            if isinstance(mod, nn.Linear):
                nn.init.normal_(mod.weight, std=0.02)
        if embed_weight is not None:
            self.set_embedding(embed_weight)

    def set_embedding(self, weight: torch.Tensor) -> None:
        self.embed_weight = weight.detach().to(self.d2t.device, self.head.weight.dtype)

    def fuse_states(self, states: torch.Tensor) -> torch.Tensor:
        """states: [..., T, 3, d] target H[b] for b in feature_layers -> features [..., T, d]."""
        return self.fuse(states.to(self.head.weight.dtype))

    def hidden(self, feature: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor,
               mask: torch.Tensor | None, cache=None) -> torch.Tensor:
        """The decoder layer's output before the final norm (the 'own hidden state').

        feature: [T, d] or a batch [B, T, d]; tokens: [T] / [B, T] (x_{i+1} for draft position i);
        positions: [T] / [B, T] RoPE positions; mask: bool [1 or B, 1, T, K] (True = may attend) or
        None (attend to everything). With `cache`, these positions' keys/values are appended to it
        (the caller commits or truncates). Returns [T, d] / [B, T, d].
        """
        one = feature.dim() == 2
        if one:
            feature, tokens, positions = feature[None], tokens[None], positions[None]
        emb = F.embedding(tokens.to(self.d2t.device), self.embed_weight)  # [B, T, d]
        x = self.input(torch.stack([emb, feature], dim=-2))  # [B, T, d]
        h = self.layer(x, attention_mask=mask, position_ids=positions, past_key_values=cache,
                       position_embeddings=self.rotary(x, positions))
        return h[0] if one else h

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """h: [..., d] -> draft-vocabulary logits [..., V_s]."""
        return self.head(self.norm(h))

    def new_cache(self) -> KVCache:
        return KVCache([0])

    def init_head_from(self, lm_head_weight: torch.Tensor) -> None:
        """Start the reduced head from the target's LM head rows of the draft vocabulary."""
        if lm_head_weight.shape[1] == self.config.target_hidden:
            with torch.no_grad():
                self.head.weight.copy_(lm_head_weight[self.d2t])

    def save(self, out: Path) -> None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps({"kind": "eagle3", **asdict(self.config)}, indent=2))
        state = {k: v.detach().cpu().to(torch.float16 if v.is_floating_point() else v.dtype).contiguous()
                 for k, v in self.state_dict().items()}
        save_file(state, out / WEIGHTS)

    @classmethod
    def load(cls, path: Path, embed_weight: torch.Tensor | None = None, device="cpu",
             dtype=torch.float32) -> EagleDraft:
        config = EagleConfig.from_saved(json.loads((Path(path) / "config.json").read_text()))
        state = load_file(Path(path) / WEIGHTS)
        draft = cls(config, state["d2t"])
        draft.load_state_dict({k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()})
        draft = draft.to(device=device, dtype=dtype)
        if embed_weight is not None:
            draft.set_embedding(embed_weight)
        return draft.eval()


def random_eagle(target_config, feature_layers=None, draft_ids: torch.Tensor | None = None,
                 lm_head_weight: torch.Tensor | None = None, embed_weight: torch.Tensor | None = None,
                 seed: int = 0) -> EagleDraft:
    """An untrained draft shaped after the target (its widths, heads, RoPE base)."""
    torch.manual_seed(seed)
    V, L = target_config.vocab_size, target_config.num_hidden_layers
    d2t = torch.arange(V) if draft_ids is None else draft_ids
    rope = (getattr(target_config, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
    cfg = EagleConfig(
        target_hidden=target_config.hidden_size,
        feature_layers=list(feature_layers or default_feature_layers(L)),
        intermediate_size=target_config.intermediate_size, num_heads=target_config.num_attention_heads,
        num_kv_heads=target_config.num_key_value_heads,
        head_dim=getattr(target_config, "head_dim", None) or target_config.hidden_size // target_config.num_attention_heads,
        rope_theta=rope, rms_norm_eps=target_config.rms_norm_eps, draft_vocab=len(d2t), target_vocab=V,
    )
    draft = EagleDraft(cfg, d2t, embed_weight)
    if lm_head_weight is not None:
        draft.init_head_from(lm_head_weight)
    return draft.eval()

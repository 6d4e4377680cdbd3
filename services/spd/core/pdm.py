"""The Pipeline Draft Module (PDM): a small Qwen3-style decoder over fused target anchor states.

Input per position i: the target's own anchor states H[b][i] for the anchors eligible at that
position's depth (always a prefix of the sorted anchors B, design §2). One fusion per prefix length
(RMSNorm each anchor, concatenate, linear to the PDM width) turns them into g[depth][i]. With
`prev`, a second set of fusions reads the predecessor's anchors H[b][i-1] (eligible at its own depth
in the same staircase) and is added: the newest in-flight position, which has only its embedding,
then starts from its predecessor's deeper states too, as EAGLE's input pairs a token with the
previous token's feature. L_s
Qwen3 decoder layers (GQA, q/k norm, RoPE, SwiGLU) run over the g's with an explicit attention
mask; a final norm and a reduced-vocabulary head (draft id -> target id via `d2t`) give the
logits. Training (masked, all staircases at once) and inference (incremental) call the same
`forward`, so they cannot drift apart.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import Qwen3DecoderLayer, Qwen3RMSNorm, Qwen3RotaryEmbedding

from spd.core.row_attention import ROWS


@dataclass
class PDMConfig:
    target_hidden: int  # d: width of the target's residual stream (anchor size)
    anchors: list[int]  # B = [0, b1, ...]: anchor layers, sorted, 0 = embedding
    num_layers: int = 1  # L_s: PDM decoder layers
    hidden_size: int = 0  # PDM width; 0 = target_hidden (lets the head start from the target's LM head)
    intermediate_size: int = 1536  # SwiGLU width
    num_heads: int = 9  # attention heads
    num_kv_heads: int = 3  # GQA key/value heads
    head_dim: int = 64  # per-head width
    rope_theta: float = 100000.0  # RoPE base
    rms_norm_eps: float = 1e-5  # RMSNorm epsilon
    draft_vocab: int = 0  # V_s: rows of the reduced head
    target_vocab: int = 0  # V of the target, for mapping drafts back
    schedule: str = "pre"  # staircase schedule it was trained for: pre (s0 = 0) or post (s0 = 1)
    trained_n: int = 0  # pipeline width it was trained for (0 = untrained)
    prev: bool = False  # each position's input also fuses its predecessor's anchors (at the predecessor's depth in the same staircase), as EAGLE pairs a token with the previous token's features
    notes: dict = field(default_factory=dict)  # provenance: data, tokens seen, agreement

    def __post_init__(self):
        self.anchors = sorted(self.anchors)
        if self.anchors[0] != 0:
            raise ValueError("anchors must include 0 (the embedding)")
        self.hidden_size = self.hidden_size or self.target_hidden

    def qwen3(self) -> Qwen3Config:
        return Qwen3Config(  # type: ignore[call-arg]  # attn_implementation is a PretrainedConfig kwarg
            vocab_size=self.draft_vocab, hidden_size=self.hidden_size, intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_layers, num_attention_heads=self.num_heads,
            num_key_value_heads=self.num_kv_heads, head_dim=self.head_dim, rms_norm_eps=self.rms_norm_eps,
            rope_parameters={"rope_type": "default", "rope_theta": self.rope_theta},
            attn_implementation=ROWS,  # sdpa, and per-request histories for batched drafts
        )


class AnchorFusion(nn.Module):
    """g = W · concat(RMSNorm_b(H[b]) for b in an eligible prefix of k anchors)."""

    def __init__(self, k: int, d: int, width: int, eps: float):
        super().__init__()
        self.norms = nn.ModuleList(Qwen3RMSNorm(d, eps=eps) for _ in range(k))
        self.proj = nn.Linear(k * d, width, bias=False)

    def forward(self, anchors: torch.Tensor) -> torch.Tensor:  # anchors: [..., k, d] -> [..., width]
        parts = [norm(anchors[..., i, :]) for i, norm in enumerate(self.norms)]
        return self.proj(torch.cat(parts, dim=-1))


class PDM(nn.Module):
    def __init__(self, config: PDMConfig, d2t: torch.Tensor):
        super().__init__()
        self.config = config
        qc = config.qwen3()
        m, d, w = len(config.anchors), config.target_hidden, config.hidden_size
        self.fusions = nn.ModuleList(AnchorFusion(k, d, w, config.rms_norm_eps) for k in range(1, m + 1))
        self.prev_fusions = (nn.ModuleList(AnchorFusion(k, d, w, config.rms_norm_eps) for k in range(1, m + 1))
                             if config.prev else None)
        self.layers = nn.ModuleList(Qwen3DecoderLayer(qc, i) for i in range(config.num_layers))
        self.rotary = Qwen3RotaryEmbedding(qc)
        self.norm = Qwen3RMSNorm(w, eps=config.rms_norm_eps)
        self.head = nn.Linear(w, config.draft_vocab, bias=False)
        self.d2t: torch.Tensor  # [V_s] draft id -> target id (a buffer: moves with the module)
        self.register_buffer("d2t", d2t.long().clone())
        for mod in self.modules():
            if isinstance(mod, nn.Linear):
                nn.init.normal_(mod.weight, std=0.02)

    def fuse(self, anchors: torch.Tensor, num_eligible: torch.Tensor,
             prev: tuple[torch.Tensor, torch.Tensor] | None = None, fixed: bool = False) -> torch.Tensor:
        """anchors: [Q, m, d] (ineligible slots ignored); num_eligible: [Q] -> g: [Q, w].

        prev (required with config.prev): the predecessors' anchors [Q, m, d] and eligible counts [Q]
        (0: no predecessor), fused by their own fusions and added. `fixed`: each fusion that some row
        needs runs over all Q rows, so a row's result does not depend on how many other rows share
        its eligible count (batch invariance)."""
        g = _fuse(self.fusions, anchors, num_eligible, self.config.hidden_size, fixed)
        if self.prev_fusions is not None:
            if prev is None:
                raise ValueError("this PDM also reads each position's predecessor: pass prev")
            g = g + _fuse(self.prev_fusions, *prev, self.config.hidden_size, fixed).to(g.dtype)
        return g

    def forward(self, g: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None, cache=None) -> torch.Tensor:
        """Draft-vocabulary logits for fused features.

        g: [Q, w] or [B, Q, w]; positions: [Q] or [B, Q] RoPE positions; mask: bool [B|1, 1, Q, K]
        (True = may attend) or None (attend to everything). Returns [Q, V_s] or [B, Q, V_s]. With
        `cache` (inference, unbatched), these positions' keys/values are appended to it; the caller
        commits or truncates.
        """
        h = self.hidden(g, positions, mask, cache)
        return self.logits(h)

    def hidden(self, g: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None, cache=None) -> torch.Tensor:
        """The decoder layers of `forward` (before the final norm): same shapes as g."""
        batched = g.dim() == 3
        h = g if batched else g.unsqueeze(0)  # [B, Q, w]
        pos = positions if positions.dim() == 2 else positions.unsqueeze(0)  # [B|1, Q]
        rope = self.rotary(h, pos)
        for layer in self.layers:
            h = layer(h, attention_mask=mask, position_ids=pos, past_key_values=cache, position_embeddings=rope)
        return h if batched else h[0]

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Final norm + reduced head (training applies it to the loss rows only)."""
        return self.head(self.norm(h))

    def init_head_from(self, lm_head_weight: torch.Tensor) -> None:
        """Start the reduced head from the target's LM head rows of the draft vocabulary."""
        if lm_head_weight.shape[1] == self.config.hidden_size:
            with torch.no_grad():
                self.head.weight.copy_(lm_head_weight[self.d2t])

    def save(self, out: Path) -> None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps(asdict(self.config), indent=2))
        state = {k: v.detach().to(torch.float16 if v.is_floating_point() else v.dtype).contiguous()
                 for k, v in self.state_dict().items()}
        save_file(state, out / "pdm.safetensors")

    @classmethod
    def load(cls, path: Path, device="cpu", dtype=torch.float32) -> "PDM":
        config = PDMConfig(**json.loads((Path(path) / "config.json").read_text()))
        state = load_file(Path(path) / "pdm.safetensors")
        pdm = cls(config, state["d2t"])
        pdm.load_state_dict({k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()})
        return pdm.to(device).eval()


def _fuse(fusions: nn.ModuleList, anchors: torch.Tensor, counts: torch.Tensor, width: int, fixed: bool) -> torch.Tensor:
    """Row q through fusions[counts[q] - 1] (counts 0: zeros): anchors [Q, m, d] -> [Q, width], in the
    fusions' output dtype (bf16 under autocast)."""
    out = None
    for k in counts.unique().tolist():
        if k == 0:
            continue
        rows = counts == k
        g = fusions[k - 1](anchors[:, :k])[rows] if fixed else fusions[k - 1](anchors[rows, :k])
        if out is None:
            out = g.new_zeros(anchors.shape[0], width)
        out[rows] = g
    return out if out is not None else anchors.new_zeros(anchors.shape[0], width)


def random_pdm(target_config, anchors: list[int], num_layers: int, draft_ids: torch.Tensor | None = None,
               lm_head_weight: torch.Tensor | None = None, seed: int = 0, prev: bool = False) -> PDM:
    """An untrained PDM shaped after the target (its widths, heads, RoPE base)."""
    torch.manual_seed(seed)
    V = target_config.vocab_size
    d2t = torch.arange(V) if draft_ids is None else draft_ids
    rope = (getattr(target_config, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
    cfg = PDMConfig(
        target_hidden=target_config.hidden_size, anchors=list(anchors), num_layers=num_layers,
        intermediate_size=target_config.intermediate_size, num_heads=target_config.num_attention_heads,
        num_kv_heads=target_config.num_key_value_heads,
        head_dim=getattr(target_config, "head_dim", None) or target_config.hidden_size // target_config.num_attention_heads,
        rope_theta=rope, rms_norm_eps=target_config.rms_norm_eps, draft_vocab=len(d2t), target_vocab=V, prev=prev,
    )
    pdm = PDM(cfg, d2t)
    if lm_head_weight is not None:
        pdm.init_head_from(lm_head_weight)
    return pdm.eval()

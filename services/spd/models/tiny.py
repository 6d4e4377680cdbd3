"""Tiny random target models (Llama, Qwen2, Qwen3) written as HF directories, for tests and benchmarks.

Random weights, so their text is meaningless; the algorithm only needs the architecture. With
`tokenizer_from`, the tokenizer files of a real model are copied in (the vocabulary then follows
that tokenizer); otherwise the model is id-only.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

_CONFIGS = {"llama": LlamaConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config}
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")


def make_tiny_model(out: Path, arch: str = "llama", vocab_size: int = 256, num_layers: int = 6,
                    hidden_size: int = 64, max_positions: int = 512, seed: int = 0,
                    tokenizer_from: Path | None = None, init_std: float = 0.02) -> Path:
    """Write a random `arch` model with the given shape into `out` (skipped if already there)."""
    out = Path(out)
    if (out / "config.json").exists():
        return out
    config = _CONFIGS[arch](
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2, head_dim=hidden_size // 4,
        max_position_embeddings=max_positions, tie_word_embeddings=False, initializer_range=init_std,
        eos_token_id=vocab_size - 1, bos_token_id=0, pad_token_id=0,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(out)
    if tokenizer_from is not None:
        for name in _TOKENIZER_FILES:
            if (Path(tokenizer_from) / name).exists():
                shutil.copy(Path(tokenizer_from) / name, out / name)
    return out

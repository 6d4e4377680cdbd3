"""Shared fixtures: tiny random models (fast, most tests) and the real default model (a few)."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch

from spd.core.sampling import SamplingParams
from spd.core.split import default_anchors, uniform_split
from spd.core.stopping import StopRule, eos_ids_of
from spd.core.target import load_pipeline
from spd.core.ar import ar_generate
from spd.models.loading import load_config, resolve_model
from spd.models.tiny import make_tiny_model
from spd.pipeline import PipelineConfig, build_local
from spd.text import encode_prompt

torch.set_num_threads(1)  # tiny models gain nothing from threads; CI has 2 cores for several processes


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """Factory: tiny_dir(arch, **shape) -> a cached random model directory."""
    root = tmp_path_factory.mktemp("tiny")

    def make(arch: str = "llama", **kw) -> Path:
        name = arch + "".join(f"_{k}{v}" for k, v in sorted(kw.items()))
        kw.setdefault("init_std", 0.5)  # peaked distributions: greedy ties are negligible
        return make_tiny_model(root / name, arch, **kw)

    return make


def pipeline(model_dir: Path, n: int, anchors=None):
    config = load_config(model_dir)
    split = uniform_split(config.num_hidden_layers, n)
    anchors = tuple(anchors) if anchors is not None else default_anchors(split)
    return config, split, load_pipeline(model_dir, config, split, anchors)


def ar_tokens(model_dir: Path, prompt: list[int], max_tokens: int, params=SamplingParams(), eos=frozenset()) -> list[int]:
    _, _, stages = pipeline(model_dir, 1)
    return ar_generate(stages, prompt, params, StopRule(max_tokens, eos)).token_ids


@functools.cache
def _local_ar(model_dir: str, rows: int):
    local = build_local(PipelineConfig(model=model_dir, n=1), with_drafter=False)
    for stage in local.stages:
        stage.rows = rows
    return local


def ar_reference(model_dir, prompt: str, max_tokens: int, params=SamplingParams(), rows: int = 1) -> list[int]:
    """Plain AR of a text prompt, as a cluster of `rows` slots serves it alone (batch invariance: same
    single-token shape). One in-process pipeline per (model, rows), loaded once for the whole run."""
    local = _local_ar(str(model_dir), rows)
    rule = StopRule(max_tokens, eos_ids_of(local.tokenizer, local.config))
    return ar_generate(local.stages, encode_prompt(local.tokenizer, prompt), params, rule).token_ids


@pytest.fixture(scope="session")
def tiny_chat_model(tmp_path_factory) -> Path:
    """A tiny random Llama (6 layers) with the default model's tokenizer, so prompts and text work."""
    return make_tiny_model(tmp_path_factory.mktemp("chat") / "tiny", "llama", vocab_size=49152, num_layers=6,
                           hidden_size=64, tokenizer_from=resolve_model(None), init_std=0.5)


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    """The embedded SmolLM2-135M-Instruct (converted once into the SPD cache)."""
    return resolve_model(None)

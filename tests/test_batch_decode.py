"""Continuous-batching self-generation: each row's greedy output is the model's own AR output,
whatever else shares the batch (rows of different lengths joining and leaving)."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import AutoModelForCausalLM

from spd.train.batch_decode import BatchDecoder
from tests.conftest import ar_tokens


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_batched_greedy_equals_ar_for_every_row(tiny_dir, arch):
    model_dir = tiny_dir(arch)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    rng = random.Random(0)
    eos = model.config.eos_token_id
    prompts = [[rng.randrange(1, eos) for _ in range(rng.randrange(1, 40))] for _ in range(11)]
    got: dict[int, list[int]] = {}
    dec = BatchDecoder(model, batch=4, max_new=24, eos_id=eos, slack=5)
    dec.run([(i, p, 0.0) for i, p in enumerate(prompts)], lambda i, r: got.__setitem__(i, list(r)), chunk=3)
    assert sorted(got) == list(range(len(prompts)))
    for i, p in enumerate(prompts):
        want = ar_tokens(model_dir, p, 24, eos=frozenset({eos}))
        assert got[i] == want, f"row {i}"

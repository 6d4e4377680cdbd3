"""Continuous-batching self-generation: each row's greedy output is the model's own AR output,
whatever else shares the batch (rows of different lengths joining and leaving, re-laid out oldest
first, attending a group of rows at a time over each group's own window)."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import AutoModelForCausalLM

from spd.train.batch_decode import BatchDecoder, decode_attention, sample
from tests.conftest import ar_tokens


@pytest.mark.parametrize("arch,group", [("llama", 2), ("qwen3", 3), ("llama", 16)])
def test_batched_greedy_equals_ar_for_every_row(tiny_dir, arch, group):
    model_dir = tiny_dir(arch)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    rng = random.Random(0)
    eos = model.config.eos_token_id
    prompts = [[rng.randrange(1, eos) for _ in range(rng.randrange(1, 40))] for _ in range(11)]
    got: dict[int, list[int]] = {}
    dec = BatchDecoder(model, batch=4, max_new=24, eos_id=eos, slack=5, group=group)
    dec.run([(i, p, 0.0) for i, p in enumerate(prompts)], lambda i, r: got.__setitem__(i, list(r)), prefill_tokens=60)
    assert sorted(got) == list(range(len(prompts)))
    for i, p in enumerate(prompts):
        want = ar_tokens(model_dir, p, 24, eos=frozenset({eos}))
        assert got[i] == want, f"row {i}"


def test_features_recorded_while_decoding_equal_a_prefill_of_the_generated_text(tiny_dir):
    """One pass: the anchors and top-k recorded during generation are what a separate teacher
    prefill (spd.train.online) computes over prompt + response[:-1]."""
    from spd.train.online import OnlineTeacher
    from spd.train.recorder import FeatureRecorder

    model_dir = tiny_dir("llama")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    rng = random.Random(1)
    eos = model.config.eos_token_id
    prompts = [[rng.randrange(1, eos) for _ in range(rng.randrange(1, 30))] for _ in range(7)]
    layers = [0, 1, model.config.num_hidden_layers - 1, model.config.num_hidden_layers]
    got: dict[int, list[int]] = {}
    feats: dict[int, dict] = {}
    dec = BatchDecoder(model, batch=3, max_new=12, eos_id=eos, slack=4, group=2,
                       recorder=FeatureRecorder(layers, feats.__setitem__))
    dec.run([(i, p, 0.0) for i, p in enumerate(prompts)], lambda i, r: got.__setitem__(i, list(r)), prefill_tokens=40)
    teacher = OnlineTeacher(model_dir, layers, dtype=torch.float32)
    want = teacher.features([(p + got[i][:-1], len(p) - 1) for i, p in enumerate(prompts)])
    assert sorted(feats) == list(range(len(prompts)))
    for i, w in enumerate(want):
        f = feats[i]
        assert torch.equal(f["tokens"], w["tokens"]) and torch.equal(f["loss"], w["loss"])
        scale = w["anchors"].float().abs().amax()  # states reach ~500: fp16's own spacing there is 0.25
        assert (f["anchors"].float() - w["anchors"].float()).abs().amax() <= 1e-3 * scale
        torch.testing.assert_close(f["top_p"].float(), w["top_p"].float(), atol=1e-3, rtol=1e-2)
        assert (f["top_ids"][:, 0] == w["top_ids"][:, 0]).all()  # the argmax (near-ties aside)


def test_sampled_ids_follow_the_softmax_at_each_rows_temperature():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 6, generator=gen) * 2  # [3, V]
    logits[1, 2] = float("-inf")  # probability 0: never drawn
    temps = torch.tensor([0.7, 1.0, 1.5])
    n = 20_000
    ids = sample(logits.repeat(n, 1), temps.repeat(n), gen).view(n, 3)  # [n, 3]
    freq = torch.stack([torch.bincount(ids[:, r], minlength=6) / n for r in range(3)])  # [3, V]
    want = torch.softmax(logits / temps[:, None], -1)
    assert (freq - want).abs().max() < 0.015  # ~4 standard errors of a frequency at n = 20k
    assert freq[1, 2] == 0


def test_cpu_decode_attention_equals_sdpa_with_grouped_query_heads_and_a_window_mask():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(4, 6, 1, 8, generator=g)  # [b, H, 1, D]
    k, v = (torch.randn(4, 2, 12, 8, generator=g) for _ in range(2))  # [b, H_kv, W, D]
    bias = torch.zeros(4, 1, 1, 12)
    bias[0, ..., :5] = bias[2, ..., :9] = float("-inf")  # rows whose windows start later
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=0.3, enable_gqa=True)
    torch.testing.assert_close(decode_attention(q, k, v, bias, 0.3), want)
    got = decode_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), bias.bfloat16(), 0.3)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want, atol=0.03, rtol=0.03)

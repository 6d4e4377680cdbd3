"""Sampled SPD has exactly the target's distribution (rejection sampling is lossless), and a seed
reproduces its output.

Statistical test: on a 6-token vocabulary the exact distribution of 3-token continuations (216
outcomes) is enumerated from the target; SPD with a random (so often rejected) PDM draws R samples
with seeds 0..R-1; a chi-square goodness-of-fit test (bins with expected count < 5 pooled) must not
reject at level 1e-3. False-alarm rate: 1e-3 per parameter set for a correct sampler; the seeds are
fixed, so the outcome is deterministic.
"""


import pytest
import torch
from scipy.stats import chisquare
from transformers import AutoModelForCausalLM

from conftest import pipeline
from spd.core.drafter import DrafterState
from spd.core.engine import SPDEngine
from spd.core.pdm import random_pdm
from spd.core.sampling import SamplingParams, sampling_probs
from spd.core.stopping import StopRule
from spd.core.ar import ar_generate

PROMPT = [1, 4, 2]
V, STEPS, R = 6, 3, 1500


def _exact_distribution(model_dir, params) -> dict[tuple, float]:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    probs: dict[tuple, float] = {(): 1.0}
    for _ in range(STEPS):
        nxt = {}
        for seq, pr in probs.items():
            with torch.no_grad():
                logits = model(torch.tensor([PROMPT + list(seq)])).logits[0, -1]
            for tok, pt in enumerate(sampling_probs(logits, params).tolist()):
                if pt > 0:
                    nxt[seq + (tok,)] = pr * pt
        probs = nxt
    return probs


@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0), SamplingParams(temperature=0.8, top_k=4, top_p=0.9),
                                    SamplingParams(temperature=1.0, coupling="gumbel")])
def test_sampled_spd_matches_the_target_distribution(tiny_dir, params):
    model_dir = tiny_dir("llama", vocab_size=V, num_layers=4, init_std=0.15)
    exact = _exact_distribution(model_dir, params)
    config, split, stages = pipeline(model_dir, 2, anchors=[0, 2, 4])
    engine = SPDEngine(stages, DrafterState(random_pdm(config, [0, 2, 4], 1, seed=3), stages[0].embed, split))
    counts: dict[tuple, int] = {}
    rejects = 0
    for seed in range(R):
        g = engine.generate(PROMPT, SamplingParams(params.temperature, params.top_k, params.top_p, seed, params.coupling),
                            StopRule(STEPS))
        counts[tuple(g.token_ids)] = counts.get(tuple(g.token_ids), 0) + 1
        rejects += g.stats.rejects
    assert set(counts) <= set(exact), "SPD produced a continuation the target cannot"
    assert rejects > R // 10, "the test must exercise rejections"
    observed, expected, pool_o, pool_e = [], [], 0, 0.0
    for seq, pr in exact.items():
        if pr * R >= 5:
            observed.append(counts.get(seq, 0))
            expected.append(pr * R)
        else:
            pool_o, pool_e = pool_o + counts.get(seq, 0), pool_e + pr * R
    if pool_e > 0:
        observed.append(pool_o)
        expected.append(pool_e)
    expected = [e * R / sum(expected) for e in expected]  # float32 probabilities: renormalise exactly
    assert chisquare(observed, expected).pvalue > 1e-3


def test_the_same_seed_reproduces_the_same_sampled_output(tiny_dir):
    model_dir = tiny_dir("qwen3", num_layers=4, init_std=0.15)
    config, split, stages = pipeline(model_dir, 3, anchors=[0, 1, 3])
    engine = SPDEngine(stages, DrafterState(random_pdm(config, [0, 1, 3], 1), stages[0].embed, split))
    params = SamplingParams(temperature=1.0, top_p=0.95, seed=1234)
    first = engine.generate(PROMPT, params, StopRule(20)).token_ids
    assert engine.generate(PROMPT, params, StopRule(20)).token_ids == first
    others = {tuple(engine.generate(PROMPT, SamplingParams(1.0, 0, 0.95, s), StopRule(20)).token_ids) for s in range(4)}
    assert len(others) > 1


@pytest.mark.parametrize("n", [2, 4])
def test_gumbel_coupled_spd_samples_exactly_what_ar_samples_with_the_same_seed(tiny_dir, n):
    model_dir = tiny_dir("llama", num_layers=4, init_std=0.15)
    config, split, stages = pipeline(model_dir, n, anchors=[0, 2, 4])
    _, _, ar = pipeline(model_dir, 1, anchors=[0])
    engine = SPDEngine(stages, DrafterState(random_pdm(config, [0, 2, 4], 1), stages[0].embed, split))
    for seed in range(5):
        params = SamplingParams(temperature=0.9, top_p=0.95, seed=seed, coupling="gumbel")
        got = engine.generate(PROMPT, params, StopRule(30))
        assert got.token_ids == ar_generate(ar, PROMPT, params, StopRule(30)).token_ids
        assert got.stats.rejects > 0

"""Greedy SPD is token-for-token the target's own greedy output, whatever n, schedule and drafter."""

import pytest

from conftest import ar_tokens, pipeline
from spd.core.drafter import DrafterState
from spd.core.engine import SPDEngine
from spd.core.pdm import random_pdm
from spd.core.sampling import SamplingParams
from spd.core.scripted import ScriptedDrafter
from spd.core.stopping import StopRule

PROMPT = [5, 17, 33, 2, 9, 41]


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("schedule", ["pre", "post"])
def test_greedy_spd_equals_ar_with_a_random_pdm(tiny_dir, arch, n, schedule):
    model_dir = tiny_dir(arch, num_layers=5)
    expected = ar_tokens(model_dir, PROMPT, 24)
    anchors = sorted({0, 1, 3, 5})  # not aligned with every split: eligibility must still work
    config, split, stages = pipeline(model_dir, n, anchors)
    drafter = DrafterState(random_pdm(config, anchors, num_layers=2), stages[0].embed, split)
    got = SPDEngine(stages, drafter, schedule).generate(PROMPT, SamplingParams(), StopRule(24))
    assert got.token_ids == expected
    assert got.stats.generated_tokens == 24


def test_greedy_spd_equals_ar_when_the_drafter_is_sometimes_wrong(tiny_dir):
    model_dir = tiny_dir("llama", num_layers=6)
    expected = ar_tokens(model_dir, PROMPT, 40)
    config, split, stages = pipeline(model_dir, 3)
    drafter = ScriptedDrafter(PROMPT + expected, config.vocab_size, wrong_every=4)
    got = SPDEngine(stages, drafter).generate(PROMPT, SamplingParams(), StopRule(40))
    assert got.token_ids == expected
    assert got.stats.rejects > 0 and got.stats.accepts > 0


def test_n_equal_to_the_number_of_layers_is_lossless(tiny_dir):
    model_dir = tiny_dir("qwen3", num_layers=4)
    expected = ar_tokens(model_dir, PROMPT, 16)
    config, split, stages = pipeline(model_dir, 4, anchors=[0, 1, 2, 3, 4])
    drafter = DrafterState(random_pdm(config, [0, 1, 2, 3, 4], 1), stages[0].embed, split)
    assert SPDEngine(stages, drafter).generate(PROMPT, SamplingParams(), StopRule(16)).token_ids == expected


def test_without_a_drafter_decoding_continues_one_token_in_flight(tiny_dir):
    model_dir = tiny_dir("llama")
    expected = ar_tokens(model_dir, PROMPT, 10)
    _, _, stages = pipeline(model_dir, 3)
    got = SPDEngine(stages, drafter=None).generate(PROMPT, SamplingParams(), StopRule(10))
    assert got.token_ids == expected
    assert got.stats.cycles == 3 * 9 and got.stats.accepts == got.stats.rejects == 0

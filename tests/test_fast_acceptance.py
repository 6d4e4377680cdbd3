"""The offline acceptance replay agrees exactly with the live engine's counts."""

import pytest

from conftest import pipeline
from spd.core.drafter import DrafterState
from spd.core.engine import SPDEngine
from spd.core.pdm import random_pdm
from spd.core.sampling import SamplingParams
from spd.core.stopping import StopRule
from spd.eval.acceptance import ar_with_anchors, replay

PROMPTS = [[3, 1, 4, 1, 5], [2, 4, 1, 3], [5, 0, 2]]


@pytest.mark.parametrize("n", [1, 2, 3, 5])
@pytest.mark.parametrize("schedule", ["pre", "post"])
def test_replayed_verdicts_equal_the_engine_counts(tiny_dir, n, schedule):
    # A small vocabulary makes a random PDM right often enough to mix accepts and rejects.
    model_dir = tiny_dir("llama", vocab_size=6, num_layers=5, init_std=0.3)
    anchors = [0, 1, 3, 5]
    config, split, stages = pipeline(model_dir, n, anchors)
    drafter = DrafterState(random_pdm(config, anchors, num_layers=2, seed=5), stages[0].embed, split)
    mixed = False
    for prompt in PROMPTS:
        live = SPDEngine(stages, drafter, schedule).generate(prompt, SamplingParams(), StopRule(30))
        generated, states = ar_with_anchors(stages, prompt, StopRule(30))
        fast = replay(drafter, prompt, generated, states, schedule)
        assert generated == live.token_ids
        assert (fast.accepts, fast.rejects, fast.cycles) == (live.stats.accepts, live.stats.rejects, live.stats.cycles)
        mixed |= fast.accepts > 0 and fast.rejects > 0
    assert mixed or (schedule == "post" and n == 1)

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


@pytest.mark.parametrize("k", [1, 3, 7])
def test_replayed_eagle_rounds_equal_the_live_eagle_engine(tiny_dir, k):
    import torch

    from spd.core.target import context_limit, max_new_tokens
    from spd.eagle.engine import EagleEngine
    from spd.eagle.model import random_eagle
    from spd.eval.acceptance import eagle_replay

    # A small vocabulary makes a random draft right often enough to accept chains of several tokens.
    model_dir = tiny_dir("llama", vocab_size=6, num_layers=6, init_std=0.3)
    layers = [1, 3, 5]
    config, _, stages = pipeline(model_dir, 1, layers)
    draft = random_eagle(config, tuple(layers), draft_ids=torch.arange(config.vocab_size),
                         embed_weight=stages[0].embed.weight, seed=2)
    engine = EagleEngine(stages, draft, k)
    some_accepted = False
    for prompt in PROMPTS:
        stop = StopRule(30, frozenset({5}))
        live = engine.generate(prompt, SamplingParams(), stop)
        generated, anchors = ar_with_anchors(stages, prompt, stop)
        fast = eagle_replay(engine.drafter, layers, prompt, generated, anchors, k,
                            max_new_tokens(len(prompt), stop, stages), context_limit(stages))
        assert generated == live.token_ids
        assert (fast.generated_tokens, fast.cycles, fast.accepts) == (
            live.stats.generated_tokens, live.stats.cycles, live.stats.accepts)
        some_accepted |= fast.accepts > 0
    assert some_accepted

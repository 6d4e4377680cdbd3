"""Edge cases: one token, EOS first, prompts at the context limit, bad prompts, stop strings."""

import pytest

from conftest import ar_tokens, pipeline
from spd.core.drafter import DrafterState
from spd.core.engine import SPDEngine
from spd.core.pdm import random_pdm
from spd.core.sampling import SamplingParams
from spd.core.stopping import StopRule

PROMPT = [5, 6, 7, 8]


def _engine(model_dir, n=3):
    config, split, stages = pipeline(model_dir, n, anchors=[0, 2, 4])
    return SPDEngine(stages, DrafterState(random_pdm(config, [0, 2, 4], 1), stages[0].embed, split))


def test_max_tokens_one_returns_the_prefill_token_without_cycles(tiny_dir):
    model_dir = tiny_dir("llama", num_layers=4)
    got = _engine(model_dir).generate(PROMPT, SamplingParams(), StopRule(1))
    assert got.token_ids == ar_tokens(model_dir, PROMPT, 1)
    assert got.finish_reason == "length" and got.stats.cycles == 0 and got.stats.alpha is None


def test_eos_as_the_first_token_stops_at_once(tiny_dir):
    model_dir = tiny_dir("llama", num_layers=4)
    first = ar_tokens(model_dir, PROMPT, 1)[0]
    got = _engine(model_dir).generate(PROMPT, SamplingParams(), StopRule(50, eos_ids=frozenset({first})))
    assert got.token_ids == [first] and got.finish_reason == "stop"


def test_eos_mid_stream_discards_tokens_in_flight_behind_it(tiny_dir):
    model_dir = tiny_dir("llama", num_layers=4)
    ref = ar_tokens(model_dir, PROMPT, 12)
    eos = ref[6]
    got = _engine(model_dir).generate(PROMPT, SamplingParams(), StopRule(50, eos_ids=frozenset({eos})))
    assert got.token_ids == ref[: ref.index(eos) + 1] and got.finish_reason == "stop"


@pytest.mark.parametrize("prompt_len, expected_tokens", [(32, 1), (31, 2), (28, 5)])
def test_a_prompt_at_the_context_limit_generates_only_what_fits(tiny_dir, prompt_len, expected_tokens):
    # Positions 0..ctx-1 can be processed; the last generated token never needs a forward.
    model_dir = tiny_dir("qwen3", num_layers=4, max_positions=32)
    prompt = [(3 * i) % 200 + 1 for i in range(prompt_len)]
    got = _engine(model_dir, n=2).generate(prompt, SamplingParams(), StopRule(100))
    assert len(got.token_ids) == expected_tokens and got.finish_reason == "length"
    assert got.token_ids == ar_tokens(model_dir, prompt, 100)


def test_prompts_that_are_empty_or_over_the_context_limit_are_refused(tiny_dir):
    engine = _engine(tiny_dir("qwen3", num_layers=4, max_positions=32), n=2)
    with pytest.raises(ValueError, match="empty"):
        engine.generate([], SamplingParams(), StopRule(4))
    with pytest.raises(ValueError, match="context is 32"):
        engine.generate(list(range(1, 34)), SamplingParams(), StopRule(4))
    # the boundary, the same for the server (spd.core.target.prompt_problem): a full context yields one token
    assert len(engine.generate(list(range(1, 33)), SamplingParams(), StopRule(4)).token_ids) == 1


def test_a_stop_string_ends_generation(default_model_dir):
    from spd.pipeline import PipelineConfig, build_local
    from spd.text import encode_prompt

    local = build_local(PipelineConfig(n=2, draft="random"))
    ids = encode_prompt(local.tokenizer, "Count from 1 to 20, separated by commas.")
    rule = StopRule(60, frozenset({local.tokenizer.eos_token_id}), ("7",), local.tokenizer)
    got = SPDEngine(local.stages, local.drafter()).generate(ids, SamplingParams(), rule)
    text = local.tokenizer.decode(got.token_ids)
    assert got.finish_reason == "stop" and "7" in text and rule.cut_text(text).count("7") == 0

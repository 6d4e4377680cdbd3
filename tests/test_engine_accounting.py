"""The cycle accounting of design §4: K, N, α with oracle and always-wrong drafters."""

import pytest

from conftest import ar_tokens, pipeline
from spd.core.engine import SPDEngine
from spd.core.sampling import SamplingParams
from spd.core.scripted import ScriptedDrafter
from spd.core.stopping import StopRule

PROMPT = [7, 3, 11, 19]


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_oracle_drafter_accepts_every_judgement_and_k_is_n_plus_n_minus_2(tiny_dir, n):
    # First token from prefill; cycles 1..n-1 fill the pipeline; from cycle n on each cycle commits one.
    model_dir = tiny_dir("llama", num_layers=5)
    N = 30
    expected = ar_tokens(model_dir, PROMPT, N)
    config, _, stages = pipeline(model_dir, n)
    got = SPDEngine(stages, ScriptedDrafter(PROMPT + expected, config.vocab_size)).generate(
        PROMPT, SamplingParams(), StopRule(N))
    assert got.token_ids == expected
    assert got.stats.rejects == 0 and got.stats.accepts == N - 1
    assert got.stats.cycles == N + n - 2


@pytest.mark.parametrize("n", [2, 3, 5])
def test_always_wrong_drafter_costs_n_cycles_per_token(tiny_dir, n):
    # Every judgement rejects; each correction refills the pipeline: K = n (N - 1), α -> 1/n.
    model_dir = tiny_dir("llama", num_layers=5)
    N = 25
    expected = ar_tokens(model_dir, PROMPT, N)
    config, _, stages = pipeline(model_dir, n)
    got = SPDEngine(stages, ScriptedDrafter(PROMPT + expected, config.vocab_size, wrong=True)).generate(
        PROMPT, SamplingParams(), StopRule(N))
    assert got.token_ids == expected
    assert got.stats.accepts == 0 and got.stats.rejects == N - 1
    assert got.stats.cycles == n * (N - 1)
    assert got.stats.alpha == pytest.approx(N / (n * (N - 1)))
    assert got.stats.theoretical_speedup == pytest.approx(n * got.stats.alpha)


def test_trace_records_each_cycle_and_the_fill_level(tiny_dir):
    model_dir = tiny_dir("llama", num_layers=4)
    expected = ar_tokens(model_dir, PROMPT, 8)
    config, _, stages = pipeline(model_dir, 4)
    got = SPDEngine(stages, ScriptedDrafter(PROMPT + expected, config.vocab_size), trace=True).generate(
        PROMPT, SamplingParams(), StopRule(8))
    assert len(got.trace) == got.stats.cycles
    assert [r["in_flight"] for r in got.trace[:4]] == [1, 2, 3, 4]
    assert all(r["accepted"] for r in got.trace if "judged" in r)

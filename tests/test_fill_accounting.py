"""Acceptance that depends on the fill level: the engine's α against schedule.alpha_from_fills."""

import random

import pytest

from conftest import ar_tokens, pipeline
from spd.core.drafter import Draft
from spd.core.engine import SPDEngine
from spd.core.sampling import SamplingParams
from spd.core.schedule import alpha_from_fills, judged_fills
from spd.core.scripted import ScriptedDrafter
from spd.core.stopping import StopRule


class FillDrafter(ScriptedDrafter):
    """Proposes the oracle's token with probability p[a - 1] at fill level a, else a wrong one."""

    def __init__(self, oracle, vocab_size, p, rng):
        super().__init__(oracle, vocab_size)
        self.p, self.rng = p, rng

    def fork(self):
        return self

    def draft(self, params, depths=None):
        a = sum(d < len(self.p) for d in self.depth)  # in-flight positions: not through all n stages
        d = super().draft(params, depths)
        if self.rng.random() < self.p[a - 1]:
            return d
        return Draft(d.position, (d.token + 1) % self.vocab_size, d.q, d.fill)


@pytest.mark.parametrize("p", [[0.2, 0.5, 0.6, 0.7, 0.8], [0.9, 0.6, 0.5, 0.4, 0.3]])
def test_engine_alpha_matches_the_judged_fill_chain(tiny_dir, p):
    model_dir = tiny_dir("llama", num_layers=5)
    config, _, stages = pipeline(model_dir, len(p))
    rng, generated, cycles = random.Random(0), 0, 0
    for seed in range(6):
        prompt = [3 + seed, 7, 11 + seed]
        expected = ar_tokens(model_dir, prompt, 200)
        got = SPDEngine(stages, FillDrafter(prompt + expected, config.vocab_size, p, rng)).generate(
            prompt, SamplingParams(), StopRule(200))
        assert got.token_ids == expected
        generated, cycles = generated + got.stats.generated_tokens, cycles + got.stats.cycles
    assert generated / cycles == pytest.approx(alpha_from_fills(p), abs=0.03)


def test_flat_acceptance_reduces_to_the_design_formula():
    for n in (2, 5, 8):
        for q in (0.0, 0.3, 0.62, 0.95):
            assert alpha_from_fills([q] * n) == pytest.approx(1 / (q + (1 - q) * n))
            w = judged_fills([q] * n)
            assert sum(w) == pytest.approx(1)
            assert w[:-1] == pytest.approx([(1 - q) * q ** (k - 1) for k in range(1, n)])


def test_after_every_reject_the_next_judged_draft_is_a_fill_one_draft():
    assert judged_fills([0.0, 0.5, 0.5]) == pytest.approx([1, 0, 0])
    assert alpha_from_fills([0.0, 0.9, 0.9]) == pytest.approx(1 / 3)

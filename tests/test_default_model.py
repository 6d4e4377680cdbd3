"""End to end on the real default model, SmolLM2-135M-Instruct (embedded GGUF, converted once)."""

import json
import subprocess
import sys

import pytest

from spd.core.engine import SPDEngine
from spd.core.sampling import SamplingParams
from spd.core.stopping import StopRule, eos_ids_of
from spd.core.ar import ar_generate
from spd.pipeline import PipelineConfig, build_local
from spd.text import encode_prompt

PROMPTS = ["What is the capital of France?", "Write a haiku about the sea.", "Explain what a CPU cache is."]


@pytest.fixture(scope="module")
def smollm(default_model_dir):
    return build_local(PipelineConfig(n=5))


def _ar(local, ids, max_tokens):
    ar = build_local(PipelineConfig(n=1), with_drafter=False)
    return ar_generate(ar.stages, ids, SamplingParams(), StopRule(max_tokens, eos_ids_of(local.tokenizer, local.config)))


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["pre", "post"])
def test_greedy_spd_on_smollm2_is_token_identical_to_ar(smollm, schedule):
    eos = eos_ids_of(smollm.tokenizer, smollm.config)
    for prompt in PROMPTS:
        ids = encode_prompt(smollm.tokenizer, prompt)
        expected = _ar(smollm, ids, 32).token_ids
        got = SPDEngine(smollm.stages, smollm.drafter(), schedule).generate(ids, SamplingParams(), StopRule(32, eos))
        assert got.token_ids == expected, prompt


@pytest.mark.slow
def test_spd_generate_cli_prints_json_with_tokens_and_stats(default_model_dir):
    cmd = [sys.executable, "-m", "spd.cli", "generate", "--prompt", PROMPTS[0], "--n", "5", "--max-tokens", "24", "--json"]
    out = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=600).stdout)
    ar = [sys.executable, "-m", "spd.cli", "generate", "--prompt", PROMPTS[0], "--engine", "ar", "--max-tokens", "24", "--json"]
    ref = json.loads(subprocess.run(ar, capture_output=True, text=True, check=True, timeout=600).stdout)
    assert out["token_ids"] == ref["token_ids"] and out["text"] == ref["text"] and "Paris" in out["text"]
    stats = out["stats"]
    assert stats["n"] == 5 and stats["generated_tokens"] == len(out["token_ids"])
    assert stats["alpha"] == pytest.approx(stats["generated_tokens"] / stats["cycles"])
    assert stats["theoretical_speedup"] == pytest.approx(5 * stats["alpha"])

"""Shared by the chaos tests: a tiny random chat model, its fault-free output, the workload."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from spd.core.sampling import SamplingParams  # noqa: E402
from spd.core.stopping import StopRule, eos_ids_of  # noqa: E402
from spd.core.ar import ar_generate  # noqa: E402
from spd.pipeline import PipelineConfig, build_local  # noqa: E402
from spd.text import encode_prompt  # noqa: E402

PROMPT = "tell me a long story about a lighthouse"
N, MAX_TOKENS = 3, 160


@pytest.fixture(scope="module")
def expected(tiny_chat_model):
    local = build_local(PipelineConfig(model=str(tiny_chat_model), n=1), with_drafter=False)
    rule = StopRule(MAX_TOKENS, eos_ids_of(local.tokenizer, local.config))
    return ar_generate(local.stages, encode_prompt(local.tokenizer, PROMPT), SamplingParams(), rule).token_ids

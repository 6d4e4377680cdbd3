"""Shared by the chaos tests: a tiny random chat model, its fault-free output, the workload."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from spd.core.sampling import SamplingParams  # noqa: E402
from spd.core.stopping import StopRule, eos_ids_of  # noqa: E402
from spd.core.target import ar_generate  # noqa: E402
from spd.local import PipelineConfig, build_local  # noqa: E402
from spd.models.loading import resolve_model  # noqa: E402
from spd.models.tiny import make_tiny_model  # noqa: E402
from spd.text import encode_prompt  # noqa: E402

PROMPT = "tell me a long story about a lighthouse"
N, MAX_TOKENS = 3, 160


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("chaos") / "tiny", "llama", vocab_size=49152, num_layers=6,
                           hidden_size=64, tokenizer_from=resolve_model(None), init_std=0.5)


@pytest.fixture(scope="module")
def expected(model_dir):
    local = build_local(PipelineConfig(model=str(model_dir), n=1), with_drafter=False)
    rule = StopRule(MAX_TOKENS, eos_ids_of(local.tokenizer, local.config))
    return ar_generate(local.stages, encode_prompt(local.tokenizer, PROMPT), SamplingParams(), rule).token_ids

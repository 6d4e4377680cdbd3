"""Chaos: kill -9 workers and the orchestrator mid-generation; the client sees the same tokens.

Greedy output must be identical to the fault-free output (recovery re-prefills the committed
prefix: the prompt as one chunk, then every generated token one at a time, as first computed, so
the rebuilt caches are bit-identical). Trials are seeded: which process dies, and after how many
streamed tokens.
"""

from __future__ import annotations

import os
import random
import signal
import time

import pytest

from cluster_util import address, pid_of, running_cluster, supervised
from spd.core.sampling import SamplingParams
from spd.core.stopping import StopRule, eos_ids_of
from spd.core.target import ar_generate
from spd.local import PipelineConfig, build_local
from spd.models.loading import resolve_model
from spd.models.tiny import make_tiny_model
from spd.text import encode_prompt
from spd_client import SPDClient

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


@pytest.fixture(scope="module")
def cluster(model_dir, tmp_path_factory):
    with running_cluster(tmp_path_factory.mktemp("chaos-logs"), n=N, model=str(model_dir), draft="random") as c:
        with supervised(c):
            yield c


def _stream_with_kill(cluster, role: str, after: int, retries: int = 5) -> tuple[list[int], dict]:
    tokens, stats = [], {}
    with SPDClient(address(cluster), timeout=180, retries=retries, backoff=0.5) as client:
        for i, chunk in enumerate(client.stream(PROMPT, max_tokens=MAX_TOKENS)):
            tokens += chunk.token_ids
            stats = chunk.stats or stats
            if i == after:
                os.kill(pid_of(cluster, role), signal.SIGKILL)
    return tokens, stats


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kill_a_random_stage_mid_decode_the_stream_is_token_identical(cluster, expected, seed):
    rng = random.Random(seed)
    role, after = f"stage-{rng.randint(1, N)}", rng.randint(5, 60)
    tokens, stats = _stream_with_kill(cluster, role, after)
    assert tokens == expected, f"{role} killed after {after} tokens"
    assert stats["recoveries"] >= 1


def test_kill_the_drafter_mid_decode_the_stream_is_token_identical(cluster, expected):
    # Without a drafter decoding goes on with one token in flight; when it is back, a recovery
    # rebuilds its state (or the request is already over).
    tokens, _ = _stream_with_kill(cluster, "drafter", after=20)
    assert tokens == expected
    time.sleep(3)  # the supervisor restarts it; the next request drafts again
    with SPDClient(address(cluster), timeout=180) as client:
        again = client.generate(PROMPT, max_tokens=MAX_TOKENS)
    assert again.token_ids == expected and again.stats["flushes"] > 0


def test_a_request_arriving_while_a_stage_is_dead_completes(cluster, expected):
    os.kill(pid_of(cluster, "stage-2"), signal.SIGKILL)  # the prefill meets a dead stage
    with SPDClient(address(cluster), timeout=180) as client:
        got = client.generate(PROMPT, max_tokens=MAX_TOKENS)
    assert got.token_ids == expected


def test_kill_the_orchestrator_the_sdk_retries_and_gets_the_identical_output(cluster, expected):
    tokens, _ = _stream_with_kill(cluster, "orchestrator", after=10, retries=20)
    assert tokens == expected
    time.sleep(0.5)


def test_sampled_gumbel_coupled_stream_survives_a_stage_kill_identically(cluster, model_dir):
    # With Gumbel coupling every committed token is a fixed function of (p, seed, position), so
    # the continuation after a recovery is the fault-free one (and equals plain AR sampling).
    local = build_local(PipelineConfig(model=str(model_dir), n=1), with_drafter=False)
    params = SamplingParams(temperature=1.0, top_k=50, seed=11, coupling="gumbel")
    rule = StopRule(MAX_TOKENS, eos_ids_of(local.tokenizer, local.config))
    want = ar_generate(local.stages, encode_prompt(local.tokenizer, PROMPT), params, rule).token_ids
    tokens = []
    with SPDClient(address(cluster), timeout=180) as client:
        for i, chunk in enumerate(client.stream(PROMPT, max_tokens=MAX_TOKENS, temperature=1.0, top_k=50, seed=11,
                                                coupling="gumbel")):
            tokens += chunk.token_ids
            if i == 15:
                os.kill(pid_of(cluster, "stage-2"), signal.SIGKILL)
    assert tokens == want

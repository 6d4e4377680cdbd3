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
from cluster_util import address, pid_of, running_cluster, supervised, wait_for
from conftest import ar_reference
from spd.core.sampling import SamplingParams
from spd.runtime.health import check
from spd_client import SPDClient

from .conftest import MAX_TOKENS, PROMPT, N

pytestmark = pytest.mark.processes  # starts worker processes: runs serially (scripts/test.sh)


@pytest.fixture(scope="module")
def cluster(tiny_chat_model, tmp_path_factory):
    with running_cluster(tmp_path_factory.mktemp("chaos-logs"), n=N, model=str(tiny_chat_model), draft="random") as c:
        with supervised(c):
            yield c


def _proc(cluster, role: str):
    return next(p for p in cluster.procs if p.role == role)


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
    killed = pid_of(cluster, "drafter")
    tokens, _ = _stream_with_kill(cluster, "drafter", after=20)
    assert tokens == expected
    replacement = _proc(cluster, "drafter")
    wait_for(lambda: replacement.popen.pid != killed and check(replacement.health), 120, "the drafter restarted")

    def drafts_again():  # until the orchestrator has heard the new drafter, a request runs without drafts
        with SPDClient(address(cluster), timeout=180) as client:
            again = client.generate(PROMPT, max_tokens=MAX_TOKENS)
        assert again.token_ids == expected
        return again.stats["flushes"] > 0

    wait_for(drafts_again, 60, "a request drafts again")


def test_a_stage_killed_twice_in_one_request_counts_two_recoveries(cluster, expected):
    # One kill used to count as two faults (the replacement's HELLO, heard while waiting for it,
    # raised a second one), so two kills exceeded max_recoveries = 3.
    tokens, stats = [], {}
    with SPDClient(address(cluster), timeout=180, retries=0) as client:  # no silent rerun
        for i, chunk in enumerate(client.stream(PROMPT, max_tokens=MAX_TOKENS)):
            tokens += chunk.token_ids
            stats = chunk.stats or stats
            if i in (10, 40):
                os.kill(pid_of(cluster, "stage-2"), signal.SIGKILL)
    assert tokens == expected
    assert stats["recoveries"] == 2


def test_a_hung_stage_is_replaced_and_the_stream_completes_identically(cluster, expected):
    # SIGSTOP: the process exists but answers nothing. The launcher kills it after hung_after_s
    # and restarts it; before, the request failed after 62 s and the stopped stage stayed forever.
    hung = pid_of(cluster, "stage-1")
    tokens, t0 = [], time.monotonic()
    with SPDClient(address(cluster), timeout=60, retries=0) as client:
        for i, chunk in enumerate(client.stream(PROMPT, max_tokens=MAX_TOKENS)):
            tokens += chunk.token_ids
            if i == 10:
                os.kill(hung, signal.SIGSTOP)
    assert tokens == expected
    assert pid_of(cluster, "stage-1") != hung
    assert time.monotonic() - t0 < 45


def test_a_request_arriving_while_a_stage_is_dead_completes(cluster, expected):
    os.kill(pid_of(cluster, "stage-2"), signal.SIGKILL)  # the prefill meets a dead stage
    with SPDClient(address(cluster), timeout=180) as client:
        got = client.generate(PROMPT, max_tokens=MAX_TOKENS)
    assert got.token_ids == expected


def test_kill_the_orchestrator_the_sdk_retries_and_gets_the_identical_output(cluster, expected):
    tokens, _ = _stream_with_kill(cluster, "orchestrator", after=10, retries=20)
    assert tokens == expected


def test_sampled_gumbel_coupled_stream_survives_a_stage_kill_identically(cluster, tiny_chat_model):
    # With Gumbel coupling every committed token is a fixed function of (p, seed, position), so
    # the continuation after a recovery is the fault-free one (and equals plain AR sampling).
    params = SamplingParams(temperature=1.0, top_k=50, seed=11, coupling="gumbel")
    want = ar_reference(tiny_chat_model, PROMPT, MAX_TOKENS, params)
    tokens = []
    with SPDClient(address(cluster), timeout=180) as client:
        for i, chunk in enumerate(client.stream(PROMPT, max_tokens=MAX_TOKENS, temperature=1.0, top_k=50, seed=11,
                                                coupling="gumbel")):
            tokens += chunk.token_ids
            if i == 15:
                os.kill(pid_of(cluster, "stage-2"), signal.SIGKILL)
    assert tokens == want

"""Many requests through one `spd up` pipeline (--max-concurrency 4): every request's tokens are
exactly its solo output, requests join a running pipeline without waiting for it to drain, and a
stage killed with four requests in flight costs none of them a token.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from cluster_util import address, pid_of, running_cluster, supervised, wait_for
from spd.core.engine import Request, SPDEngine
from spd.core.sampling import SamplingParams
from spd.core.scripted import ScriptedDrafter
from spd.core.stopping import StopRule, eos_ids_of
from spd.core.target import PREFILL_CHUNK
from spd.pipeline import PipelineConfig, build_local
from spd.text import encode_prompt
from conftest import ar_reference
from spd_client import SPDClient

pytestmark = pytest.mark.processes  # starts worker processes: runs serially (scripts/test.sh)

S = 4  # --max-concurrency: slots per worker, the stages' fixed batch shape
WORK = [("hello there", 40), ("tell me a story about the sea", 64), ("why is the sky blue?", 24),
        ("write a haiku about rain", 52)]


@pytest.fixture(scope="module")
def ar(tiny_chat_model):
    """A request's output alone, in process, with the stages at the same batch shape."""
    return lambda prompt, max_tokens: ar_reference(tiny_chat_model, prompt, max_tokens, rows=S)


@pytest.fixture(scope="module")
def solo(ar):
    return [ar(p, m) for p, m in WORK]


@pytest.fixture(scope="module")
def cluster(tiny_chat_model, tmp_path_factory):
    with running_cluster(tmp_path_factory.mktemp("many-logs"), n=3, model=str(tiny_chat_model), draft="random",
                         max_concurrency=S) as c:
        with supervised(c):
            yield c


def _stream(cluster, prompt: str, max_tokens: int, on_token=None) -> tuple[list[int], dict, list[float]]:
    tokens, stats, stamps = [], {}, []
    with SPDClient(address(cluster), timeout=180, retries=0) as client:
        for chunk in client.stream(prompt, max_tokens=max_tokens):
            tokens += chunk.token_ids
            stats = chunk.stats or stats
            stamps.append(time.monotonic())
            if on_token:
                on_token(len(tokens))
    return tokens, stats, stamps


def test_concurrent_requests_joining_at_different_times_each_equal_their_solo_output(cluster, solo):
    decoding = [threading.Event(), threading.Event()]  # set at the first two requests' 2nd streamed token
    with ThreadPoolExecutor(len(WORK)) as pool:
        futures = [pool.submit(_stream, cluster, prompt, max_tokens, lambda k, e=e: k >= 2 and e.set())
                   for (prompt, max_tokens), e in zip(WORK[:2], decoding)]
        assert all(e.wait(120) for e in decoding), "the first two requests did not stream 2 tokens within 120 s"
        # the other two join a pipeline that is already decoding
        futures += [pool.submit(_stream, cluster, prompt, max_tokens) for prompt, max_tokens in WORK[2:]]
        results = [f.result() for f in futures]
    assert [tokens for tokens, _, _ in results] == solo
    assert max(max(stats["batch"]) for _, stats, _ in results) > 1  # tokens of several requests shared forwards


def test_eight_requests_on_four_slots_queue_join_as_slots_free_and_each_equals_its_solo_output(cluster, solo):
    with ThreadPoolExecutor(2 * len(WORK)) as pool:
        results = list(pool.map(lambda w: _stream(cluster, *w), WORK + WORK))
    assert [tokens for tokens, _, _ in results] == solo + solo


def test_a_request_arriving_while_three_decode_gets_its_first_token_before_they_finish(cluster, solo):
    started = threading.Barrier(4)
    with ThreadPoolExecutor(3) as pool:
        long_runs = [pool.submit(_stream, cluster, WORK[1][0], WORK[1][1], lambda k: k == 3 and started.wait(60))
                     for _ in range(3)]
        started.wait(60)  # all three are decoding
        tokens, _, stamps = _stream(cluster, *WORK[2])
        others = [f.result() for f in long_runs]
    assert tokens == solo[2]
    assert all(t == solo[1] for t, _, _ in others)
    assert stamps[0] < min(s[-1] for _, _, s in others), "the newcomer waited for the running requests to finish"


def test_a_prompt_longer_than_a_prefill_chunk_joins_a_decoding_request_and_both_equal_their_solo_output(
        cluster, solo, ar):
    long_prompt = " ".join(["the sea is calm tonight and the sky is clear"] * 30)  # > PREFILL_CHUNK tokens
    started = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(_stream, cluster, WORK[1][0], WORK[1][1], lambda k: k == 3 and started.set())
        assert started.wait(60)
        tokens, stats, _ = _stream(cluster, long_prompt, 16)
        other = running.result()[0]
    assert stats["prompt_tokens"] > PREFILL_CHUNK
    assert tokens == ar(long_prompt, 16) and other == solo[1]


@pytest.mark.parametrize("role", ["stage-2", "drafter"])
def test_a_worker_killed_with_four_requests_streaming_costs_none_of_them_a_token(cluster, solo, role):
    killed = threading.Event()

    def kill_once(count: int) -> None:
        if count == 10 and not killed.is_set():
            killed.set()
            os.kill(pid_of(cluster, role), signal.SIGKILL)

    wait_for(cluster.healthy, 120, "every worker up")
    with ThreadPoolExecutor(len(WORK)) as pool:
        futures = [pool.submit(_stream, cluster, p, m, kill_once if i == 1 else None) for i, (p, m) in enumerate(WORK)]
        results = [f.result() for f in futures]
    assert killed.is_set()
    assert [tokens for tokens, _, _ in results] == solo


def test_concurrent_requests_judge_exactly_as_the_engine_does_with_the_same_scripted_drafter(tiny_chat_model, ar, tmp_path):
    """Per request, the processes' accepts, rejects and cycles equal the in-process engine's with the
    same (sometimes wrong) drafter: the many-request runtime wraps the same algorithm."""
    script = ar(*WORK[1])  # drafts follow this continuation: right for WORK[1]'s prompt, wrong elsewhere
    args = ["--script", ",".join(map(str, script)), "--script-wrong-every", "4"]
    with running_cluster(tmp_path, n=3, model=str(tiny_chat_model), max_concurrency=3, extra_drafter_args=args) as c:
        with ThreadPoolExecutor(3) as pool:
            results = list(pool.map(lambda w: _stream(c, *w), WORK[:3]))
    local = build_local(PipelineConfig(model=str(tiny_chat_model), n=3), with_drafter=False)
    for stage in local.stages:
        stage.rows = 3
    eos = eos_ids_of(local.tokenizer, local.config)
    drafter = ScriptedDrafter([], local.config.vocab_size, wrong_every=4, continuation=script, n=3)
    requests = [Request(encode_prompt(local.tokenizer, p), SamplingParams(), StopRule(m, eos)) for p, m in WORK[:3]]
    engine = SPDEngine(local.stages, drafter).generate_many(requests)
    for (tokens, stats, _), ref in zip(results, engine):
        assert tokens == ref.token_ids
        assert (stats["accepts"], stats["rejects"], stats["cycles"]) == (ref.stats.accepts, ref.stats.rejects,
                                                                          ref.stats.cycles)
    assert sum(ref.stats.rejects for ref in engine) > 0 and sum(ref.stats.accepts for ref in engine) > 0


def test_sampled_requests_through_the_cluster_do_not_depend_on_what_else_runs(cluster):
    work = [(p, m, SamplingParams(temperature=0.8, top_p=0.95, seed=20 + i)) for i, (p, m) in enumerate(WORK)]

    def run(w):
        prompt, max_tokens, params = w
        with SPDClient(address(cluster), timeout=180, retries=0) as client:
            return client.generate(prompt, max_tokens=max_tokens, temperature=params.temperature,
                                   top_p=params.top_p, seed=params.seed).token_ids

    alone = [run(w) for w in work]
    with ThreadPoolExecutor(len(work)) as pool:
        together = list(pool.map(run, work))
    assert together == alone

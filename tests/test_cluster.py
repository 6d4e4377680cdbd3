"""The distributed runtime end to end: real processes, ZeroMQ between them, gRPC in front."""

from __future__ import annotations

import time

import grpc
import pytest
import zmq

from cluster_util import address, running_cluster
from spd.core.engine import SPDEngine
from spd.core.sampling import SamplingParams
from spd.core.scripted import ScriptedDrafter
from spd.core.stopping import StopRule, eos_ids_of
from spd.core.target import ar_generate
from spd.local import PipelineConfig, build_local
from spd.models.loading import resolve_model
from spd.models.tiny import make_tiny_model
from spd.runtime.health import check
from spd.text import encode_prompt
from spd_client import SPDClient
from spd_client.client import SPDError

PROMPTS = ["hello there", "tell me a story"]
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def tiny_chat_model(tmp_path_factory):
    """A tiny random Llama with the default model's tokenizer (so prompts and text work)."""
    return make_tiny_model(tmp_path_factory.mktemp("chat") / "tiny", "llama", vocab_size=49152, num_layers=6,
                           hidden_size=64, tokenizer_from=resolve_model(None), init_std=0.5)


def ar_reference(model_dir, prompt: str, max_tokens: int = MAX_TOKENS) -> list[int]:
    local = build_local(PipelineConfig(model=str(model_dir), n=1), with_drafter=False)
    ids = encode_prompt(local.tokenizer, prompt)
    rule = StopRule(max_tokens, eos_ids_of(local.tokenizer, local.config))
    return ar_generate(local.stages, ids, SamplingParams(), rule).token_ids


@pytest.mark.parametrize("n", [2, 3])
def test_cluster_greedy_output_is_identical_to_ar_and_stream_equals_unary(tiny_chat_model, tmp_path, n):
    with running_cluster(tmp_path, n=n, model=str(tiny_chat_model), draft="random") as cluster:
        with SPDClient(address(cluster), timeout=120) as client:
            for prompt in PROMPTS:
                unary = client.generate(prompt, max_tokens=MAX_TOKENS)
                assert unary.token_ids == ar_reference(tiny_chat_model, prompt)
                chunks = list(client.stream(prompt, max_tokens=MAX_TOKENS))
                assert [t for c in chunks for t in c.token_ids] == unary.token_ids
                assert "".join(c.text for c in chunks) == unary.text
                assert chunks[-1].finish_reason == unary.finish_reason
                assert unary.stats["n"] == n and unary.stats["generated_tokens"] == len(unary.token_ids)


def test_a_sometimes_wrong_drafter_causes_flushes_and_output_stays_identical(tiny_chat_model, tmp_path):
    expected = ar_reference(tiny_chat_model, PROMPTS[0], 40)
    script = ["--script", ",".join(map(str, expected)), "--script-wrong-every", "4"]
    with running_cluster(tmp_path, n=3, model=str(tiny_chat_model), extra_drafter_args=script) as cluster:
        with SPDClient(address(cluster), timeout=120) as client:
            got = client.generate(PROMPTS[0], max_tokens=40)
    assert got.token_ids == expected
    assert got.stats["flushes"] > 0 and got.stats["rejects"] > 0 and got.stats["accepts"] > 0
    # The processes judge exactly as the lockstep engine does with the same drafter: same K, N, α.
    local = build_local(PipelineConfig(model=str(tiny_chat_model), n=3), with_drafter=False)
    ids = encode_prompt(local.tokenizer, PROMPTS[0])
    drafter = ScriptedDrafter(ids + expected, local.config.vocab_size, wrong_every=4)
    ref = SPDEngine(local.stages, drafter).generate(ids, SamplingParams(), StopRule(40, eos_ids_of(local.tokenizer, local.config)))
    assert (got.stats["accepts"], got.stats["rejects"], got.stats["cycles"]) == (ref.stats.accepts, ref.stats.rejects, ref.stats.cycles)


def test_bad_requests_get_invalid_argument_and_the_next_request_succeeds(tiny_chat_model, tmp_path):
    bad = [dict(prompt=""), dict(prompt="x", max_tokens=0), dict(prompt="x", max_tokens=10**7),
           dict(prompt="x", temperature=-1.0), dict(prompt="x", top_p=0.0), dict(prompt="x", top_p=1.5),
           dict(prompt="x", top_k=-3), dict(prompt="x" * 300_000)]
    with running_cluster(tmp_path, n=2, model=str(tiny_chat_model), draft="random") as cluster:
        with SPDClient(address(cluster), timeout=60, retries=0) as client:
            for kwargs in bad:
                with pytest.raises(SPDError) as err:
                    client.generate(**kwargs)
                assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT, kwargs
            ok = client.generate(PROMPTS[1], max_tokens=8)
    assert ok.token_ids == ar_reference(tiny_chat_model, PROMPTS[1], 8)


def test_garbage_frames_sent_to_every_worker_do_not_stop_it(tiny_chat_model, tmp_path):
    with running_cluster(tmp_path, n=2, model=str(tiny_chat_model), draft="random") as cluster:
        ctx = zmq.Context()
        try:
            endpoints = [*cluster.topology.stages, cluster.topology.drafter, cluster.topology.orchestrator]
            for endpoint in endpoints:
                sock = ctx.socket(zmq.PUSH)
                sock.setsockopt(zmq.LINGER, 0)
                sock.connect(endpoint)
                for frames in ([b"\x00garbage"], [b"HIDDEN", b"\xc1not msgpack"], [b"EXIT", b"\x80", b"x" * 100],
                               [b"PREFILL", b"\x83\xa3rid\xa1x\xa5epoch\x01\xa3pos\xff"]):
                    sock.send_multipart(frames)
                sock.close()
            time.sleep(1.0)
            assert all(p.popen.poll() is None for p in cluster.procs), "a process died"
            assert all(check(p.health) for p in cluster.procs)
            with SPDClient(address(cluster), timeout=60) as client:
                assert client.generate(PROMPTS[0], max_tokens=8).token_ids == ar_reference(tiny_chat_model, PROMPTS[0], 8)
        finally:
            ctx.destroy(linger=0)

"""Bad input and load against a live pipeline: fuzzed requests, 32 concurrent clients, a stage that
never comes back."""

from __future__ import annotations

import os
import signal
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cluster_util import address, pid_of, running_cluster
from conftest import ar_reference
from spd.models.loading import resolve_model
from spd.models.tiny import make_tiny_model
from spd.runtime.health import check
from spd_client.v1 import spd_pb2, spd_pb2_grpc

pytestmark = pytest.mark.processes  # starts worker processes: runs serially (scripts/test.sh)

FUZZ_EXAMPLES = 1000  # derandomized: the same 1000 requests every run
OK_CODES = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("load") / "tiny", "llama", vocab_size=49152, num_layers=4,
                           hidden_size=64, tokenizer_from=resolve_model(None), init_std=0.5)


requests = st.builds(
    spd_pb2.GenerateRequest,
    prompt=st.one_of(st.just(""), st.text(max_size=40), st.text(max_size=2000)),
    messages=st.lists(st.builds(spd_pb2.Message, role=st.sampled_from(["user", "system", "assistant", "bot", ""]),
                                content=st.text(max_size=30)), max_size=3),
    raw=st.booleans(),
    max_tokens=st.one_of(st.none(), st.integers(-5, 6), st.integers(-2**31, 2**31 - 1)),
    temperature=st.one_of(st.floats(allow_nan=True, allow_infinity=True, width=32), st.floats(0, 2, width=32)),
    top_k=st.integers(-2**31, 2**31 - 1),
    top_p=st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True, width=32)),
    seed=st.integers(0, 2**64 - 1),
    stop=st.lists(st.text(max_size=300), max_size=20),
    request_id=st.text(max_size=200),
)



def test_a_thousand_fuzzed_requests_get_proper_status_codes_and_nothing_dies(model_dir, tmp_path):
    # an unset max_tokens means 4 here (not 256): valid generations stay short
    with running_cluster(tmp_path, n=2, model=str(model_dir), draft="random",
                         extra_orchestrator_args=["--default-max-tokens", "4"]) as cluster:
        channel = grpc.insecure_channel(address(cluster))
        stub = spd_pb2_grpc.SPDStub(channel)
        seen = {}

        @settings(max_examples=FUZZ_EXAMPLES, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(requests)
        def fuzz(req):
            if req.HasField("max_tokens") and 0 < req.max_tokens:
                req.max_tokens = min(req.max_tokens, 4)  # keep valid generations short
            try:
                stub.Generate(req, timeout=60)
                code = grpc.StatusCode.OK
            except grpc.RpcError as e:
                code = e.code()
            seen[code] = seen.get(code, 0) + 1
            assert code in OK_CODES, (code, req)

        try:
            fuzz()
        finally:
            channel.close()
        assert sum(seen.values()) >= FUZZ_EXAMPLES and seen.get(grpc.StatusCode.INVALID_ARGUMENT, 0) > 0
        assert all(p.popen.poll() is None for p in cluster.procs) and all(check(p.health) for p in cluster.procs)
        with grpc.insecure_channel(address(cluster)) as ch:
            ok = spd_pb2_grpc.SPDStub(ch).Generate(spd_pb2.GenerateRequest(prompt="hello", max_tokens=6), timeout=60)
        assert list(ok.token_ids) == ar_reference(model_dir, "hello", 6)


def test_32_concurrent_clients_each_get_their_correct_answer(model_dir, tmp_path):
    prompts = [f"question number {i}" for i in range(32)]
    expected = {p: ar_reference(model_dir, p, 12) for p in prompts}
    with running_cluster(tmp_path, n=2, model=str(model_dir), draft="random", queue_size=32) as cluster:
        def call(prompt):
            with grpc.insecure_channel(address(cluster)) as ch:
                r = spd_pb2_grpc.SPDStub(ch).Generate(spd_pb2.GenerateRequest(prompt=prompt, max_tokens=12), timeout=300)
                return prompt, list(r.token_ids)

        with ThreadPoolExecutor(32) as pool:
            results = dict(pool.map(call, prompts))
    assert results == expected


def test_a_stage_that_never_comes_back_fails_the_request_unavailable(model_dir, tmp_path):
    with running_cluster(tmp_path, n=2, model=str(model_dir), draft="random", worker_wait_s=3.0) as cluster:
        os.kill(pid_of(cluster, "stage-2"), signal.SIGKILL)  # no supervisor running: it stays dead
        with grpc.insecure_channel(address(cluster)) as ch:
            with pytest.raises(grpc.RpcError) as err:
                spd_pb2_grpc.SPDStub(ch).Generate(spd_pb2.GenerateRequest(prompt="hello", max_tokens=6), timeout=60)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE and "stage 2" in err.value.details()

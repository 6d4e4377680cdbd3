"""The distributed runtime end to end: real processes, ZeroMQ between them, gRPC in front."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
import types
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
import zmq

from conftest import ar_reference
from cluster_util import address, data_plane_push, metric, running_cluster, wait_for
from spd import settings, wire
from spd.core.engine import SPDEngine
from spd.core.sampling import SamplingParams
from spd.core.scripted import ScriptedDrafter
from spd.core.stopping import StopRule, eos_ids_of
from spd.config import ClusterConfig
from spd.pipeline import PipelineConfig, build_local
from spd.runtime.launcher import Cluster, CrashLoop
from spd.models.loading import resolve_model
from spd.models.tiny import make_tiny_model
from spd.runtime.health import check
from spd.runtime.topology import free_ports
from spd.text import encode_prompt
from spd_client import SPDClient
from spd_client.client import SPDError

pytestmark = pytest.mark.processes  # starts worker processes: runs serially (scripts/test.sh)

PROMPTS = ["hello there", "tell me a story"]
MAX_TOKENS = 24


@pytest.mark.parametrize("n", [2, 3])
def test_cluster_greedy_output_is_identical_to_ar_and_stream_equals_unary(tiny_chat_model, tmp_path, n):
    with running_cluster(tmp_path, n=n, model=str(tiny_chat_model), draft="random") as cluster:
        with SPDClient(address(cluster), timeout=120) as client:
            for prompt in PROMPTS:
                unary = client.generate(prompt, max_tokens=MAX_TOKENS)
                assert unary.token_ids == ar_reference(tiny_chat_model, prompt, MAX_TOKENS)
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


@pytest.fixture(scope="module")
def shared_cluster(tiny_chat_model, tmp_path_factory):
    """One n = 2 cluster for the API-behaviour tests: a short queue, metrics on."""
    port = free_ports(1)[0]
    with running_cluster(tmp_path_factory.mktemp("shared"), n=2, model=str(tiny_chat_model), draft="random",
                         queue_size=1, metrics_port=port) as cluster:
        yield cluster


def test_bad_requests_get_invalid_argument_and_the_next_request_succeeds(tiny_chat_model, shared_cluster):
    bad = [dict(prompt=""), dict(prompt="x", max_tokens=0), dict(prompt="x", max_tokens=10**7),
           dict(prompt="x", temperature=-1.0), dict(prompt="x", top_p=0.0), dict(prompt="x", top_p=1.5),
           dict(prompt="x", top_k=-3), dict(prompt="x" * 300_000)]
    with SPDClient(address(shared_cluster), timeout=60, retries=0) as client:
        for kwargs in bad:
            with pytest.raises(SPDError) as err:
                client.generate(**kwargs)
            assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT, kwargs
        ok = client.generate(PROMPTS[1], max_tokens=8)
    assert ok.token_ids == ar_reference(tiny_chat_model, PROMPTS[1], 8)


def test_garbage_frames_sent_to_every_worker_do_not_stop_it(tiny_chat_model, shared_cluster):
    cluster = shared_cluster
    ctx = zmq.Context()
    try:
        endpoints = [*cluster.topology.stages, cluster.topology.drafter, cluster.topology.orchestrator]
        for endpoint in endpoints:  # from an insider holding the key: outsiders cannot even connect
            sock = data_plane_push(ctx, cluster, endpoint)
            for frames in ([b"\x00garbage"], [b"HIDDEN", b"\xc1not msgpack"], [b"EXIT", b"\x80", b"x" * 100],
                           [b"PREFILL", b"\x83\xa3rid\xa1x\xa5epoch\x01\xa3pos\xff"]):
                sock.send_multipart(frames)
            sock.close()  # lingers until the frames are out
        assert all(p.popen.poll() is None for p in cluster.procs), "a process died"
        assert all(check(p.health) for p in cluster.procs)
        with SPDClient(address(cluster), timeout=60) as client:
            assert client.generate(PROMPTS[0], max_tokens=8).token_ids == ar_reference(tiny_chat_model, PROMPTS[0], 8)
    finally:
        ctx.destroy(linger=0)


def test_a_forged_far_future_epoch_does_not_wedge_the_workers(tiny_chat_model, shared_cluster):
    # One CANCEL with epoch 2**53 used to make a stage drop every later real message for good.
    ctx = zmq.Context()
    try:
        for endpoint in (*shared_cluster.topology.stages, shared_cluster.topology.drafter):
            sock = data_plane_push(ctx, shared_cluster, endpoint)
            wire.send(sock, wire.Cancel(rid="x", epoch=2 ** 53), timeout_ms=1000)
            sock.close()
        with SPDClient(address(shared_cluster), timeout=30, retries=0) as client:
            for prompt in PROMPTS:
                assert client.generate(prompt, max_tokens=12).token_ids == ar_reference(tiny_chat_model, prompt, 12)
    finally:
        ctx.destroy(linger=0)


def test_rapidly_cancelled_streams_stop_at_once_and_the_next_request_does_not_queue(tiny_chat_model, shared_cluster):
    trials, read = 8, 3
    before = metric(shared_cluster, "spd_commits_total")
    with SPDClient(address(shared_cluster), timeout=60, retries=0) as client:
        for _ in range(trials):
            stream = client.stream(PROMPTS[0], max_tokens=400)
            got = [next(stream) for _ in range(read)]
            stream.close()  # cancels the call while tokens are flowing
            assert len(got) == read
        ok = client.generate(PROMPTS[1], max_tokens=8)
    assert ok.token_ids == ar_reference(tiny_chat_model, PROMPTS[1], 8)
    # Each abandoned request commits the tokens read plus what one driver step lets through, not
    # its 400 (before the fix every one ran to the end and the next request queued behind them).
    commits = metric(shared_cluster, "spd_commits_total") - before
    assert commits <= trials * (read + 12) + 8, commits
    assert ok.stats["queue_ms"] < 1000, ok.stats["queue_ms"]


def test_a_full_queue_answers_resource_exhausted_and_accepted_requests_are_correct(tiny_chat_model, shared_cluster):
    expected = ar_reference(tiny_chat_model, PROMPTS[0], 48)

    def call(_):
        with SPDClient(address(shared_cluster), timeout=120, retries=0) as client:
            try:
                return client.generate(PROMPTS[0], max_tokens=48).token_ids
            except SPDError as e:
                return e.code

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(call, range(8)))
    assert grpc.StatusCode.RESOURCE_EXHAUSTED in results
    done = [r for r in results if isinstance(r, list)]
    assert done and all(r == expected for r in done)


def test_metrics_endpoint_counts_commits_and_flushes(shared_cluster):
    with SPDClient(address(shared_cluster), timeout=60, retries=0) as client:
        done = client.generate(PROMPTS[0], max_tokens=8)
        with pytest.raises(SPDError):
            client.generate("", max_tokens=8)  # counted as invalid
    text = urllib.request.urlopen(f"http://127.0.0.1:{shared_cluster.cfg.metrics_port}/metrics", timeout=10).read().decode()
    values = {line.split()[0]: float(line.split()[1]) for line in text.splitlines() if line.startswith("spd_")}
    assert values["spd_commits_total"] > 0 and values["spd_flushes_total"] > 0
    assert 'spd_requests_total{outcome="invalid"}' in values
    assert values['spd_phase_seconds_count{phase="stage1"}'] > 0 and values['spd_phase_seconds_count{phase="verify"}'] > 0
    assert values["spd_running_requests"] == 0  # every request of this module has finished
    assert values["spd_prompt_tokens_total"] >= done.stats["prompt_tokens"]
    for name in ("time_to_first_token", "e2e_request_latency", "request_queue_time", "inter_token_latency"):
        assert values[f"spd_{name}_seconds_count"] > 0, name
    with pytest.raises(urllib.error.HTTPError) as e:  # only /metrics: /v1/models is not answered with metrics
        urllib.request.urlopen(f"http://127.0.0.1:{shared_cluster.cfg.metrics_port}/v1/models", timeout=10)
    assert e.value.code == 404


def test_launcher_gives_up_on_a_worker_that_keeps_failing_at_start(tmp_path):
    # two stages of a one-layer model: both stages (and the drafter) exit with an error as they start
    model = make_tiny_model(tmp_path / "tiny1", "llama", vocab_size=49152, num_layers=1, hidden_size=64,
                            tokenizer_from=resolve_model(None))
    t0 = time.monotonic()
    with pytest.raises(CrashLoop, match="times in a row"):
        with running_cluster(tmp_path / "logs", ready_s=600, n=2, model=str(model), draft="random",
                             max_start_failures=2):
            pass
    assert time.monotonic() - t0 < 300  # gave up on the crash loop, not at the ready timeout


def test_a_start_failure_is_an_error_exit_before_the_first_answer_however_slow(tmp_path):
    cluster = Cluster(ClusterConfig(n=1, port=0, max_start_failures=2))
    p = cluster.procs[0]
    long_ago = time.monotonic() - 3600  # a start that took an hour on a loaded machine still counts

    def exit_once(healthy_at, code=1):
        p.popen, p.spawned_at, p.healthy_at = types.SimpleNamespace(returncode=code), long_ago, healthy_at
        cluster._count_start_failure(p, time.monotonic())

    try:
        exit_once(healthy_at=None)
        assert p.start_failures == 1
        exit_once(healthy_at=long_ago + 1)  # it had answered once: a crash after start, not a crash loop
        assert p.start_failures == 0
        exit_once(healthy_at=None)
        exit_once(healthy_at=None, code=-9)  # killed by a signal: a fault to recover from
        assert p.start_failures == 0
        exit_once(healthy_at=None)
        with pytest.raises(CrashLoop, match="2 times in a row"):
            exit_once(healthy_at=None)
    finally:
        p.popen = None  # nothing was spawned
        cluster.shutdown()


def test_a_ten_stage_pipeline_becomes_ready_and_matches_ar(tmp_path):
    # 11 workers beating every 0.5 s: the idle orchestrator must drain heartbeats faster than they come
    model = make_tiny_model(tmp_path / "tiny10", "llama", vocab_size=49152, num_layers=10, hidden_size=64,
                            tokenizer_from=resolve_model(None), init_std=0.5)
    beats = 11 * math.ceil(3 * settings.HEARTBEAT_TIMEOUT_S / settings.HEARTBEAT_S)  # 3 timeouts' worth from each
    with running_cluster(tmp_path / "logs", n=10, model=str(model), draft="random",
                         metrics_port=free_ports(1)[0]) as cluster:
        start = metric(cluster, "spd_worker_heartbeats_total")
        wait_for(lambda: metric(cluster, "spd_worker_heartbeats_total") >= start + beats, 120,
                 f"the orchestrator drains {beats} heartbeats while idle")
        with SPDClient(address(cluster), timeout=120) as client:
            got = client.generate(PROMPTS[0], max_tokens=12)
        assert metric(cluster, "spd_recoveries_total") == 0  # nobody looked dead
    assert got.token_ids == ar_reference(model, PROMPTS[0], 12)
    assert got.stats["n"] == 10


def _gone(pid: int) -> bool:
    """Exited (a zombie counts: nobody may reap it in a container)."""
    try:
        return "\nState:\tZ" in open(f"/proc/{pid}/status").read()
    except FileNotFoundError:
        return True


def test_spd_up_refuses_a_taken_port_and_its_processes_die_with_it(tiny_chat_model, tmp_path):
    port = free_ports(1)[0]

    def up(tag: str) -> list[str]:
        return [sys.executable, "-m", "spd.cli", "up", "--n", "2", "--model", str(tiny_chat_model), "--draft", "random",
                "--port", str(port), "--state-file", str(tmp_path / f"{tag}.json"), "--log-dir", str(tmp_path / tag)]

    first = subprocess.Popen(up("first"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: check(f"127.0.0.1:{port}"), 240, "the first cluster ready")
        second = subprocess.run(up("second"), capture_output=True, text=True, timeout=120)
        assert second.returncode != 0 and f"port {port} is already in use" in second.stderr
        state = json.loads((tmp_path / "first.json").read_text())
        assert state["launcher"]["pid"] == first.pid
        children = [v["pid"] for role, v in state.items() if role != "launcher"]
        first.kill()  # kill -9: no chance to clean up
        first.wait(10)
        wait_for(lambda: all(_gone(pid) for pid in children), 20, "every child of the killed launcher exits")
    finally:
        if first.poll() is None:
            first.kill()


def test_discovery_reflection_health_by_service_name_and_get_info(shared_cluster):
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

    with grpc.insecure_channel(address(shared_cluster)) as channel:
        services = ProtoReflectionDescriptorDatabase(channel).get_services()
    assert "spd.v1.SPD" in services and "grpc.health.v1.Health" in services  # what `grpcurl list` shows
    assert check(address(shared_cluster), service="spd.v1.SPD") and check(address(shared_cluster))
    with SPDClient(address(shared_cluster)) as client:
        info = client.info()
    assert info["n"] == shared_cluster.cfg.n and info["context_length"] > 0 and info["max_concurrency"] == 1
    assert info["schedule"] == "pre" and info["max_tokens"] >= info["default_max_tokens"] > 0 and info["model"]


def test_a_protocol_error_in_a_stage_is_reported_and_recovered_at_once(tiny_chat_model, shared_cluster):
    # An (authenticated) RESEED beyond the stage's KV length breaks the protocol. The stage used to
    # log it and go on, dropping the request's real messages as older than the bad epoch, with the
    # request stalled until the orchestrator's 20 s progress timeout (and its recovery lost too).
    want = ar_reference(tiny_chat_model, PROMPTS[0], 40)
    ctx = zmq.Context()
    tokens, stats, t0 = [], {}, time.monotonic()
    try:
        sock = data_plane_push(ctx, shared_cluster, shared_cluster.topology.stages[1])
        with SPDClient(address(shared_cluster), timeout=60, retries=0) as client:
            for i, chunk in enumerate(client.stream(PROMPTS[0], max_tokens=40)):
                tokens += chunk.token_ids
                stats = chunk.stats or stats
                if i == 5:
                    t0 = time.monotonic()
                    # an epoch 20 s ahead: the orchestrator's own would lose to it until it adopts it
                    wire.send(sock, wire.Reseed(rid="x", epoch=wire.next_epoch(0) + 20_000_000, pos=999, slot=0,
                                                base=999, token=1), timeout_ms=1000)
        sock.close()
    finally:
        ctx.destroy(linger=0)
    assert tokens == want
    assert stats["recoveries"] >= 1
    assert time.monotonic() - t0 < 10, "the fault waited for the progress timeout"

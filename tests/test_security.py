"""Optional gRPC protection: a bearer token, and TLS."""

from __future__ import annotations

import shutil
import subprocess
import sys

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cluster_util import address, running_cluster, wait_for
from spd.models.loading import resolve_model
from spd.models.tiny import make_tiny_model
from spd.runtime.topology import free_ports, local_topology
from spd_client import SPDClient
from spd_client.client import SPDError

pytestmark = pytest.mark.processes  # starts worker processes: runs serially (scripts/test.sh)


def test_with_a_token_calls_without_it_are_unauthenticated_and_health_stays_open(tmp_path):
    model = make_tiny_model(tmp_path / "tiny", "llama", vocab_size=49152, num_layers=2, hidden_size=64,
                            tokenizer_from=resolve_model(None))
    with running_cluster(tmp_path / "logs", n=2, model=str(model), draft="random",
                         extra_orchestrator_args=["--token", "s3cret"]) as cluster:
        with SPDClient(address(cluster), timeout=30, retries=0) as anonymous:
            with pytest.raises(SPDError) as err:
                anonymous.generate("hi", max_tokens=2)
        assert err.value.code == grpc.StatusCode.UNAUTHENTICATED
        with SPDClient(address(cluster), timeout=60, token="s3cret") as client:
            assert len(client.generate("hi", max_tokens=2).token_ids) == 2


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl to make a test certificate")
def test_with_tls_the_api_port_speaks_tls_only(tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    port = free_ports(1)[0]
    proc = subprocess.Popen([sys.executable, "-m", "spd.cli", "orchestrator", "--topology", local_topology(1).to_json(),
                             "--port", str(port), "--tls-cert", str(cert), "--tls-key", str(key)])
    try:
        creds = grpc.ssl_channel_credentials(cert.read_bytes())
        request = health_pb2.HealthCheckRequest(service="")

        def answer_over_tls():
            assert proc.poll() is None, "the orchestrator exited"
            with grpc.secure_channel(f"localhost:{port}", creds) as ch:
                try:
                    return health_pb2_grpc.HealthStub(ch).Check(request, timeout=2)
                except grpc.RpcError:
                    return None  # not listening yet

        # it answers NOT_SERVING (no workers) once it is up
        reply = wait_for(answer_over_tls, 120, "the orchestrator answers a health check over TLS", period_s=0.5)
        assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING
        with grpc.insecure_channel(f"localhost:{port}") as ch:
            with pytest.raises(grpc.RpcError):
                health_pb2_grpc.HealthStub(ch).Check(request, timeout=3)
    finally:
        proc.terminate()
        proc.wait(10)


def test_with_a_curve_key_the_pipeline_works_and_plaintext_frames_never_reach_a_worker(tmp_path, monkeypatch):
    import zmq

    monkeypatch.setenv("SPD_CURVE_SECRET", zmq.curve_keypair()[1].decode())  # inherited by every process
    model = make_tiny_model(tmp_path / "tiny", "llama", vocab_size=49152, num_layers=2, hidden_size=64,
                            tokenizer_from=resolve_model(None))
    with running_cluster(tmp_path / "logs", n=2, model=str(model), draft="random") as cluster:
        ctx = zmq.Context()
        try:
            plain = ctx.socket(zmq.PUSH)
            plain.setsockopt(zmq.LINGER, 0)
            events = plain.get_monitor_socket()
            plain.connect(cluster.topology.stages[0])
            plain.send_multipart([b"HIDDEN", b"\xc1garbage"])  # no CURVE handshake: never delivered
            wait_for(lambda: _handshake_refused(events), 60, "stage 1's inbox refuses the plaintext peer's handshake",
                     period_s=0)
        finally:
            ctx.destroy(linger=0)
        with SPDClient(address(cluster), timeout=60) as client:
            assert len(client.generate("hi", max_tokens=4).token_ids) == 4
    log = (tmp_path / "logs" / "stage-1.log").read_text()
    assert "[drop] malformed" not in log


def _handshake_refused(events) -> bool:
    """The next event of a socket monitor (within 0.1 s): is it the peer refusing the handshake?"""
    import zmq
    from zmq.utils.monitor import recv_monitor_message

    if not events.poll(100):
        return False
    event = recv_monitor_message(events)["event"]
    assert event != zmq.EVENT_HANDSHAKE_SUCCEEDED, "a peer without the key completed a handshake with a CURVE inbox"
    return event in (zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL,
                     zmq.EVENT_HANDSHAKE_FAILED_AUTH)

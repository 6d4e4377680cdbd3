"""The committed gRPC stubs are what `python -m spd_client.gen_protos` makes from protos/spd/v1/spd.proto."""

from __future__ import annotations

import subprocess
import sys

import pytest


def test_committed_stubs_match_a_fresh_generation():
    pytest.importorskip("grpc_tools", reason="grpcio-tools is a dev dependency")
    done = subprocess.run([sys.executable, "-m", "spd_client.gen_protos", "--check"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "current" in done.stdout


def test_stubs_import_from_the_package_with_the_versioned_service_name():
    from spd_client.v1 import spd_pb2, spd_pb2_grpc

    service = spd_pb2.DESCRIPTOR.services_by_name["SPD"]
    assert service.full_name == "spd.v1.SPD"
    assert [m.name for m in service.methods] == ["Generate", "GenerateStream", "GetInfo"]
    assert hasattr(spd_pb2_grpc, "SPDStub") and hasattr(spd_pb2_grpc, "add_SPDServicer_to_server")


def test_unset_optional_fields_differ_from_zero():
    from spd_client.v1 import spd_pb2

    req = spd_pb2.GenerateRequest(prompt="hi")
    assert not req.HasField("max_tokens") and not req.HasField("top_p")
    req.max_tokens, req.top_p = 0, 0.0
    assert req.HasField("max_tokens") and req.HasField("top_p")

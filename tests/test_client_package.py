"""`pip install ./client` is the SDK alone: grpcio and protobuf, typed, no server code."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

CLIENT = Path(__file__).resolve().parents[1] / "client"


def test_the_client_wheel_holds_the_typed_sdk_and_nothing_of_the_server(tmp_path):
    src = shutil.copytree(CLIENT, tmp_path / "client", ignore=shutil.ignore_patterns("build", "*.egg-info"))
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation",
                           "-w", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    (wheel,) = tmp_path.glob("spd_client-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for needed in ("spd_client/py.typed", "spd_client/client.py", "spd_client/aio.py", "spd_client/v1/spd_pb2.py",
                   "spd_client/v1/spd_pb2.pyi"):
        assert needed in names, needed
    assert not any(n.startswith("spd/") for n in names)
    deps = tomllib.loads((CLIENT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert sorted(d.split(">")[0] for d in deps) == ["grpcio", "protobuf"]


def test_the_stubs_pin_no_protobuf_or_grpcio_runtime_so_the_low_floors_hold():
    stubs = CLIENT / "spd_client" / "v1"
    assert "runtime_version" not in (stubs / "spd_pb2.py").read_text()  # gencode >= 5.26 would pin its own version
    assert "GRPC_GENERATED_VERSION" not in (stubs / "spd_pb2_grpc.py").read_text()  # grpcio-tools >= 1.63 would
    deps = tomllib.loads((CLIENT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert deps == ["grpcio>=1.59", "protobuf>=4.21.6,<8"]


def test_the_server_package_depends_on_the_sdk_instead_of_shipping_it():
    server = tomllib.loads((CLIENT.parent / "pyproject.toml").read_text())
    client = tomllib.loads((CLIENT / "pyproject.toml").read_text())["project"]
    assert f"spd-client=={client['version']}" in server["project"]["dependencies"]
    assert server["tool"]["setuptools"]["packages"]["find"]["where"] == ["services"]

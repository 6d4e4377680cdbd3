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

"""mypy sees the SDK's types: results are typed, parameters are checked by name and type."""

from __future__ import annotations

from pathlib import Path

import pytest

api = pytest.importorskip("mypy.api", reason="mypy is a dev dependency")

CLIENT = Path(__file__).resolve().parents[1] / "client"

USE = '''
from spd_client import SPDClient
from spd_client.aio import AsyncSPDClient

def use(client: SPDClient) -> None:
    reveal_type(client.generate("hi", max_tokens=3))
    reveal_type(client.stream("hi", temperature=0.7))
    client.generate("hi", max_tokenz=3)
    client.generate("hi", max_tokens="3")

async def use_async(client: AsyncSPDClient) -> None:
    reveal_type(await client.generate("hi", seed=1))
'''


def test_mypy_reveals_the_response_types_and_rejects_bad_parameters(tmp_path, monkeypatch):
    (tmp_path / "use.py").write_text(USE)
    monkeypatch.setenv("MYPYPATH", str(CLIENT))  # the package as `pip install ./client` lays it out
    out, _, status = api.run([str(tmp_path / "use.py"), "--cache-dir", str(tmp_path / ".mypy"), "--no-error-summary"])
    notes = [line.split(": ", 2)[-1] for line in out.splitlines()]
    assert 'Revealed type is "spd_client.client.Result"' in notes[0]
    assert 'Revealed type is "typing.Iterator[spd_client.client.Chunk]"' in notes[1]
    assert "Unexpected keyword argument \"max_tokenz\"" in out
    assert 'has incompatible type "str"; expected "int"' in out
    assert 'Revealed type is "spd_client.client.Result"' in out.splitlines()[-1]
    assert status == 1  # the two bad calls, and nothing else
    assert len([line for line in out.splitlines() if ": error:" in line]) == 2, out

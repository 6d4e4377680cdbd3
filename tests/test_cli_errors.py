"""Bad command-line input gets one clear line and exit code 2, never a traceback or a spawned cluster."""

from __future__ import annotations

import subprocess
import sys

import pytest


def spd(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "spd.cli", *argv], capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("argv, says", [
    (["generate", "--prompt", "hi", "--max-tokens", "-1"], "max_tokens is -1"),
    (["generate", "--prompt", "hi", "--temperature", "-1"], "temperature is -1"),
    (["generate", "--prompt", "hi", "--engine", "local", "--n", "100"], "n must be in 1..30"),
    (["up", "--n", "0"], "n must be in 1..30"),
    (["up", "--n", "100"], "n must be in 1..30"),
    (["--log-level", "bogus", "generate", "--prompt", "hi"], "invalid choice: 'BOGUS'"),
])
def test_out_of_contract_arguments_exit_2_with_one_clear_message(argv, says):
    done = spd(*argv)
    assert done.returncode == 2, done.stderr
    assert says in done.stderr
    assert "Traceback" not in done.stderr

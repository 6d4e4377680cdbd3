"""Shared by the chaos tests: a tiny random chat model, its fault-free output, the workload."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conftest import ar_reference  # noqa: E402  (tests/conftest.py)

PROMPT = "tell me a long story about a lighthouse"
N, MAX_TOKENS = 3, 160


@pytest.fixture(scope="module")
def expected(tiny_chat_model):
    return ar_reference(tiny_chat_model, PROMPT, MAX_TOKENS)

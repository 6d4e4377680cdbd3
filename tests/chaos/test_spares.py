"""Warm spares (`spd up --spares K`): the orchestrator hands a killed worker's role to a spare that
is already running, so a stage kill costs a tensor load and a re-prefill, not a process start.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
from cluster_util import address, pid_of, running_cluster, supervised, wait_for
from spd_client import SPDClient

from .conftest import MAX_TOKENS, PROMPT, N

pytestmark = pytest.mark.processes  # starts worker processes: runs serially (scripts/test.sh)


@pytest.fixture(scope="module")
def cluster(tiny_chat_model, tmp_path_factory):
    with running_cluster(tmp_path_factory.mktemp("spare-logs"), n=N, model=str(tiny_chat_model), draft="random",
                         spares=1) as c:
        with supervised(c):
            yield c


def _spare(cluster):
    return next((p for p in cluster.procs if p.role.startswith("spare") and cluster.healthy()), None)


def _stream_killing(cluster, kills: dict[int, list[str]]) -> tuple[list[int], dict, float]:
    """Stream once, SIGKILL the named roles after the given token indices; (tokens, stats, longest gap)."""
    tokens, stats, stamps = [], {}, []
    with SPDClient(address(cluster), timeout=120, retries=0) as client:
        for i, chunk in enumerate(client.stream(PROMPT, max_tokens=MAX_TOKENS)):
            tokens += chunk.token_ids
            stats = chunk.stats or stats
            stamps.append(time.monotonic())
            for role in kills.get(i, []):
                os.kill(pid_of(cluster, role), signal.SIGKILL)
    return tokens, stats, max(b - a for a, b in zip(stamps, stamps[1:]))


def test_a_killed_stage_is_replaced_by_the_warm_spare_and_a_new_spare_is_started(cluster, expected):
    spare = wait_for(lambda: _spare(cluster), 120, "a healthy cluster with a spare")
    spare_pid = spare.popen.pid
    tokens, stats, stall = _stream_killing(cluster, {10: ["stage-2"]})
    assert tokens == expected
    assert stats["recoveries"] == 1
    assert stall < 5.0, f"stall {stall:.2f} s with a warm spare (a restart without one takes longer)"
    wait_for(lambda: pid_of(cluster, "stage-2") == spare_pid, 10, "the spare's process is stage 2 now")
    wait_for(lambda: _spare(cluster), 120, "a new spare")


def test_the_drafter_and_a_stage_killed_together_complete_identically_with_one_spare(cluster, expected):
    # One spare goes to the stage (it blocks; the drafter does not), the new spare to the drafter.
    wait_for(lambda: _spare(cluster), 120, "a healthy cluster with a spare")
    tokens, _, _ = _stream_killing(cluster, {12: ["drafter", "stage-1"]})
    assert tokens == expected
    wait_for(lambda: _spare(cluster) and pid_of(cluster, "drafter"), 120, "both roles filled and a spare again")

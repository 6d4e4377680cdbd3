"""The distributed runtime on the real default model (n = 5): identical output, stages own their share.

One cluster serves the whole module (starting seven SmolLM2 processes on two cores is most of its
cost); the test that kills a stage runs last.
"""

from __future__ import annotations

import os
import signal
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import ar_reference
from cluster_util import address, metric, pid_of, rss_mb, running_cluster, supervised, wait_for
from spd.runtime.topology import free_ports
from spd_client import SPDClient

pytestmark = pytest.mark.processes  # starts worker processes: runs serially (scripts/test.sh)

PROMPTS = ["What is the capital of France?", "Give me three tips for writing clean code."]
S = 4  # the cluster's max concurrency: its stages run every single-token forward at S rows


@pytest.fixture(scope="module")
def smol_cluster(default_model_dir, tmp_path_factory):
    with running_cluster(tmp_path_factory.mktemp("smol"), n=5, max_concurrency=S,
                         metrics_port=free_ports(1)[0]) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def ar(default_model_dir):
    """AR in process at the cluster's batch shape (batch invariance): (prompt, max_tokens) -> ids."""
    return lambda prompt, max_tokens: ar_reference(default_model_dir, prompt, max_tokens, rows=S)


@pytest.mark.slow
def test_spd_up_n5_on_smollm2_matches_ar_and_each_stage_holds_only_its_layers(smol_cluster, ar):
    with SPDClient(address(smol_cluster), timeout=600) as client:
        for prompt in PROMPTS:
            unary = client.generate(prompt, max_tokens=32)
            assert unary.token_ids == ar(prompt, 32), prompt
            chunks = list(client.stream(prompt, max_tokens=32))
            assert "".join(c.text for c in chunks) == unary.text
    rss = {p.role: rss_mb(p.popen.pid) for p in smol_cluster.procs}
    # fp32 SmolLM2: embedding (= tied LM head) 113 MB, each layer ~14 MB, the whole model ~540 MB.
    middle = [rss[f"stage-{j}"] for j in (2, 3, 4)]
    assert max(middle) - min(middle) < 40, rss  # equal shares of 6 layers
    assert rss["stage-1"] - max(middle) > 60, rss  # stage 1 also holds the embedding
    assert rss["stage-5"] - max(middle) > 60, rss  # stage 5 the (tied) LM head
    assert max(middle) < min(rss["stage-1"], rss["stage-5"]) and max(rss.values()) < 1500, rss


@pytest.mark.slow
def test_four_concurrent_requests_on_smollm2_each_equal_their_ar_output(smol_cluster, ar):
    work = [(PROMPTS[0], 24), (PROMPTS[1], 40), ("Name three colours.", 16), ("Write one sentence about rain.", 32)]
    expected = [ar(p, m) for p, m in work]
    with SPDClient(address(smol_cluster), timeout=600) as client:
        with ThreadPoolExecutor(S) as pool:
            results = list(pool.map(lambda w: client.generate(w[0], max_tokens=w[1]), work))
    assert [r.token_ids for r in results] == expected
    assert max(max(r.stats["batch"]) for r in results) > 1  # they shared forwards


@pytest.mark.slow
def test_kill_a_stage_during_prefill_on_smollm2_recovers_with_identical_output(smol_cluster, ar):
    cluster = smol_cluster
    prompt = "Summarise this: " + " ".join(f"Item {i} is a fact about lighthouses and the sea." for i in range(60))
    expected = ar(prompt, 12)
    with supervised(cluster):
        with SPDClient(address(cluster), timeout=600) as client:
            stream = client.stream(prompt, max_tokens=12)
            first = next(stream)  # sent the request; blocks until the first token...
            tokens, stats = list(first.token_ids), first.stats
            for chunk in stream:
                tokens += chunk.token_ids
                stats = chunk.stats or stats
        assert tokens == expected and stats["recoveries"] == 0  # fault-free reference run over processes
        admitted = metric(cluster, "spd_prompt_tokens_total")  # the prompt tokens of the requests so far
        with SPDClient(address(cluster), timeout=600) as client, ThreadPoolExecutor(1) as pool:
            # kill stage 3 once the orchestrator has admitted the request (its PREFILL is out) ...
            killed = pool.submit(_kill_once_admitted, cluster, pid_of(cluster, "stage-3"), admitted)
            tokens, stats = [], {}
            for chunk in client.stream(prompt, max_tokens=12):
                # ... and before its first token: the ~900 prompt tokens take several prefill forwards
                assert tokens or killed.done(), "the first token came before the kill: it missed the prefill"
                tokens += chunk.token_ids
                stats = chunk.stats or stats
            killed.result()
    assert tokens == expected and stats["recoveries"] >= 1


def _kill_once_admitted(cluster, pid: int, admitted_before: float) -> None:
    wait_for(lambda: metric(cluster, "spd_prompt_tokens_total") > admitted_before, 120,
             "the orchestrator admits the request (counts its prompt tokens)", period_s=0.02)
    os.kill(pid, signal.SIGKILL)

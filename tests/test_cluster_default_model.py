"""The distributed runtime on the real default model (n = 5): identical output, stages own their share."""

from __future__ import annotations

import pytest

import os
import signal
from concurrent.futures import ThreadPoolExecutor

from cluster_util import address, metric, pid_of, rss_mb, running_cluster, supervised, wait_for
from spd.core.sampling import SamplingParams
from spd.core.stopping import StopRule, eos_ids_of
from spd.core.ar import ar_generate
from spd.pipeline import PipelineConfig, build_local
from spd.runtime.topology import free_ports
from spd.text import encode_prompt
from spd_client import SPDClient

PROMPTS = ["What is the capital of France?", "Give me three tips for writing clean code."]


@pytest.mark.slow
def test_spd_up_n5_on_smollm2_matches_ar_and_each_stage_holds_only_its_layers(default_model_dir, tmp_path):
    ar = build_local(PipelineConfig(n=1), with_drafter=False)
    eos = eos_ids_of(ar.tokenizer, ar.config)
    expected = {p: ar_generate(ar.stages, encode_prompt(ar.tokenizer, p), SamplingParams(), StopRule(32, eos)).token_ids
                for p in PROMPTS}
    with running_cluster(tmp_path, n=5) as cluster:
        with SPDClient(address(cluster), timeout=600) as client:
            for prompt in PROMPTS:
                unary = client.generate(prompt, max_tokens=32)
                assert unary.token_ids == expected[prompt], prompt
                chunks = list(client.stream(prompt, max_tokens=32))
                assert "".join(c.text for c in chunks) == unary.text
        rss = {p.role: rss_mb(p.popen.pid) for p in cluster.procs}
    # fp32 SmolLM2: embedding (= tied LM head) 113 MB, each layer ~14 MB, the whole model ~540 MB.
    middle = [rss[f"stage-{j}"] for j in (2, 3, 4)]
    assert max(middle) - min(middle) < 40, rss  # equal shares of 6 layers
    assert rss["stage-1"] - max(middle) > 60, rss  # stage 1 also holds the embedding
    assert rss["stage-5"] - max(middle) > 60, rss  # stage 5 the (tied) LM head
    assert max(middle) < min(rss["stage-1"], rss["stage-5"]) and max(rss.values()) < 1500, rss


@pytest.mark.slow
def test_kill_a_stage_during_prefill_on_smollm2_recovers_with_identical_output(default_model_dir, tmp_path):
    prompt = "Summarise this: " + " ".join(f"Item {i} is a fact about lighthouses and the sea." for i in range(60))
    ar = build_local(PipelineConfig(n=1), with_drafter=False)
    ids = encode_prompt(ar.tokenizer, prompt)
    expected = ar_generate(ar.stages, ids, SamplingParams(), StopRule(12, eos_ids_of(ar.tokenizer, ar.config))).token_ids
    with running_cluster(tmp_path, n=5, metrics_port=free_ports(1)[0]) as cluster, supervised(cluster):
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


@pytest.mark.slow
def test_four_concurrent_requests_on_smollm2_each_equal_their_ar_output(default_model_dir, tmp_path):
    S = 4
    work = [(PROMPTS[0], 24), (PROMPTS[1], 40), ("Name three colours.", 16), ("Write one sentence about rain.", 32)]
    ar = build_local(PipelineConfig(n=1), with_drafter=False)
    for stage in ar.stages:  # the same batch shape as the cluster's stages (batch invariance)
        stage.rows = S
    eos = eos_ids_of(ar.tokenizer, ar.config)
    expected = [ar_generate(ar.stages, encode_prompt(ar.tokenizer, p), SamplingParams(), StopRule(m, eos)).token_ids
                for p, m in work]
    with running_cluster(tmp_path, n=5, max_concurrency=S) as cluster:
        with SPDClient(address(cluster), timeout=600) as client:
            with ThreadPoolExecutor(S) as pool:
                results = list(pool.map(lambda w: client.generate(w[0], max_tokens=w[1]), work))
    assert [r.token_ids for r in results] == expected
    assert max(max(r.stats["batch"]) for r in results) > 1  # they shared forwards

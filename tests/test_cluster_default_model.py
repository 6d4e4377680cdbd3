"""The distributed runtime on the real default model (n = 5): identical output, stages own their share."""

from __future__ import annotations

import pytest

from cluster_util import address, rss_mb, running_cluster
from spd.core.sampling import SamplingParams
from spd.core.stopping import StopRule, eos_ids_of
from spd.core.target import ar_generate
from spd.local import PipelineConfig, build_local
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

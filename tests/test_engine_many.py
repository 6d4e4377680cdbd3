"""Many requests through one in-process pipeline: each request's output is exactly its solo output.

Requests differ in prompt, length and sampling, join at different cycles, and share every stage
forward and every draft (batched, `rows` = 8); each keeps its own speculation, flushes and drafter
state.
"""

from __future__ import annotations

import pytest
import torch

from conftest import pipeline
from spd.core.drafter import DrafterState
from spd.core.engine import Request, SPDEngine
from spd.core.pdm import random_pdm
from spd.core.sampling import SamplingParams
from spd.core.split import default_anchors
from spd.core.stopping import StopRule
import spd.core.target as target
from spd.core.ar import ar_generate

ROWS = 8


def _engine(model_dir, n: int, rows: int = ROWS):
    config, split, stages = pipeline(model_dir, n)
    for s in stages:
        s.rows = rows
    drafter = DrafterState(random_pdm(config, list(default_anchors(split)), 1, seed=1), stages[0].embed, split, rows)
    return SPDEngine(stages, drafter), stages


def _requests(count: int, params=lambda i: SamplingParams()) -> list[Request]:
    rng = torch.Generator().manual_seed(count)
    return [Request(torch.randint(0, 256, (3 + 4 * i % 11,), generator=rng).tolist(), params(i), StopRule(12 + 5 * i))
            for i in range(count)]


@pytest.mark.parametrize("count", [1, 2, 4, 8])
def test_each_of_many_concurrent_greedy_requests_equals_its_solo_ar_output(tiny_dir, count):
    model = tiny_dir("llama", vocab_size=256, num_layers=6, hidden_size=64)
    requests = _requests(count)
    _, solo_stages = _engine(model, 1)
    solo = [ar_generate(solo_stages, r.prompt_ids, r.params, r.stop).token_ids for r in requests]
    engine, _ = _engine(model, 3)
    got = engine.generate_many(requests, join_at=[3 * i for i in range(count)])
    assert [g.token_ids for g in got] == solo
    assert all(g.stats.generated_tokens == len(g.token_ids) for g in got)
    if count > 1:
        assert sum(g.stats.rejects for g in got) > 0  # the random drafter flushes: per request, in flight


def test_sampled_requests_do_not_depend_on_what_else_runs(tiny_dir):
    model = tiny_dir("qwen3", vocab_size=256, num_layers=4, hidden_size=64)
    requests = _requests(4, params=lambda i: SamplingParams(temperature=0.9, top_p=0.95, seed=10 + i))
    engine, _ = _engine(model, 2)
    alone = [engine.generate_many([r])[0].token_ids for r in requests]
    together = engine.generate_many(requests, join_at=[0, 1, 5, 9])
    assert [g.token_ids for g in together] == alone


def test_more_requests_than_rows_run_in_groups_and_still_match(tiny_dir):
    model = tiny_dir("llama", vocab_size=256, num_layers=4, hidden_size=64)
    requests = _requests(5)
    engine, _ = _engine(model, 2, rows=2)
    alone = [engine.generate_many([r])[0].token_ids for r in requests]
    assert [g.token_ids for g in engine.generate_many(requests)] == alone


def test_a_finished_request_frees_its_kv_slot(tiny_dir):
    model = tiny_dir("llama", vocab_size=256, num_layers=4, hidden_size=64)
    engine, stages = _engine(model, 2)
    engine.generate_many(_requests(3))
    assert all(not s.caches for s in stages)


def test_prompts_longer_than_a_prefill_chunk_decode_exactly_like_ar(tiny_dir, monkeypatch):
    monkeypatch.setattr(target, "PREFILL_CHUNK", 4)  # prompts of 3..13 tokens: one to four chunks
    model = tiny_dir("llama", vocab_size=256, num_layers=6, hidden_size=64)
    requests = _requests(4)
    _, solo_stages = _engine(model, 1)
    solo = [ar_generate(solo_stages, r.prompt_ids, r.params, r.stop).token_ids for r in requests]
    engine, _ = _engine(model, 3)
    assert [g.token_ids for g in engine.generate_many(requests, join_at=[0, 2, 2, 5])] == solo

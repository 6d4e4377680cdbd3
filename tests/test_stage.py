"""Stages reproduce the full model, own only their weights, and truncate their KV caches."""

import torch
from transformers import AutoModelForCausalLM

from conftest import pipeline
from spd.core.stage import load_stage
from spd.core.target import run_through
from spd.models.loading import load_config


def _full_logits(model_dir, ids):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]


def test_split_pipeline_token_by_token_matches_full_model_logits(tiny_dir):
    for arch in ("llama", "qwen3", "qwen2"):
        model_dir = tiny_dir(arch)
        ids = [3, 14, 15, 92, 65, 35, 89, 79]
        _, _, stages = pipeline(model_dir, 3)
        outs = [run_through(stages, torch.tensor(ids[:5]), 0).logits]
        for pos in range(5, len(ids)):
            outs.append(run_through(stages, torch.tensor([ids[pos]]), pos).logits)
        torch.testing.assert_close(torch.cat(outs), _full_logits(model_dir, ids), atol=1e-4, rtol=1e-4)


def test_truncate_forgets_positions_and_recompute_is_identical(tiny_dir):
    _, _, stages = pipeline(tiny_dir("llama"), 2)
    run_through(stages, torch.tensor([1, 2, 3]), 0)
    first = run_through(stages, torch.tensor([4]), 3).logits[-1]
    run_through(stages, torch.tensor([9]), 4)
    for s in stages:
        s.truncate(3)
    again = run_through(stages, torch.tensor([4]), 3).logits[-1]
    assert torch.equal(first, again)


def test_stage_refuses_a_position_that_does_not_match_its_kv_length(tiny_dir):
    _, _, stages = pipeline(tiny_dir("llama"), 2)
    run_through(stages, torch.tensor([1, 2, 3]), 0)
    try:
        stages[0](torch.tensor([5]), 7)
    except RuntimeError as e:
        assert "KV length 3 != position 7" in str(e)
    else:
        raise AssertionError("a stage accepted a position past its KV length")


def test_a_stage_built_alone_holds_only_its_share_of_the_weights(tiny_dir):
    model_dir = tiny_dir("llama", num_layers=6)
    config = load_config(model_dir)
    full = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(model_dir).parameters())
    layer = sum(p.numel() for p in load_stage(model_dir, config, range(2, 3), ()).parameters())
    middle = sum(p.numel() for p in load_stage(model_dir, config, range(2, 4), ()).parameters())
    first = load_stage(model_dir, config, range(0, 2), ())
    last = load_stage(model_dir, config, range(4, 6), ())
    assert middle == 2 * layer
    assert first.lm_head is None and last.embed is None and first.embed is not None
    total = sum(p.numel() for s in (first, last) for p in s.parameters()) + middle
    assert total == full


def test_stages_report_the_anchor_states_in_their_layer_range(tiny_dir):
    _, split, stages = pipeline(tiny_dir("llama", num_layers=6), 3, anchors=(0, 2, 3, 6))
    h = torch.tensor([5, 6, 7])
    outs = []
    for s in stages:
        out = s(h, 0)
        outs.append(out)
        h = out.hidden
    assert [sorted(o.anchors) for o in outs] == [[0, 2], [3], [6]]
    assert torch.equal(outs[0].anchors[2], outs[0].hidden) and torch.equal(outs[2].anchors[6], outs[2].hidden)

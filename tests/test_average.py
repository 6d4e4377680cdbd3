"""spd.train.average: a weighted average of two exports of one lineage, refused across lineages."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from spd.core.pdm import PDM, random_pdm
from spd.train.average import average, history_line

TARGET = SimpleNamespace(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                         rms_norm_eps=1e-6, vocab_size=40)


def _export(path, seed: int, draft_ids=None, tokens_seen: int = 100):
    pdm = random_pdm(TARGET, [0, 1, 2], num_layers=1, draft_ids=draft_ids, seed=seed)
    pdm.config.notes = {"tokens_seen": tokens_seen, "heldout_p": 0.5, "init_from": {"tokens_seen": 1000}}
    pdm.save(path)
    return PDM.load(path)


def test_average_is_the_weighted_sum_of_the_drafts_and_records_them(tmp_path):
    a, b = _export(tmp_path / "a", seed=1), _export(tmp_path / "b", seed=2, tokens_seen=300)
    out = average([tmp_path / "a", tmp_path / "b"], [0.25, 0.75], tmp_path / "avg")
    avg = PDM.load(out)
    sa, sb, s = a.state_dict(), b.state_dict(), avg.state_dict()
    for k, t in s.items():
        if t.is_floating_point():  # stored fp16: within its rounding of the fp32 sum
            torch.testing.assert_close(t, (0.25 * sa[k] + 0.75 * sb[k]).half().float(), rtol=0, atol=1e-3)
        else:
            assert torch.equal(t, sa[k])
    notes = json.loads((out / "config.json").read_text())["notes"]
    assert [x["weight"] for x in notes["averaged"]] == [0.25, 0.75]
    assert [x["tokens_in_all"] for x in notes["averaged"]] == [1100, 1300]
    assert notes["tokens_seen"] == 300 and "heldout_p" not in notes  # the last draft's lineage, no stale figures


def test_average_refuses_drafts_of_different_vocabularies_or_bad_weights(tmp_path):
    _export(tmp_path / "a", seed=1)
    _export(tmp_path / "b", seed=2, draft_ids=torch.arange(40).flip(0))
    with pytest.raises(ValueError, match="d2t"):
        average([tmp_path / "a", tmp_path / "b"], [0.5, 0.5], tmp_path / "avg")
    with pytest.raises(ValueError, match="sum to 1"):
        average([tmp_path / "a", tmp_path / "a"], [0.5, 0.6], tmp_path / "avg")


def test_history_line_of_an_average_keeps_the_run_position_and_takes_the_measured_figures(tmp_path):
    _export(tmp_path / "a", seed=1)
    _export(tmp_path / "b", seed=2, tokens_seen=300)
    notes = json.loads((average([tmp_path / "a", tmp_path / "b"], [0.5, 0.5], tmp_path / "avg") / "config.json").read_text())["notes"]
    run_last = {"step": 7, "seen": 300, "heldout_loss": 9.0, "heldout_p": 0.1, "elapsed_s": 12.5}
    fills = {"n": 3, "a1": {"p": 0.6, "kl": 0.8}, "a2": {"p": 0.5, "kl": 1.0}, "a3": {"p": 0.4, "kl": 1.2}}
    line = history_line(run_last, fills, notes)
    assert {k: line[k] for k in ("step", "seen", "elapsed_s")} == {"step": 7, "seen": 300, "elapsed_s": 12.5}
    assert (line["heldout_p"], line["heldout_loss"], line["heldout_p_a1"], line["heldout_loss_a1"]) == (0.4, 1.2, 0.6, 0.8)
    assert f"0.5 x {tmp_path / 'a'} (1,100 tokens in all)" in line["averaged"]

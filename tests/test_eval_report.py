"""Report metrics follow design §5 from the harness's counts and the measured costs."""

import json

import pytest

from spd.eval.methods import Method
from spd.eval.report import compute, markdown

COSTS = {"ar_token_ms": 40.0, "stage_ms": {"5": [6.0, 6.0, 6.0, 6.0, 14.0]}, "overhead_ms": {"5": 1.0},
         "draft_ms": {"SPD n=5": 4.0, "PPSD n=5": 4.0}, "threads": 1}
SPD = Method("SPD n=5", "spd", "x", 5, "pre")
PPSD = Method("PPSD n=5", "ppsd", "y", 5, "post")
EAGLE = Method("EAGLE-3 k=3", "eagle3", "z", k=3)


def accept(N=102, K=200.0):
    ar = {"N": N, "K": N - 2, "decode_s": (N - 2) * 0.040}  # 2 prompts: first tokens come from prefill
    eagle = {"N": N, "K": 50, "accepts": 50, "judged": 150, "decode_s": (N - 2) * 0.020, "draft_s": 50 * 3 * 0.002}
    return {"mtbench": {"prompts": 2, "max_tokens": 64, "results": {"0.0": {
        "AR": ar, "SPD n=5": {"N": N, "K": K}, "PPSD n=5": {"N": N, "K": K}, "EAGLE-3 k=3": eagle}}}}


def test_spd_metrics_follow_the_speedup_accounting():
    r = compute([SPD, PPSD, EAGLE], accept(), COSTS)["0.0"]["overall"]
    alpha, c = 102 / 200, 4.0 / 40.0
    assert r["SPD n=5"]["S0"] == pytest.approx(5 * alpha)
    assert r["SPD n=5"]["S"] == pytest.approx(alpha / max(1 / 5, c))  # the draft hides behind a stage
    assert r["PPSD n=5"]["S"] == pytest.approx(5 * alpha / (1 + 5 * c))
    # projected: pre-step cycle = max(14, 4) + 1 ms, post-step = 14 + 4 + 1 ms
    assert r["SPD n=5"]["wall"] == pytest.approx(alpha * 40.0 / 15.0)
    assert r["PPSD n=5"]["wall"] == pytest.approx(alpha * 40.0 / 19.0)
    assert r["SPD n=5"]["wall_kind"] == "projected"


def test_eagle_metrics_use_tau_and_measured_wall_clock():
    r = compute([SPD, PPSD, EAGLE], accept(), COSTS)["0.0"]["overall"]["EAGLE-3 k=3"]
    tau, c = 100 / 50, 2.0 / 40.0
    assert r["S0"] == pytest.approx(tau)
    assert r["S"] == pytest.approx(tau / (1 + 3 * c))
    assert r["wall"] == pytest.approx(2.0) and r["wall_kind"] == "measured"


def test_markdown_labels_projected_columns():
    methods = [SPD, PPSD, EAGLE]
    table = compute(methods, accept(), COSTS)
    md = markdown({"model": "m", "command": "spd eval", "prompts": 2, "max_tokens": 8, "top_k": 50, "top_p": 1.0,
                   "threads": 1, "date": "today"}, methods, [], table, COSTS, None, [])
    assert "projected" in md and "ᵖ" in md and "EAGLE-3 k=3" in md


def test_a_projection_never_exceeds_s0_even_when_ar_was_timed_during_a_load_spike():
    # Seen on a fresh clone: AR timed at 144.6 ms a token (41.3 quiet) projected SPD at 1.92x, S0 1.25.
    spike = {**COSTS, "ar_token_ms": 144.6}
    r = compute([SPD, PPSD], accept(), spike)["0.0"]["overall"]
    for label in ("SPD n=5", "PPSD n=5"):
        assert r[label]["wall"] <= r[label]["S0"] + 1e-9


def test_missing_checkpoints_are_one_line_and_a_lone_width_gets_no_sweep_plot(tmp_path):
    from spd.eval.report import plots

    methods = [SPD, PPSD, EAGLE]
    table = compute(methods, accept(), COSTS)
    absent = [Method(f"SPD n={n}", "spd", f"runs/sweep/n{n}/pdm", n, "pre", groups=("n",)) for n in (2, 3)]
    md = markdown({"model": "m", "command": "spd eval", "prompts": 2, "max_tokens": 8, "top_k": 50, "top_p": 1.0,
                   "threads": 1, "date": "today"}, methods, absent, table, COSTS, None, [])
    assert md.count("runs/sweep") == 2 and "2 variants have no checkpoint here" in md
    names = plots(methods, table, COSTS, tmp_path)
    assert "width_sweep.png" not in names and (tmp_path / "cycle_breakdown.png").exists()


def test_every_equal_budget_run_adds_its_four_methods_smallest_budget_first(tmp_path):
    from spd.eval.methods import equal_budget_methods

    for name in ("equal-2000000", "equal-400000", "equal-notes"):
        (tmp_path / name).mkdir()
    rows = equal_budget_methods(tmp_path)
    assert [m.label for m in rows] == [f"{kind} ({b}, equal)" for b in ("400k", "2.0M") for kind in
                                       ("SPD n=5 L_s=1", "SPD n=5 L_s=2", "PPSD n=5", "EAGLE-3 k=7")]
    assert rows[2].kind == "ppsd" and rows[2].schedule == "post" and rows[3].k == 7
    assert rows[0].draft == str(tmp_path / "equal-400000" / "spd-n5-ls1" / "pdm")


def test_every_twin_budget_adds_the_lineage_draft_ppsd_and_eagle3_reading_a_committed_draft_when_not_trained_here(tmp_path):
    from spd.eval.methods import available, twin_methods

    runs, results = tmp_path / "runs", tmp_path / "results"
    configs = {runs / "ppsd-2000000" / "pdm": {"notes": {"tokens_seen": 2000002}},
               results / "eagle3-2000000" / "draft": {"kind": "eagle3", "target_hidden": 8, "trained_tokens": 2000002},
               # the 12.8M EAGLE-3 twin still in training: warm from 2M, 15k tokens on
               runs / "eagle3-12802091" / "draft": {"kind": "eagle3", "target_hidden": 8, "trained_tokens": 15419,
                                                     "notes": {"init_from": {"tokens_seen": 2000002}}}}
    for d in (*configs, runs / "equal-400000", results / "eval-notes"):
        d.mkdir(parents=True, exist_ok=True)
    for d, config in configs.items():
        (d / "config.json").write_text(json.dumps(config))
    rows = twin_methods(runs, results, shipped=12802091)
    eagles = [f"EAGLE-3 k={k}" for k in (3, 7, 15)]
    assert [m.label for m in rows] == ([f"{x} (2.0M, {w})" for x, w in [("SPD n=5 L_s=1", "lineage"), ("PPSD n=5", "twin")]
                                        + [(e, "twin") for e in eagles]]
                                       + [f"{x} (12.8M, twin)" for x in ["PPSD n=5"] + eagles])  # the shipped row is 12.8M's SPD
    by = {m.label: m for m in rows}
    assert by["SPD n=5 L_s=1 (2.0M, lineage)"].draft == str(runs / "spd-2000000" / "pdm")
    assert by["PPSD n=5 (2.0M, twin)"].draft == str(runs / "ppsd-2000000" / "pdm")  # trained here
    assert by["EAGLE-3 k=7 (2.0M, twin)"].draft == str(results / "eagle3-2000000" / "draft")  # committed
    assert by["EAGLE-3 k=15 (12.8M, twin)"].draft == str(runs / "eagle3-12802091" / "draft")  # neither: listed missing
    present, missing = available(rows)
    assert {m.label for m in present} == {"PPSD n=5 (2.0M, twin)", *(f"{e} (2.0M, twin)" for e in eagles)}
    assert by["PPSD n=5 (2.0M, twin)"].schedule == "post" and by["EAGLE-3 k=3 (2.0M, twin)"].k == 3

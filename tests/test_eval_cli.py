"""`spd eval --quick` end to end on the default model: JSON, markdown report and plots."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from spd.eval.methods import shipped_label

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = shipped_label()
PPSD, EAGLE = "PPSD n=5 (240k)", "EAGLE-3 k=3 (240k)"  # the shipped baselines


@pytest.mark.slow
def test_quick_eval_writes_report_json_and_plots(default_model_dir, tmp_path):
    out = tmp_path / "eval"
    cmd = [sys.executable, "-m", "spd.cli", "eval", "--quick", "--sets", "mtbench,mtbench2", "--methods", ",".join([SHIPPED, PPSD, EAGLE]),
           "--out", str(out), "--no-progress"]
    subprocess.run(cmd, cwd=ROOT, check=True, timeout=1200, capture_output=True, text=True)
    metrics = json.loads((out / "metrics.json").read_text())
    for T in ("0.0", "1.0"):
        for s in ("mtbench", "mtbench2", "overall"):
            r = metrics[T][s][SHIPPED]
            assert 1 / 5 <= r["acceptance"] <= 1 and r["S0"] == pytest.approx(5 * r["acceptance"])
            assert r["wall_kind"] == "projected" and 0 < r["wall"] <= r["S0"]  # a projection never beats S0
            ppsd, eagle = metrics[T][s][PPSD], metrics[T][s][EAGLE]
            assert 1 / 5 <= ppsd["acceptance"] <= 1 and ppsd["S"] < ppsd["S0"]  # its draft is serialised
            assert 1 <= eagle["acceptance"] <= 4 and eagle["wall_kind"] == "measured"
            assert eagle["mismatches"] == 0  # greedy EAGLE-3 == AR on the real model
    check = json.loads((out / "check.json").read_text())
    assert check["live"]["N"] == check["estimate"]["N"] > 0
    report = (out / "report.md").read_text()
    assert "MT-Bench turn 2" in report and "projected" in report
    for png in ("speedup_main.png", "cycle_breakdown.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # a fresh clone has no sweep checkpoints: no empty sweep plot, and the report says so
    assert not (out / "width_sweep.png").exists() and "No width-sweep plot" in report

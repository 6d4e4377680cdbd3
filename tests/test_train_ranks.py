"""`spd train` under torchrun: two gloo ranks, each reading its own shards, train the same PDM (and
the EAGLE-3 draft trained with it, --with) as one process does at the same global batch (gradients
summed across ranks)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

from spd.train.teacher import TeacherCache, forward_teacher

ARGS = ["--vocab", "128", "--lr", "3e-3", "--warmup", "1", "--batch-tokens", "120", "--epochs", "4",
        "--eval-seqs", "4", "--amp", "float32", "--fill", "judged:0", "--no-progress"]  # judged:0: every fill a = 1; n: the default 5 (torchrun would take "--n" for its own)


def _spd_train(out, model_dir, cache, ranks: int, env):
    """(checkpoint, history) of the PDM, and the checkpoint of the EAGLE-3 draft trained with it (--with)."""
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"]
    cmd = launcher + ["-m", "spd.cli"] if ranks > 1 else [sys.executable, "-m", "spd.cli"]
    cmd += ["train", "--model", str(model_dir), "--data", str(cache), "--heldout", str(cache), "--out", str(out), *ARGS,
            "--with", f"method=eagle3 ttt=2 feature-layers=1,4,5 out={out}-eagle"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    state = torch.load(out / "ckpt.pt", weights_only=False)
    history = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]
    return state, history, torch.load(f"{out}-eagle/ckpt.pt", weights_only=False)


def test_two_ranks_train_the_same_pdm_as_one_process_at_the_same_global_batch(tiny_dir, tmp_path):
    model_dir = tiny_dir("llama", num_layers=6, hidden_size=64, vocab_size=128)
    g = torch.Generator().manual_seed(0)
    seqs = [(torch.randint(3, 120, (40,), generator=g).tolist(), [False] * 10 + [True] * 30) for _ in range(4)]
    cache = tmp_path / "teacher"
    forward_teacher(model_dir, seqs, cache, batch=2, dtype=torch.float32, ns=(5,), shard_tokens=80)
    assert len(TeacherCache(cache).shards()) == 2  # one per rank
    env = {**os.environ, "SPD_CACHE": str(tmp_path / "spd-cache"), "OMP_NUM_THREADS": "1"}

    one, h1, eagle1 = _spd_train(tmp_path / "one", model_dir, cache, 1, env)
    two, h2, eagle2 = _spd_train(tmp_path / "two", model_dir, cache, 2, env)

    assert one["step"] == two["step"] == 4 and one["seen"] == two["seen"] == 4 * 120
    # each rank read only its own shard (of 2 sequences), once per epoch
    assert [(r["epoch"], r["shard"], r["seq"]) for r in two["ranks"]] == [(3, 0, 2)] * 2
    for name, w in one["pdm"].items():
        assert torch.allclose(w, two["pdm"][name], rtol=1e-4, atol=1e-5), name
    assert abs(h1[-1]["heldout_loss"] - h2[-1]["heldout_loss"]) < 1e-4 * h1[0]["heldout_loss"]
    assert h1[-1]["heldout_loss"] < h1[0]["heldout_loss"]  # and it learned something
    # the draft trained in the same run, on the same sequences: the same on both
    assert eagle1["step"] == eagle2["step"] > 1 and eagle1["seen"] == eagle2["seen"]
    for name, w in eagle1["draft"].items():
        assert torch.allclose(w, eagle2["draft"][name], rtol=1e-4, atol=1e-5), name

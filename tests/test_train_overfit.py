"""A tiny-model PDM training run (teacher cache -> aligned training -> export) overfits a small batch:
the KL falls a lot and the top-1 agreement with the teacher rises. Seconds on a CPU."""

from __future__ import annotations

import json
import shutil

import torch

from spd.core.pdm import PDM
from spd.train.teacher import TeacherCache, forward_teacher
from spd.train.trainer import TrainConfig, tokens_in_all, train


def test_tiny_training_overfits(tiny_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("SPD_CACHE", str(tmp_path / "cache"))
    model_dir = tiny_dir("llama", num_layers=6, hidden_size=64, vocab_size=128)
    g = torch.Generator().manual_seed(0)
    seqs = []
    for _ in range(4):
        T = 40
        ids = torch.randint(3, 120, (T,), generator=g).tolist()
        mask = [False] * 10 + [True] * (T - 10)  # the first 10 tokens play the prompt
        seqs.append((ids, mask))
    cache = tmp_path / "teacher"
    forward_teacher(model_dir, seqs, cache, batch=2, dtype=torch.float32, ns=(3,))
    tc = TeacherCache(cache)
    assert tc.progress()["loss_tokens"] == 4 * 30  # positions whose next token is assistant text
    s = tc.sequences(tc.shards()[0])[0]
    assert s["anchors"].shape == (40, len(tc.layers), 64) and s["top_p"][9:39].sum(-1).min() > 0.5 and s["loss"][9:39].all()

    cfg = TrainConfig(model=str(model_dir), n=3, ls=1, data=str(cache), heldout=str(cache), vocab=96, lr=3e-3,
                      warmup=1, batch_tokens=120, epochs=60, eval_seqs=4, eval_every_s=1e9, ckpt_every_s=1e9,
                      out=str(tmp_path / "run"), progress=False)
    pdm = train(cfg)
    hist = [json.loads(line) for line in (tmp_path / "run" / "history.jsonl").read_text().splitlines()]
    first, last = hist[0], hist[-1]
    assert last["heldout_loss"] < 0.3 * first["heldout_loss"], hist
    assert last["heldout_p"] > first["heldout_p"] + 0.3, hist

    # the exported checkpoint loads for inference with its provenance
    loaded = PDM.load(tmp_path / "run" / "pdm")
    assert loaded.config.trained_n == 3 and loaded.config.schedule == "pre"
    assert loaded.config.notes["tokens_seen"] == last["seen"]
    assert torch.equal(loaded.d2t, pdm.d2t)

    # resume: continuing from the checkpoint runs further without redoing the done part
    cfg2 = TrainConfig(**{**cfg.__dict__, "resume": True, "epochs": 62})
    train(cfg2)
    hist2 = [json.loads(line) for line in (tmp_path / "run" / "history.jsonl").read_text().splitlines()]
    assert hist2[-1]["seen"] > last["seen"] and hist2[-1]["seen"] <= last["seen"] + 3 * 120

    # warm start on a "fresh machine": a new run from the exported weights starts where the old one ended
    cfg3 = TrainConfig(**{**cfg.__dict__, "out": str(tmp_path / "warm"), "init_from": str(tmp_path / "run" / "pdm"),
                          "epochs": 1, "notes": {}})
    train(cfg3)
    hist3 = [json.loads(line) for line in (tmp_path / "warm" / "history.jsonl").read_text().splitlines()]
    assert abs(hist3[0]["heldout_loss"] - hist2[-1]["heldout_loss"]) < 0.02 * hist2[-1]["heldout_loss"]  # fp16 export
    warm = PDM.load(tmp_path / "warm" / "pdm").config.notes
    assert warm["init_from"]["tokens_seen"] == hist2[-1]["seen"]
    assert tokens_in_all(warm) == hist2[-1]["seen"] + hist3[-1]["seen"]  # what a warm start of it records as its base's
    train(TrainConfig(**{**cfg3.__dict__, "resume": True, "epochs": 2, "notes": {}}))  # a warm start resumed
    assert PDM.load(tmp_path / "warm" / "pdm").config.notes["init_from"] == warm["init_from"]  # keeps its provenance
    assert {k: v for k, v in warm["vocab"].items() if k != "from"} == loaded.config.notes["vocab"]  # its provenance kept

    # a warm start that grows the predecessor input (--prev) starts from the draft it loaded, exactly
    # as good (zero projections), and trains the new fusions
    cfg4 = TrainConfig(**{**cfg3.__dict__, "out": str(tmp_path / "grown"), "prev": True, "epochs": 3, "notes": {}})
    train(cfg4)
    hist4 = [json.loads(line) for line in (tmp_path / "grown" / "history.jsonl").read_text().splitlines()]
    assert hist4[0]["heldout_loss"] == hist3[0]["heldout_loss"]
    grown = PDM.load(tmp_path / "grown" / "pdm")
    assert grown.config.prev and any(f.proj.weight.abs().sum() > 0 for f in grown.prev_fusions)

    # the base replaced where --init-from points (as shipping a draft does), then the warm start
    # resumed: its provenance is the base it started from, not what that folder holds now
    shutil.copytree(tmp_path / "grown" / "pdm", tmp_path / "run" / "pdm", dirs_exist_ok=True)
    train(TrainConfig(**{**cfg3.__dict__, "resume": True, "epochs": 3, "notes": {}}))
    assert PDM.load(tmp_path / "warm" / "pdm").config.notes["init_from"] == warm["init_from"]

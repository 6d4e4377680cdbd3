"""Several students trained in one run (spd.train.loop.train_plans): each ends exactly where it ends
trained alone on the same data and seed, the online teacher runs once per part for all of them (with
every student's layers), and a stopped run resumes to the result of an uninterrupted one."""

from __future__ import annotations

import collections
import dataclasses
import json
import logging

import numpy as np
import pytest
import torch

from spd.eagle import train as eagle
from spd.config import EagleTrainConfig, TrainConfig
from spd.train import online, selfgen, trainer
from spd.train.loop import train_plans
from spd.train.selfgen import IdStore, Job, fingerprint
from spd.train.teacher import cache_layers, forward_teacher

COMMON = dict(lr=3e-3, warmup=1, eval_seqs=4, eval_every_s=1e9, ckpt_every_s=1e9, progress=False, amp="float32")


@pytest.fixture
def teacher(tiny_dir, tmp_path, monkeypatch):
    """(tiny target, its fp32 teacher cache: 6 sequences in 3 shards)."""
    monkeypatch.setenv("SPD_CACHE", str(tmp_path / "spd-cache"))
    model_dir = tiny_dir("llama", num_layers=6, hidden_size=64, vocab_size=128)
    g = torch.Generator().manual_seed(0)
    seqs = [(torch.randint(3, 120, (40,), generator=g).tolist(), [False] * 10 + [True] * 30) for _ in range(6)]
    forward_teacher(model_dir, seqs, tmp_path / "teacher", batch=2, dtype=torch.float32, shard_tokens=80)
    return model_dir, tmp_path / "teacher"


def _students(model_dir, cache, root, **kw):
    """The plans of a PDM (n 3, L_s 1, V_s 96) and an EAGLE-3 draft (TTT 2, V_s 80), stepping at
    different batch sizes."""
    data = dict(model=str(model_dir), data=str(cache), heldout=str(cache), epochs=3, **COMMON, **kw)
    return [trainer.plan(TrainConfig(n=3, ls=1, vocab=96, batch_tokens=50, out=str(root / "pdm"), **data)),
            eagle.plan(EagleTrainConfig(feature_layers=[1, 3, 5], ttt=2, vocab=80, batch_tokens=70, out=str(root / "eagle"), **data))]


def _result(out) -> tuple[dict, dict, list[dict]]:
    """(weights, counters, history without the clock) of a run directory."""
    state = torch.load(out / "ckpt.pt", weights_only=False)
    weights = state["pdm"] if "pdm" in state else state["draft"]
    counters = {k: state[k] for k in ("step", "seen", "pending", "epoch", "shard", "seq")}
    history = [{k: v for k, v in json.loads(line).items() if k not in ("elapsed_s", "eval_s")}
               for line in (out / "history.jsonl").read_text().splitlines()]
    return weights, counters, history


def _assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-6, atol=1e-7, msg=name)


def test_each_student_of_a_run_trains_exactly_as_it_does_alone(teacher, tmp_path):
    model_dir, cache = teacher
    students = train_plans(_students(model_dir, cache, tmp_path / "together"))
    assert [s.name for s in students] == ["pdm", "draft"]
    for i, name in enumerate(("pdm", "eagle")):
        train_plans([_students(model_dir, cache, tmp_path / "alone")[i]])
        (w1, c1, h1), (w2, c2, h2) = _result(tmp_path / "together" / name), _result(tmp_path / "alone" / name)
        _assert_same_weights(w1, w2)
        assert c1 == c2 and h1 == h2 and c1["step"] > 3, name
        assert h1[-1]["heldout_loss"] != h1[0]["heldout_loss"]


def test_a_stopped_run_resumes_to_the_result_of_an_uninterrupted_one(teacher, tmp_path):
    model_dir, cache = teacher
    train_plans(_students(model_dir, cache, tmp_path / "one"))
    train_plans(_students(model_dir, cache, tmp_path / "two", max_steps=4))  # stopped at different data positions
    stopped = {name: _result(tmp_path / "two" / name)[1] for name in ("pdm", "eagle")}
    assert stopped["pdm"]["step"] == stopped["eagle"]["step"] == 4 and stopped["pdm"]["seen"] != stopped["eagle"]["seen"]
    train_plans(_students(model_dir, cache, tmp_path / "two", resume=True))
    for name in ("pdm", "eagle"):
        (w1, c1, h1), (w2, c2, h2) = _result(tmp_path / "one" / name), _result(tmp_path / "two" / name)
        _assert_same_weights(w1, w2)
        assert c1 == c2 and h1[-1] == h2[-1], name


def test_a_run_resumed_from_its_slim_checkpoint_goes_on_from_the_same_step_and_data(teacher, tmp_path):
    """ckpt-slim.pt (bf16 weights, no optimizer state) alone resumes a stopped run: same step, data
    position and schedule as the uninterrupted run, AdamW's moments anew, so close to its result."""
    model_dir, cache = teacher
    train_plans(_students(model_dir, cache, tmp_path / "one"))
    train_plans(_students(model_dir, cache, tmp_path / "two", max_steps=4))
    for name, key in (("pdm", "pdm"), ("eagle", "draft")):
        run = tmp_path / "two" / name
        full, light = (torch.load(run / f, weights_only=False) for f in ("ckpt.pt", "ckpt-slim.pt"))
        assert "opt" not in light and {k: light[k] for k in ("step", "seen", "shard", "seq")} == \
            {k: full[k] for k in ("step", "seen", "shard", "seq")}
        for w, v in full[key].items():
            assert torch.equal(light[key][w], v.to(torch.bfloat16) if v.is_floating_point() else v), w
        (run / "ckpt.pt").unlink()
    train_plans(_students(model_dir, cache, tmp_path / "two", resume=True))
    for name in ("pdm", "eagle"):
        (_, c1, h1), (_, c2, h2) = _result(tmp_path / "one" / name), _result(tmp_path / "two" / name)
        assert c1 == c2 and h1[-1]["step"] == h2[-1]["step"], name
        last1, last2 = np.asarray(h1[-1]["heldout_loss"]), np.asarray(h2[-1]["heldout_loss"])
        assert not np.allclose(last1, last2, rtol=1e-6) and np.allclose(last1, last2, rtol=0.1), (name, last1, last2)


def test_an_eagle3_warm_start_begins_where_its_base_ended_and_keeps_its_provenance(teacher, tmp_path):
    """--init-from for the EAGLE-3 draft, as for the PDM: a new run from the exported draft (its
    weights, feature layers and vocabulary; AdamW anew) starts at the base's held-out figures, and its
    export counts the base's tokens, also after a resume."""
    from spd.eagle.model import EagleDraft

    model_dir, cache = teacher
    data = dict(model=str(model_dir), data=str(cache), heldout=str(cache), **COMMON)
    base = EagleTrainConfig(feature_layers=[1, 3, 5], ttt=2, vocab=80, batch_tokens=70, epochs=3,
                            out=str(tmp_path / "base"), **data)
    train_plans([eagle.plan(base)])
    _, counters, history = _result(tmp_path / "base")
    warm = EagleTrainConfig(ttt=2, vocab=80, batch_tokens=70, epochs=1, init_from=str(tmp_path / "base" / "draft"),
                            out=str(tmp_path / "warm"), **data)  # feature layers: the base's
    train_plans([eagle.plan(warm)])
    _, _, warm_history = _result(tmp_path / "warm")
    for a, b in zip(warm_history[0]["heldout_loss"], history[-1]["heldout_loss"]):
        assert a == pytest.approx(b, rel=0.02)  # the fp16 export
    draft = EagleDraft.load(tmp_path / "warm" / "draft")
    assert draft.config.feature_layers == [1, 3, 5]
    assert torch.equal(draft.d2t, EagleDraft.load(tmp_path / "base" / "draft").d2t)
    assert draft.config.notes["init_from"]["tokens_seen"] == counters["seen"] > 0
    assert eagle.tokens_in_all(draft.config) == counters["seen"] + warm_history[-1]["seen"]
    train_plans([eagle.plan(dataclasses.replace(warm, resume=True, epochs=2, notes={}))])  # a warm start resumed
    assert EagleDraft.load(tmp_path / "warm" / "draft").config.notes["init_from"] == draft.config.notes["init_from"]
    with pytest.raises(ValueError, match="feature-layers"):
        eagle.plan(dataclasses.replace(warm, feature_layers=[0, 2, 5]))


def _selfgen_dir(root, jobs: list[Job], responses: dict[int, list[int]], parts: int) -> None:
    """A self-generated id directory of `jobs` with the responses of some of them, in `parts` parts."""
    store = IdStore(root, {"split": "train", "max_prompt": 64, "seed": 0, "fingerprint": fingerprint(jobs)}, 128)
    for part in np.array_split(np.array(sorted(responses)), parts):
        for j in part:
            store.add(int(j), responses[j])
        store.flush()


def _no_sharegpt(*args):
    raise FileNotFoundError("no ShareGPT in this test")


def test_the_online_teacher_runs_once_per_part_for_all_students_with_all_their_layers(tiny_dir, tmp_path, monkeypatch,
                                                                                       caplog):
    monkeypatch.setenv("SPD_CACHE", str(tmp_path / "spd-cache"))
    model_dir = tiny_dir("llama", num_layers=4, hidden_size=64, vocab_size=128)
    g = torch.Generator().manual_seed(0)
    jobs = [Job(tuple(torch.randint(3, 120, (8,), generator=g).tolist()), 0.0) for _ in range(6)]
    responses = {j: torch.randint(3, 120, (24,), generator=g).tolist() for j in range(len(jobs))}
    _selfgen_dir(tmp_path / "train", jobs, responses, parts=2)
    _selfgen_dir(tmp_path / "heldout", jobs, {0: responses[0], 1: responses[1]}, parts=1)
    monkeypatch.setattr(selfgen, "selfgen_jobs", lambda tokenizer, split, max_prompt, seed: jobs)  # (no ShareGPT prompts)
    monkeypatch.setattr("spd.models.loading.load_tokenizer", lambda model_dir: None)  # (an id-only model)
    monkeypatch.setattr("spd.train.vocab.sharegpt_counts", _no_sharegpt)
    reads: collections.Counter = collections.Counter()  # "dir/part" -> teacher passes over it
    teachers: list[list[int]] = []  # the layers of each target loaded
    real_sequences, real_init = online.OnlineCache.sequences, online.OnlineTeacher.__init__

    def sequences(self, part, pick=None):
        reads[f"{part.parent.name}/{part.name}"] += 1
        return real_sequences(self, part, pick)

    def init(self, model_dir, layers, *args, **kwargs):
        teachers.append(list(layers))
        real_init(self, model_dir, layers, *args, **kwargs)

    monkeypatch.setattr(online.OnlineCache, "sequences", sequences)
    monkeypatch.setattr(online.OnlineTeacher, "__init__", init)

    data = dict(model=str(model_dir), data=str(tmp_path / "train"), heldout=str(tmp_path / "heldout"), epochs=2,
                vocab=100, batch_tokens=40, **COMMON)
    pdm = TrainConfig(n=3, out=str(tmp_path / "pdm"), **data)
    plans = [trainer.plan(pdm), trainer.plan(dataclasses.replace(pdm, ls=2, out=str(tmp_path / "pdm-ls2"))),
             eagle.plan(EagleTrainConfig(ttt=2, out=str(tmp_path / "eagle"), **data))]  # default features (0, 2, 3)
    with caplog.at_level(logging.INFO, logger="spd.train.online"):
        students = train_plans(plans)

    assert sum(r.getMessage().startswith("[teacher] part_") for r in caplog.records) == sum(reads.values())  # timed
    assert reads == {"train/part_00000.npz": 2, "train/part_00001.npz": 2, "heldout/part_00000.npz": 1}  # once an epoch
    assert len(teachers) == 1 and 2 not in cache_layers(4) and {0, 2, 3} <= set(teachers[0])  # one target, every layer
    assert [s.module.d2t.tolist() for s in students[1:]] == [students[0].module.d2t.tolist()] * 2  # the same V_s: one vocabulary
    for out in ("pdm", "pdm-ls2", "eagle"):
        history = [json.loads(line) for line in (tmp_path / out / "history.jsonl").read_text().splitlines()]
        assert history[-1]["seen"] > 0 and history[-1]["heldout_loss"] != history[0]["heldout_loss"], out


def test_students_share_the_data_flags_have_their_own_out_and_find_their_layers(teacher, tmp_path):
    model_dir, cache = teacher
    pdm, draft = _students(model_dir, cache, tmp_path)
    for wrong, what in ((dataclasses.replace(draft.cfg, seed=1), "--seed"), (dataclasses.replace(draft.cfg, out=pdm.cfg.out), "--out")):
        with pytest.raises(ValueError, match=what):
            train_plans([pdm, dataclasses.replace(draft, cfg=wrong)])
    forward_teacher(model_dir, [([5] * 20, [False] * 5 + [True] * 15)], tmp_path / "n3", dtype=torch.float32, ns=(3,))
    narrow = dataclasses.replace(draft.cfg, data=str(tmp_path / "n3"), heldout="")  # a disk cache of n = 3's anchors
    with pytest.raises(ValueError, match=r"teacher layers \[1, 3\]"):
        train_plans([eagle.plan(narrow)])


def test_a_budget_fitted_to_the_time_ends_the_schedule_there(teacher, tmp_path):
    """--fit-seconds so short that nothing more fits once the pace is measured (the second step, the
    first being a cold start): the budget shrinks to the next step, and the learning rate reaches 0
    at it, where the run finishes."""
    model_dir, cache = teacher
    train_plans(_students(model_dir, cache, tmp_path / "fit", fit_seconds=1e-9)[:1])  # the PDM
    state = torch.load(tmp_path / "fit" / "pdm" / "ckpt.pt", weights_only=False)
    full = 3 * 6 * 30  # epochs x sequences x loss positions of the cache
    assert state["budget"] < full and state["seen"] >= state["budget"]
    assert state["step"] == 3 and state["opt"]["param_groups"][0]["lr"] == 0.0

"""The self-generated teacher cache (`spd.train.teacher.record_teacher`): every prompt's sequence is
written once, with its features, and a stopped job resumes with exactly the prompts not yet written."""

from __future__ import annotations

import random

import torch

from spd.train.teacher import TeacherCache, record_teacher


def _cache(root) -> dict[int, dict]:
    from safetensors.torch import load_file

    out: dict[int, dict] = {}
    cache = TeacherCache(root)
    for shard in cache.shards():
        jobs = load_file(shard)["job"].tolist()
        for job, seq in zip(jobs, cache.sequences(shard)):
            assert job not in out, f"prompt {job} written twice"
            out[job] = seq
    return out


def test_a_stopped_cache_resumes_to_the_same_sequences_as_one_run(tiny_dir, tmp_path):
    model_dir = tiny_dir("llama")
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 200) for _ in range(rng.randrange(2, 20))] for _ in range(9)]
    kw = dict(batch=3, max_new=10, eos_id=2, dtype=torch.float32, ns=(3,))
    whole = _cache(record_teacher(model_dir, prompts, tmp_path / "whole", **kw))
    record_teacher(model_dir, prompts, tmp_path / "parts", limit_tokens=40, **kw)
    first = _cache(tmp_path / "parts")
    assert 0 < len(first) < len(prompts)
    resumed = _cache(record_teacher(model_dir, prompts, tmp_path / "parts", **kw))
    assert sorted(whole) == sorted(resumed) == list(range(len(prompts)))
    for job, seq in whole.items():
        assert torch.equal(seq["tokens"], resumed[job]["tokens"])
        assert seq["tokens"][: len(prompts[job])].tolist() == prompts[job]
        assert int(seq["loss"].sum()) == len(seq["tokens"]) - len(prompts[job]) + 1  # every response token
        torch.testing.assert_close(seq["top_p"].float(), resumed[job]["top_p"].float(), atol=1e-3, rtol=1e-2)

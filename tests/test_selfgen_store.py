"""Self-generated ids on disk: under torchrun each rank writes its own parts into the shared
directory, none overwrites another's, and a resume sees every rank's finished jobs; more rounds of
jobs extend the list without renumbering what was generated, and a resume keeps the store's rounds."""

from __future__ import annotations

import numpy as np

from spd.train.selfgen import IdStore, Job, stored_rounds, with_rounds

META = {"fingerprint": "f", "model": "tiny", "dtype": "torch.float32"}


def test_ranks_write_their_own_parts_side_by_side_and_resume_sees_all_jobs(tmp_path):
    stores = [IdStore(tmp_path, META, 128, rank=r, world=2) for r in range(2)]
    for k in range(3):  # the ranks flush in turn, as they would running side by side
        for r, store in enumerate(stores):
            job = 2 * k + r  # rank r owns the jobs i with i % 2 == r
            store.add(job, [job] * (k + 1))
            store.flush()
    names = sorted(p.name for p in stores[0].parts())
    assert names == [f"part_{k:05d}-r{r}.npz" for k in range(3) for r in range(2)]
    assert all(s.done() == set(range(6)) for s in stores)
    assert [s.tokens(mine=True) for s in stores] == [6, 6] and stores[0].tokens() == 12
    rows = dict(row for p in stores[1].parts() for row in IdStore.read(p))
    assert {j: r.tolist() for j, r in rows.items()} == {2 * k + r: [2 * k + r] * (k + 1) for k in range(3) for r in range(2)}


def test_one_process_keeps_the_plain_part_names(tmp_path):
    store = IdStore(tmp_path, META, 128)
    store.add(0, [5, 6])
    store.flush()
    store.add(1, [7])
    store.flush()
    assert [p.name for p in store.parts()] == ["part_00000.npz", "part_00001.npz"] and store.tokens() == 3


def test_each_part_records_the_dtype_it_was_generated_in(tmp_path):
    IdStore(tmp_path, META, 128).flush()  # meta.json keeps the first run's settings
    store = IdStore(tmp_path, {**META, "dtype": "torch.bfloat16"}, 128)  # a resume on other hardware
    store.add(0, [5])
    store.flush()
    assert store.meta["dtype"] == "torch.float32"
    assert str(np.load(store.parts()[0])["dtype"]) == "torch.bfloat16"


def test_more_rounds_append_one_sampled_answer_per_prompt_and_keep_every_job_number(tmp_path):
    base = [Job((1, 2), 0.0), Job((3,), 0.0), Job((1, 2), 0.7), Job((4, 5, 6), 0.0)]
    one, three = with_rounds(base, 1), with_rounds(base, 3, block=2)
    assert one == base and three[:4] == base
    for r in (1, 2):  # each further round: every distinct prompt once more, sampled
        extra = three[4 + 3 * (r - 1):4 + 3 * r]
        assert sorted(j.prompt for j in extra) == [(1, 2), (3,), (4, 5, 6)] and {j.temperature for j in extra} == {0.7}
    store = IdStore(tmp_path, {**META, "rounds": 1}, 128)
    store.add(3, [9])
    store.flush()
    grown = IdStore(tmp_path, {**META, "rounds": 3}, 128)  # a later run with more rounds: same ids, longer list
    assert grown.meta["rounds"] == 3 and grown.done() == {3}
    assert IdStore(tmp_path, {**META, "rounds": 2}, 128).meta["rounds"] == 3  # fewer rounds never shrink it


def test_a_resume_generates_as_many_rounds_as_the_store_was_grown_to(tmp_path):
    assert stored_rounds(tmp_path / "new") == 1  # a new store starts with round 0 only
    IdStore(tmp_path, {**META, "rounds": 2}, 128)
    assert stored_rounds(tmp_path) == 2  # a later run without --rounds carries on with round 1's jobs
    IdStore(tmp_path, {**META, "rounds": 1}, 128)
    assert stored_rounds(tmp_path) == 2

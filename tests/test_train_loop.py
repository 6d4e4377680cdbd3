"""The loop's accounting with a student that takes a step's sequences in one `loss` call: the steps
fall where one sequence at a time puts them (a step after the sequence that brings the rows not yet
stepped on to batch_tokens, the excess carried over), the sequences come in the data order, and
`seen` counts every row. Students trained together read each shard once and step as they would alone."""

from __future__ import annotations

from pathlib import Path

import torch

from spd.config import LoopConfig
from spd.train.loop import RunState, Setup, shard_order, train_student, train_together

ROWS = [3, 0, 5, 7, 2, 9, 4, 1, 6]  # loss rows per sequence, in training order


class _Cache:
    """One shard whose sequences are just their ids and row counts."""

    layers: list[int] = []
    chunk = 0  # the stream reads a whole shard at a time

    def shards(self) -> list[str]:
        return ["s0"]

    def count(self, shard: str) -> int:
        return len(ROWS)

    def sequences(self, shard: str, pick: list[int] | None = None) -> list[dict]:
        seqs = [{"id": i, "rows": r} for i, r in enumerate(ROWS)]
        return seqs if pick is None else [seqs[i] for i in pick]

    def progress(self) -> dict:
        return {"loss_tokens": sum(ROWS)}


class _Student:
    name = "toy"

    def __init__(self):
        self.module = torch.nn.Linear(1, 1, bias=False)
        self.calls: list[list[int]] = []

    def rows(self, seq: dict) -> int:
        return seq["rows"]

    def loss(self, seqs: list[dict]):
        self.calls.append([s["id"] for s in seqs])
        rows = sum(s["rows"] for s in seqs)
        return (self.module.weight.sum() * rows if rows else None), rows, 0

    def evaluate(self, seqs: list[dict]) -> dict:
        return {}

    def export(self, path: Path, run: RunState) -> None:
        pass

    def extra_state(self) -> dict:
        return {}

    def load_extra_state(self, state: dict) -> None:
        pass


def _one_at_a_time(order: list[int], batch_tokens: int) -> list[list[int]]:
    """The sequences of each step as the one-sequence-at-a-time loop takes them."""
    steps, cur, pending = [], [], 0
    for i in order:
        cur.append(i)
        pending += ROWS[i]
        if pending >= batch_tokens:
            steps.append(cur)
            cur, pending = [], pending - batch_tokens
    return steps


def test_a_steps_sequences_reach_the_student_in_one_call_with_unchanged_accounting(tmp_path):
    cfg = LoopConfig(batch_tokens=8, warmup=1, heldout="", out=str(tmp_path), progress=False, amp="float32",
                     eval_every_s=1e9, ckpt_every_s=1e9)
    student = _Student()
    s = Setup(tmp_path, None, _Cache(), [], None, torch.arange(4), {})
    run = train_student(cfg, student, s)
    order = shard_order(len(ROWS), cfg.seed, 0, 0)  # the loop's data order
    assert student.calls == _one_at_a_time(order, cfg.batch_tokens)  # (the rows after the last step: never stepped on)
    assert run.seen == sum(ROWS) and run.step == len(student.calls) and (run.shard, run.seq) == (1, 0)  # shard done


class _CountingCache(_Cache):
    """Two shards (the second the first's rows reversed); counts the reads of each."""

    def __init__(self):
        self.reads: list[str] = []
        self.picked: list[int] = []  # the indices read, in order

    def shards(self) -> list[str]:
        return ["s0", "s1"]

    def sequences(self, shard: str, pick: list[int] | None = None) -> list[dict]:
        self.reads.append(shard)
        self.picked.extend(pick or [])
        rows = ROWS if shard == "s0" else ROWS[::-1]
        seqs = [{"id": (shard, i), "rows": r} for i, r in enumerate(rows)]
        return seqs if pick is None else [seqs[i] for i in pick]

    def progress(self) -> dict:
        return {"loss_tokens": 2 * sum(ROWS)}


def _toy_run(tmp_path, cache, batch_tokens: list[int]) -> list[_Student]:
    students = [_Student() for _ in batch_tokens]
    jobs = [(LoopConfig(batch_tokens=b, warmup=1, heldout="", out=str(tmp_path / f"s{i}-{b}"), progress=False,
                        amp="float32", eval_every_s=1e9, ckpt_every_s=1e9, epochs=2),
             st, Setup(tmp_path, None, cache, [], None, torch.arange(4), {})) for i, (b, st) in enumerate(zip(batch_tokens, students))]
    train_together(jobs)
    return students


def test_students_of_one_run_read_each_shard_once_and_step_as_they_would_alone(tmp_path):
    cache = _CountingCache()
    together = _toy_run(tmp_path, cache, [8, 5])
    assert cache.reads == ["s0", "s1"] * 2  # once per shard and epoch, for both students
    for b, student in zip([8, 5], together):
        [alone] = _toy_run(tmp_path / "alone", _CountingCache(), [b])
        assert student.calls == alone.calls and len(alone.calls) > 4


def test_a_run_ending_inside_a_shard_reads_no_chunk_past_the_one_it_stops_in(tmp_path):
    """With chunks (a teacher pass over a few sequences at a time), a budget that ends inside a
    shard costs no features beyond its chunk, and the steps are those of whole-shard reads."""
    cache = _CountingCache()
    cache.chunk = 2
    cfg = LoopConfig(batch_tokens=4, warmup=1, heldout="", out=str(tmp_path / "a"), progress=False, amp="float32",
                     eval_every_s=1e9, ckpt_every_s=1e9, tokens=12)
    student = _Student()
    run = train_student(cfg, student, Setup(tmp_path, None, cache, [], None, torch.arange(4), {}))
    order = shard_order(len(ROWS), cfg.seed, 0, 0)
    used = run.seq  # sequences of shard s0 fed before the budget was met
    assert run.seen >= 12 and used < len(ROWS) - 2
    assert cache.picked == order[:used + (-used) % 2]  # whole chunks, none past the last one used
    whole = _Student()
    train_student(LoopConfig(**{**cfg.__dict__, "out": str(tmp_path / "b")}), whole,
                  Setup(tmp_path, None, _CountingCache(), [], None, torch.arange(4), {}))
    assert student.calls == whole.calls


def test_a_fresh_run_with_skip_shards_starts_its_data_at_that_shard(tmp_path):
    cache = _CountingCache()
    cfg = LoopConfig(batch_tokens=4, warmup=1, heldout="", out=str(tmp_path), progress=False, amp="float32",
                     eval_every_s=1e9, ckpt_every_s=1e9, tokens=sum(ROWS), skip_shards=1)
    student = _Student()
    run = train_student(cfg, student, Setup(tmp_path, None, cache, [], None, torch.arange(4), {}))
    assert cache.reads == ["s1"] and {i[0] for call in student.calls for i in call} == {"s1"}
    assert run.seen == sum(ROWS)

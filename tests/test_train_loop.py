"""The loop's accounting with a student that takes a step's sequences in one `loss` call: the steps
fall where one sequence at a time puts them (a step after the sequence that brings the rows not yet
stepped on to batch_tokens, the excess carried over), the sequences come in the data order, and
`seen` counts every row."""

from __future__ import annotations

from pathlib import Path

import torch

from spd.config import LoopConfig
from spd.train.loop import RunState, Setup, shard_order, train_student

ROWS = [3, 0, 5, 7, 2, 9, 4, 1, 6]  # loss rows per sequence, in training order


class _Cache:
    """One shard whose sequences are just their ids and row counts."""

    layers: list[int] = []

    def shards(self) -> list[str]:
        return ["s0"]

    def sequences(self, shard: str) -> list[dict]:
        return [{"id": i, "rows": r} for i, r in enumerate(ROWS)]

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

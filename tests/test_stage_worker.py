"""The stage process's scheduling, in process: a StageWorker fed messages directly, its sends recorded.

A long prompt runs in the chunks of `prefill_chunks`, one chunk per round, and another request's
decode steps run between them; each chunk computes exactly what the in-process prefill computes.
"""

from __future__ import annotations

import pytest
import torch

import spd.core.target as target
from conftest import pipeline
from runtime_util import draft, ipc_topology, prefill, record_sends, reseed, sent
from spd import wire
from spd.runtime.stage_worker import StageWorker


@pytest.fixture
def stage1(tiny_dir, tmp_path, monkeypatch):
    """Stage 1 of 2 as a worker (rows 2, gathering off), with every send it makes recorded."""
    monkeypatch.setattr(target, "PREFILL_CHUNK", 4)
    _, _, stages = pipeline(tiny_dir("llama", vocab_size=256, num_layers=4, hidden_size=64), 2)
    stages[0].rows = 2
    worker = record_sends(StageWorker(ipc_topology(tmp_path), 1, stages[0], gather=0))
    yield worker
    worker.close()


def test_a_long_prompt_runs_chunk_by_chunk_between_the_decode_steps_of_another_request(stage1, tiny_dir):
    epoch = wire.next_epoch(0)
    long_prompt = list(range(10, 20))  # chunks [0, 4) [4, 8) [8, 10)
    stage1.handle(prefill(0, [1, 2, 3], epoch))
    stage1.after_messages()  # slot 0 is decoding when the long prompt arrives
    stage1.handle(prefill(1, long_prompt, epoch))
    stage1.handle(reseed(0, epoch + 1, pos=3, token=7))
    stage1.handle(draft(0, epoch + 1, pos=4, token=8))
    stage1.after_messages()
    hidden = [(h.slot, h.pos, len(h.tokens), h.h) for h in sent(stage1, wire.Hidden)]
    # one round each: a chunk of slot 1, then a decode step of slot 0
    assert [(s, p, w) for s, p, w, _ in hidden] == [(0, 0, 3), (1, 0, 4), (0, 3, 1), (1, 4, 4), (0, 4, 1), (1, 8, 2)]
    assert stage1.stage.kv_length_of(1) == 10 and stage1.stage.kv_length_of(0) == 5

    _, _, reference = pipeline(tiny_dir("llama", vocab_size=256, num_layers=4, hidden_size=64), 2)
    chunks = []
    target.prefill(reference, torch.tensor(long_prompt), lambda j, out, start: j == 1 and chunks.append(out.hidden))
    assert [start for start, _ in target.prefill_chunks(10)] == [0, 4, 8]
    for got, want in zip([h for s, _, _, h in hidden if s == 1], chunks, strict=True):
        assert torch.equal(got, want)


def test_gathering_holds_single_tokens_until_every_decoding_slot_has_one(stage1):
    stage1.gather.factor = 1000.0  # hold for as long as the test needs
    epoch = wire.next_epoch(0)
    for slot in (0, 1):
        stage1.handle(prefill(slot, [1, 2, 3], epoch))
    stage1.after_messages()  # the prompts run at once (chunks never wait)
    stage1.gather.observe(0.01)
    stage1.handle(reseed(0, epoch + 1, pos=3, token=7))
    stage1.after_messages()
    assert not [h for h in sent(stage1, wire.Hidden) if h.pos == 3]
    assert stage1.wake_at is not None  # held, with a wake-up time
    stage1.handle(reseed(1, epoch + 2, pos=3, token=9))
    stage1.after_messages()
    ran = [h for h in sent(stage1, wire.Hidden) if h.pos == 3]
    assert sorted(h.slot for h in ran) == [0, 1] and all(h.batch == [2] for h in ran)  # one batch of both


def test_a_message_that_breaks_the_protocol_is_reported_as_an_error_naming_it(stage1):
    epoch = wire.next_epoch(0)
    stage1._guarded(stage1._route_and_handle, prefill(0, [1, 2, 3], epoch))
    stage1._guarded(lambda _: stage1.after_messages(), None)
    stage1._guarded(stage1._route_and_handle, reseed(0, epoch + 1, pos=9, token=7))  # KV holds only 3
    (error,) = sent(stage1, wire.Error)
    assert (error.rid, error.epoch, error.slot, error.pos, error.compute) == ("r0", epoch + 1, 0, 9, False)
    assert (error.role, error.index) == ("stage", 1) and "reseed at 9" in error.reason
    assert stage1.dropped["protocol"] == 1

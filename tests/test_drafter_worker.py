"""The drafter process's bookkeeping, in process: a DrafterWorker fed messages directly, its sends
recorded. Anchors of an epoch not opened yet wait for it; anchors of an older epoch count only for
positions its flush kept; slots that are ready together draft as one batch."""

from __future__ import annotations

import pytest

from runtime_util import anchors, ipc_topology, prefill, record_sends, reseed
from spd import wire
from spd.core.scripted import ScriptedDrafter
from spd.runtime.drafter_worker import DrafterWorker

N = 2  # stages
SCRIPT = [40, 41, 42, 43, 44, 45]  # each request's drafts: its prompt, then these


@pytest.fixture
def drafter(tmp_path):
    worker = record_sends(DrafterWorker(ipc_topology(tmp_path), ScriptedDrafter([], 256, continuation=SCRIPT, n=N),
                                        gather=0))
    yield worker
    worker.close()


def _drafts(worker):
    """(slot, position, token, batch) of each draft sent to stage 1 (a copy goes to the orchestrator)."""
    return [(d.slot, d.pos, d.token, d.batch) for sock, d in worker.sent
            if isinstance(d, wire.Draft) and sock is worker.to_stage1]


def _prefilled(worker, slot, epoch, prompt=(1, 2, 3)):
    """A prompt through both stages, then its first token committed (RESEED at the prompt's end)."""
    worker.handle(prefill(slot, list(prompt), epoch))
    for stage in range(1, N + 1):
        worker.handle(anchors(slot, epoch, stage, 0, len(prompt)))
    worker.handle(reseed(slot, epoch + 1, pos=len(prompt), token=7))


def test_anchors_of_an_epoch_not_opened_yet_wait_for_it_and_then_count(drafter):
    epoch = wire.next_epoch(0)
    drafter.handle(prefill(0, [1, 2, 3], epoch))
    for stage in range(1, N + 1):
        drafter.handle(anchors(0, epoch, stage, 0, 3))
    drafter.handle(anchors(0, epoch + 1, 1, 3, 1))  # stage 1 ran the reseed token before the RESEED got here
    assert drafter.slots[0].future
    drafter.handle(reseed(0, epoch + 1, pos=3, token=7))
    drafter.after_messages()
    drafter.after_messages()  # the next draft needs the reseed token at depth 1: the held anchors
    assert _drafts(drafter) == [(0, 4, SCRIPT[1], 1), (0, 5, SCRIPT[2], 1)]


def test_anchors_of_an_older_epoch_count_only_below_the_base_its_flush_kept(drafter):
    epoch = wire.next_epoch(0)
    _prefilled(drafter, 0, epoch)
    drafter.after_messages()  # drafts position 4
    drafter.handle(reseed(0, epoch + 2, pos=4, token=9))  # position 4 was rejected
    drafter.handle(anchors(0, epoch + 1, 1, 3, 2))  # late: positions 3 (kept) and 4 (void) from the old epoch
    state = drafter.slots[0].state
    assert state.depth[3] == 1 and state.depth[4] == 0  # 3 counted; 4 is the new token, still at depth 0
    stale_before = drafter.dropped["stale"]
    drafter.handle(anchors(0, epoch + 1, 2, 4, 1))  # entirely past the kept base
    assert drafter.dropped["stale"] == stale_before + 1


def test_slots_that_are_ready_together_draft_as_one_batch(drafter):
    epoch = wire.next_epoch(0)
    for slot in (0, 1, 2):
        _prefilled(drafter, slot, epoch + 10 * slot, prompt=(1, 2, 3 + slot))
    drafter.after_messages()
    assert sorted(_drafts(drafter)) == [(0, 4, SCRIPT[1], 3), (1, 4, SCRIPT[1], 3), (2, 4, SCRIPT[1], 3)]

"""The drafter as a process: collects anchor states from the stages and drafts one token per cycle
for every request in flight, each in its own slot (own drafter state, epochs and buffers). Once
the queued messages are handled, every slot that is ready drafts, all in one batched forward
(`DrafterState.draft_many`, batch-invariant).

It drafts the token after a request's newest one as soon as every position has been seen at the
depth the staircase prescribes (pre-step: the newest at depth 0, the one before at depth 1, ...),
and uses exactly those depths, so it proposes what the lockstep engine would, whatever the timing.
The draft goes straight to stage 1 (verification stays off the critical path) and to the
orchestrator.

Anchor messages of an older epoch still count for positions the flush kept (position < the base of
the next epoch): the last stage's states of a token that just left the pipeline often arrive after
the orchestrator's RESEED.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field

import torch
import zmq

from spd import settings, wire
from spd.core.drafter import Drafter
from spd.core.sampling import SamplingParams
from spd.runtime.gather import Gather
from spd.runtime.topology import Topology
from spd.runtime.worker import MAX_PENDING, Worker

log = logging.getLogger(__name__)


@dataclass
class _Slot:
    """One request's drafting state."""
    state: Drafter  # a DrafterState (PDM), or a ScriptedDrafter in tests
    rid: str = ""
    epoch: int = -1
    params: SamplingParams = field(default_factory=SamplingParams)
    s0: int = 0  # staircase offset of the schedule (pre 0, post 1)
    limit: int = 0  # drafts may take positions < limit
    base: int = 0  # first position of the current fill
    bases: dict[int, int] = field(default_factory=dict)  # epoch -> base, to judge older anchor messages
    future: list[wire.Anchors] = field(default_factory=list)  # anchors of epochs not opened yet


class DrafterWorker(Worker):
    role = "drafter"
    to_stage1: zmq.Socket

    def __init__(self, topology: Topology, state: Drafter, endpoint: str | None = None,
                 handover: Worker | None = None, gather: float = settings.GATHER):
        super().__init__(topology, endpoint or topology.drafter, 0, handover)
        self.state = state  # the prototype: slot k drafts with state.fork()
        self.slots: dict[int, _Slot] = {}
        self.gather = Gather(gather)  # ready drafts wait a little for the other decoding slots

    def _routes(self) -> dict[str, str]:
        return {**super()._routes(), "to_stage1": self.topology.stages[0]}

    def _slot(self, sid: int) -> _Slot:
        if sid not in self.slots:
            self.slots[sid] = _Slot(self.state.fork())
        return self.slots[sid]

    def handle(self, msg: wire.Message) -> None:
        sid = msg.slot
        slot = self._slot(sid)
        if isinstance(msg, (wire.Prefill, wire.Reseed, wire.Cancel)):
            if msg.epoch < slot.epoch or not self.plausible(msg):
                return
            self._open_epoch(slot, msg)
        elif isinstance(msg, wire.Anchors):
            if msg.rid != slot.rid and msg.epoch <= slot.epoch:
                return
            if msg.epoch > slot.epoch:
                if len(slot.future) < MAX_PENDING:
                    slot.future.append(msg)
                return
            self._observe(slot, msg)

    def _open_epoch(self, slot: _Slot, msg: wire.Prefill | wire.Reseed | wire.Cancel) -> None:
        if not isinstance(msg, wire.Reseed) or msg.rid != slot.rid:
            slot.bases = {}
        slot.rid, slot.epoch = msg.rid, msg.epoch
        if isinstance(msg, wire.Cancel):
            slot.limit = 0
            slot.state.reset()
            return
        if isinstance(msg, wire.Prefill):
            slot.params, slot.s0, slot.limit = msg.params, msg.s0, msg.draft_limit
            slot.state.reset()
            slot.state.enter(0, msg.ids.to(torch.long))
            slot.base = len(msg.ids)  # nothing drafted before the first token is committed
        else:
            slot.base = msg.base
            slot.state.truncate(slot.base)
            slot.state.enter(slot.base, torch.tensor([msg.token]))
        slot.bases[slot.epoch] = slot.base
        waiting, slot.future = slot.future, []
        for m in waiting:
            if m.epoch <= slot.epoch:
                self._observe(slot, m)
            else:
                slot.future.append(m)

    def _observe(self, slot: _Slot, msg: wire.Anchors) -> None:
        count = msg.count
        if msg.epoch < slot.epoch:  # older epoch: only positions its flush kept are still valid
            # epochs are not consecutive (wire.next_epoch): the flushes after msg's epoch kept < min base
            keep = min((b for e, b in slot.bases.items() if e > msg.epoch), default=None)
            if keep is None or msg.pos >= keep:
                self.dropped["stale"] += 1
                return
            count = min(count, keep - msg.pos)
        count = min(count, slot.state.length - msg.pos)
        if count <= 0:
            return
        anchors = {b: v[:count] for b, v in msg.anchors.items()}
        slot.state.observe(msg.pos, count, msg.stage, anchors)

    def after_messages(self) -> None:
        """Draft for every slot that is ready, as one batched draft."""
        ready = [(sid, slot, depths) for sid, slot in self.slots.items()
                 if (depths := self._ready_depths(sid, slot)) is not None]
        if not ready:
            return
        decoding = sum(slot.base < slot.state.length < slot.limit for slot in self.slots.values())
        self.wake_at = self.gather.hold_until(len(ready), decoding, time.monotonic())
        if self.wake_at is not None:
            return
        t0 = time.perf_counter()
        drafts = type(self.state).draft_many([(slot.state, slot.params, depths) for _, slot, depths in ready])
        dt = time.perf_counter() - t0
        self.gather.observe(dt)
        t_ms = 1e3 * dt  # what each of them waited
        for (sid, slot, _), d in zip(ready, drafts):
            self._send_draft(sid, slot, d, t_ms, len(ready))

    def _ready_depths(self, sid: int, slot: _Slot) -> list[int] | None:
        """The staircase to draft the slot's next token with, if it may draft now."""
        state = slot.state
        pos = state.length  # the position a draft would take
        if pos <= slot.base or pos >= slot.limit:  # first token not committed yet / limit reached
            return None
        depths = state.staircase(slot.base, slot.s0)
        if not state.ready(depths):
            log.debug("slot %d not ready for %d: seen %s want %s", sid, pos, state.depth[-4:], depths[-4:])
            return None
        return depths

    def _send_draft(self, sid: int, slot: _Slot, d, t_ms: float, batch: int) -> None:
        slot.state.enter(d.position, torch.tensor([d.token]))
        draft = wire.Draft(rid=slot.rid, epoch=slot.epoch, slot=sid, pos=d.position, base=slot.base, token=d.token,
                           t_ms=t_ms, fill=d.fill, batch=batch)
        log.debug("[draft] slot %d epoch %d pos %d token %d (batch %d)", sid, slot.epoch, d.position, d.token, batch)
        self.send(self.to_stage1, draft)
        self.send(self.to_orch, draft if d.q is None else dataclasses.replace(draft, q=wire.SparseDist.of(d.q)))

"""The drafter as a process: collects anchor states from the stages and drafts one token per cycle.

It drafts the token after the newest one as soon as every position has been seen at the depth the
staircase prescribes (pre-step: the newest at depth 0, the one before at depth 1, ...), and uses
exactly those depths, so it proposes what the lockstep engine would, whatever the timing. The
draft goes straight to stage 1 (verification stays off the critical path) and to the orchestrator.

Anchor messages of an older epoch still count for positions the flush kept (position < the base of
the next epoch): the last stage's states of a token that just left the pipeline often arrive after
the orchestrator's RESEED.
"""

from __future__ import annotations

import logging
import time

import torch

from spd import wire
from spd.core.drafter import DrafterState
from spd.core.sampling import SamplingParams
from spd.runtime.topology import Topology
from spd.runtime.worker import MAX_PENDING, Worker

log = logging.getLogger(__name__)


class DrafterWorker(Worker):
    role = "drafter"

    def __init__(self, topology: Topology, state: DrafterState, endpoint: str | None = None,
                 handover: Worker | None = None):
        super().__init__(topology, endpoint or topology.drafter, 0, handover)
        self.state = state  # a DrafterState (PDM), or a ScriptedDrafter in tests
        self.params, self.s0, self.limit, self.base = SamplingParams(), 0, 0, 0
        self.bases: dict[int, int] = {}  # epoch -> base, to judge older anchor messages
        self.future: list[wire.Message] = []

    def _routes(self) -> dict[str, str]:
        return {**super()._routes(), "to_stage1": self.topology.stages[0]}

    def handle(self, msg: wire.Message) -> None:
        if msg.kind in ("PREFILL", "RESEED", "CANCEL"):
            if msg.epoch < self.epoch or not self.plausible(msg):
                return
            self._open_epoch(msg)
        elif msg.kind == "ANCHORS":
            if msg.rid != self.rid and msg.epoch <= self.epoch:
                return
            if msg.epoch > self.epoch:
                if len(self.future) < MAX_PENDING:
                    self.future.append(msg)
                return
            self._observe(msg)
        else:
            return
        self._maybe_draft()

    def _open_epoch(self, msg: wire.Message) -> None:
        h = msg.header
        if msg.kind != "RESEED" or msg.rid != self.rid:
            self.bases = {}
        self.rid, self.epoch = msg.rid, msg.epoch
        if msg.kind == "CANCEL":
            self.limit = 0
            return
        if msg.kind == "PREFILL":
            self.params, self.s0, self.limit = SamplingParams(**h["params"]), h["s0"], h["draft_limit"]
            self.state.reset()
            self.state.enter(0, msg.tensors["ids"].to(torch.long))
            self.base = len(msg.tensors["ids"])  # nothing drafted before the first token is committed
        else:
            self.base = h["base"]
            self.state.truncate(self.base)
            self.state.enter(self.base, torch.tensor([int(h["token"])]))
        self.bases[self.epoch] = self.base
        waiting, self.future = self.future, []
        for m in waiting:
            if m.epoch <= self.epoch:
                self._observe(m)
            else:
                self.future.append(m)

    def _observe(self, msg: wire.Message) -> None:
        h = msg.header
        count = h["count"]
        if msg.epoch < self.epoch:  # older epoch: only positions its flush kept are still valid
            # epochs are not consecutive (wire.next_epoch): the flushes after msg's epoch kept < min base
            keep = min((b for e, b in self.bases.items() if e > msg.epoch), default=None)
            if keep is None or msg.pos >= keep:
                self.dropped["stale"] += 1
                return
            count = min(count, keep - msg.pos)
        count = min(count, self.state.length - msg.pos)
        if count <= 0:
            return
        anchors = {int(k[1:]): v[:count] for k, v in msg.tensors.items()}
        self.state.observe(msg.pos, count, h["stage"], anchors)

    def _maybe_draft(self) -> None:
        pos = self.state.length  # the position a draft would take
        if pos <= self.base or pos >= self.limit:  # first token not committed yet / limit reached
            return
        depths = self.state.staircase(self.base, self.s0)
        if not self.state.ready(depths):
            log.debug("not ready for %d: seen %s want %s", pos, self.state.depth[-4:], depths[-4:])
            return
        t0 = time.perf_counter()
        d = self.state.draft(self.params, depths)
        t_ms = 1e3 * (time.perf_counter() - t0)
        token, q = d.token, d.q
        self.state.enter(pos, torch.tensor([token]))
        head = {"pos": pos, "base": self.base, "token": token, "t_ms": t_ms, "fill": d.fill}
        log.debug("[draft] epoch %d pos %d token %d", self.epoch, pos, token)
        self.send(self.to_stage1, "DRAFT", head)
        tensors = None
        if q is not None:
            ids = torch.nonzero(q).flatten()
            tensors = {"ids": ids.to(torch.int32), "probs": q[ids]}
        self.send(self.to_orch, "DRAFT", head, tensors)

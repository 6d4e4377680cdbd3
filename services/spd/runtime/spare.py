"""A warm spare: a worker process started ahead, with torch and the model code imported, that holds
no role until the orchestrator gives it one.

It registers like any worker (HELLO/HEARTBEAT as role "spare", with its own inbox endpoint). When a
stage or the drafter dies, the orchestrator sends the spare ASSIGN {role, index, routes}; the spare
then reads that role's tensors from the safetensors cache, becomes a StageWorker or DrafterWorker
on the same context and inbox (its endpoint becomes the role's endpoint in the new routes) and
says HELLO under its new role. Takeover therefore costs a tensor load, not a process start.
"""

from __future__ import annotations

import logging

from spd import wire
from spd.runtime.topology import Topology
from spd.runtime.worker import Worker

log = logging.getLogger(__name__)


class Spare(Worker):
    role = "spare"

    def __init__(self, topology: Topology, endpoint: str, index: int):
        super().__init__(topology, endpoint, index)
        self.assignment: wire.Assign | None = None  # the ASSIGN, once one came

    def handle(self, msg: wire.Message) -> None:
        if isinstance(msg, wire.Assign) and self.plausible(msg):
            self.assignment = msg
            self.stop = True  # leave the receive loop, keep the sockets for the new role

    def wait_for_role(self) -> wire.Assign | None:
        """Serve as a spare until assigned: the ASSIGN, or None when told to stop."""
        log.info("[spare] %d waiting at %s", self.index, self.endpoint)
        self._serve()
        if self.assignment is None:
            self.close()
            return None
        for name in self._connected:  # the role's worker opens its own
            getattr(self, name).close(linger=0)
        a = self.assignment
        log.warning("[recover] spare %d takes over %s %d", self.index, a.role, a.index)
        self.stop = False
        return a

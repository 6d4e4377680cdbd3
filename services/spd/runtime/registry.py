"""Which workers are alive: HELLO / HEARTBEAT bookkeeping in the orchestrator."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass
class WorkerInfo:
    incarnation: str  # changes when the process restarts
    pid: int
    last_seen: float  # monotonic seconds


class Registry:
    def __init__(self, n: int, timeout_s: float = 2.0):
        self.n, self.timeout_s = n, timeout_s
        self.workers: dict[tuple[str, int], WorkerInfo] = {}

    def beat(self, role: str, index: int, incarnation: str, pid: int) -> bool:
        """Record a heartbeat; True when this is a new incarnation (a restarted worker)."""
        key = (role, index)
        old = self.workers.get(key)
        self.workers[key] = WorkerInfo(incarnation, pid, time.monotonic())
        if old is None or old.incarnation != incarnation:
            log.info("[register] %s %d incarnation %s pid %d", role, index, incarnation, pid)
            return old is not None
        return False

    def alive(self, role: str, index: int = 0) -> bool:
        w = self.workers.get((role, index))
        return w is not None and time.monotonic() - w.last_seen < self.timeout_s

    def missing(self, need_drafter: bool = True) -> list[str]:
        """Names of required workers not alive now."""
        out = [f"stage {j}" for j in range(1, self.n + 1) if not self.alive("stage", j)]
        if need_drafter and not self.alive("drafter"):
            out.append("drafter")
        return out

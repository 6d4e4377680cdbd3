"""Which workers are alive, where they listen, and which roles a warm spare should take over:
HELLO / HEARTBEAT bookkeeping in the orchestrator.

A worker is alive while its heartbeats keep coming (within `timeout_s`) and its connection has not
dropped (`endpoint_down`: a killed process is noticed at once, not after missed heartbeats). A role
(a stage or the drafter) is *vacant* when its worker was alive once and is not now, and no spare
is already on its way to it: then `take_spare` hands out an idle spare for it. Roles never held
(the cluster is still starting) are never vacant, so spares do not race starting workers.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from spd import settings

log = logging.getLogger(__name__)

ASSIGN_TIMEOUT_S = 30.0  # a spare that has not said HELLO in its new role by then is given up on


@dataclass
class WorkerInfo:
    incarnation: str  # changes when the process restarts
    pid: int
    endpoint: str  # its inbox, as it advertises it
    last_seen: float  # monotonic seconds
    down_at: float | None = None  # when its connection dropped (dead, whatever its heartbeats said)


Key = tuple[str, int]  # ("stage", j) | ("drafter", 0) | ("spare", k)


class Registry:
    def __init__(self, n: int, timeout_s: float = settings.HEARTBEAT_TIMEOUT_S):
        self.n, self.timeout_s = n, timeout_s
        self.workers: dict[Key, WorkerInfo] = {}
        self.retired: set[str] = set()  # incarnations that lost or left their role: their beats are ignored
        self.assigned: dict[Key, tuple[str, float]] = {}  # role -> (spare endpoint, deadline) on its way
        self._standby_logged: set[str] = set()

    def beat(self, role: str, index: int, incarnation: str, pid: int, endpoint: str = "") -> str:
        """Record a heartbeat. Returns "new" (first holder of the role), "restart" (a new incarnation
        took a role held before), "same", or "ignored" (a retired incarnation, or a second claimant
        while the holder lives — e.g. a restarted pod whose role a spare took: it waits as a standby)."""
        if incarnation in self.retired:
            return "ignored"
        key, now = (role, index), time.monotonic()
        old = self.workers.get(key)
        if old is not None and old.incarnation != incarnation and self._alive(old):
            if incarnation not in self._standby_logged:
                self._standby_logged.add(incarnation)
                log.warning("[register] %s %d pid %d waits: the role is held by pid %d", role, index, pid, old.pid)
            return "ignored"
        if old is not None and old.incarnation == incarnation:
            old.last_seen = now
            if old.down_at is not None and now - old.down_at > self.timeout_s:
                old.down_at = None  # beats kept coming long after the drop: it is alive (a network blip)
            return "same"
        self.workers[key] = WorkerInfo(incarnation, pid, endpoint, now)
        if old is not None:
            self.retired.add(old.incarnation)
        self.assigned.pop(key, None)
        log.info("[register] %s %d incarnation %s pid %d at %s", role, index, incarnation, pid, endpoint)
        return "restart" if old is not None else "new"

    def _alive(self, w: WorkerInfo) -> bool:
        return w.down_at is None and time.monotonic() - w.last_seen < self.timeout_s

    def alive(self, role: str, index: int = 0) -> bool:
        w = self.workers.get((role, index))
        return w is not None and self._alive(w)

    def endpoint_down(self, endpoint: str) -> list[Key]:
        """The connection to `endpoint` dropped: whoever listens there is dead. Returns their keys."""
        keys = [k for k, w in self.workers.items() if w.endpoint == endpoint and w.down_at is None]
        for k in keys:
            self.workers[k].down_at = time.monotonic()
        for role, (spare, _) in list(self.assigned.items()):
            if spare == endpoint:  # the spare died on its way: the role is vacant again
                del self.assigned[role]
        return keys

    def missing(self, need_drafter: bool = True) -> list[str]:
        """Names of required workers not alive now."""
        out = [f"stage {j}" for j in range(1, self.n + 1) if not self.alive("stage", j)]
        if need_drafter and not self.alive("drafter"):
            out.append("drafter")
        return out

    def vacancies(self) -> list[Key]:
        """Roles that lost their worker and have no spare on the way (stages first: they block)."""
        now = time.monotonic()
        roles = [("stage", j) for j in range(1, self.n + 1)] + [("drafter", 0)]
        return [k for k in roles if k in self.workers and not self.alive(*k)
                and not (k in self.assigned and self.assigned[k][1] > now)]

    def take_spare(self, role: Key) -> WorkerInfo | None:
        """An idle live spare, now on its way to `role` (no longer a spare), or None."""
        spares = sorted((k for k, w in self.workers.items() if k[0] == "spare" and self._alive(w)), key=lambda k: k[1])
        if not spares:
            return None
        spare = self.workers.pop(spares[0])
        self.retired.add(spare.incarnation)
        self.assigned[role] = (spare.endpoint, time.monotonic() + ASSIGN_TIMEOUT_S)
        return spare

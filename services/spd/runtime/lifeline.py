"""Children die with their supervisor: a process started by `spd up` exits when its launcher is gone.

The launcher puts its pid in SPD_SUPERVISOR_PID; the child's watchdog (a worker's heartbeat thread,
the orchestrator's main loop) compares it with its current parent pid. Once the launcher has died
(kill -9 included) the child has been re-parented, the two differ, and the child stops itself, so a
killed `spd up` leaves no orphaned cluster behind. Processes started by hand or by Kubernetes have
no supervisor pid and are never affected.
"""

from __future__ import annotations

import os

ENV = "SPD_SUPERVISOR_PID"


def supervisor_gone() -> bool:
    pid = os.environ.get(ENV)
    return pid is not None and pid != "" and os.getppid() != int(pid)

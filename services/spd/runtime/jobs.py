"""A request on its way through the orchestrator: what the gRPC handler and the driver share."""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field

from spd.core.sampling import SamplingParams
from spd.core.stopping import StopRule

log = logging.getLogger(__name__)


@dataclass
class Job:
    rid: str  # request id (client-chosen or generated)
    prompt_ids: list[int]  # templated prompt
    params: SamplingParams  # decoding parameters
    stop: StopRule  # EOS / stop strings / max tokens
    events: "queue.Queue[tuple]" = field(default_factory=queue.Queue)  # ("token", id) / ("done", reason, RequestStats | None) / ("error", code, msg)
    cancelled: threading.Event = field(default_factory=threading.Event)  # set by the handler on cancel/deadline
    submitted: float = field(default_factory=time.monotonic)
    finished: threading.Event = field(default_factory=threading.Event)  # set once "done" / "error" is emitted

    def emit(self, *event) -> None:
        if event[0] in ("done", "error"):
            self.finished.set()
        self.events.put(event)

    def cancel(self) -> None:
        """The client is gone: the driver stops this job at its next step (a no-op once finished)."""
        if not self.finished.is_set() and not self.cancelled.is_set():
            log.info("[cancel] %s: client went away", self.rid)
            self.cancelled.set()

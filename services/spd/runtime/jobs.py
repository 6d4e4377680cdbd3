"""A request on its way through the orchestrator: what the gRPC handler and the driver share."""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field

from spd.core.sampling import SamplingParams
from spd.core.stopping import StopRule


@dataclass
class Job:
    rid: str  # request id (client-chosen or generated)
    prompt_ids: list[int]  # templated prompt
    params: SamplingParams  # decoding parameters
    stop: StopRule  # EOS / stop strings / max tokens
    events: "queue.Queue[tuple]" = field(default_factory=queue.Queue)  # ("token", id) / ("done", reason, stats) / ("error", code, msg)
    cancelled: threading.Event = field(default_factory=threading.Event)  # set by the handler on cancel/deadline
    submitted: float = field(default_factory=time.monotonic)

    def emit(self, *event) -> None:
        self.events.put(event)

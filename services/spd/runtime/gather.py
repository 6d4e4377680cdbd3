"""Gathering a batch: ready work waits a little for the rest of the requests that are decoding.

Each request's tokens reach a worker on their own clock, so without help the requests drift out of
phase and a stage runs many one-token forwards at the price of its fixed batch shape. Stage 1 and
the drafter therefore hold what is ready while fewer requests are ready than are decoding, for at
most `factor` times their own recent compute time (so the wait scales with the hardware: a few ms
on this CPU, well under one on a GPU). Tokens that enter stage 1 together then run through every
stage as one batch. It changes only when work runs, never what it computes (batch invariance).
"""

from __future__ import annotations

from spd import settings

EWMA = 0.2  # weight of the newest compute time in the running estimate


class Gather:
    def __init__(self, factor: float = settings.GATHER):
        self.factor = factor  # 0 turns gathering off
        self.cost_s = 0.0  # running estimate of one compute (forward or draft), seconds
        self._since: float | None = None  # when the work now held first became ready

    def hold_until(self, ready: int, decoding: int, now: float) -> float | None:
        """None: run the ready work now; else hold it until this monotonic time (or until more is ready)."""
        if ready >= decoding or self.factor <= 0 or self.cost_s <= 0:
            self._since = None
            return None
        self._since = self._since if self._since is not None else now
        until = self._since + self.factor * self.cost_s
        if now >= until:
            self._since = None
            return None
        return until

    def observe(self, seconds: float) -> None:
        """One compute took `seconds`."""
        self.cost_s = seconds if self.cost_s <= 0 else (1 - EWMA) * self.cost_s + EWMA * seconds

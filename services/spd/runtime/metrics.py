"""Prometheus metrics of the orchestrator (served on --metrics-port)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

_MS = (0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 5000)

REQUESTS = Counter("spd_requests_total", "Generate calls by outcome", ["outcome"])
CYCLES = Counter("spd_cycles_total", "Lockstep pipeline cycles (K)")
COMMITS = Counter("spd_commits_total", "Committed tokens (N)")
ACCEPTS = Counter("spd_accepts_total", "Judgements that accepted the draft")
REJECTS = Counter("spd_rejects_total", "Judgements that rejected the draft")
FLUSHES = Counter("spd_flushes_total", "Pipeline flushes (reject, no-draft reseed)")
RECOVERIES = Counter("spd_recoveries_total", "Re-prefills after a worker fault")
MALFORMED = Counter("spd_malformed_frames_total", "Dropped malformed frames at the orchestrator")
QUEUE = Gauge("spd_queue_depth", "Requests waiting")
RUNNING = Gauge("spd_running_requests", "Requests decoding now")
BATCH = Histogram("spd_stage_batch_size", "Tokens per stage forward, as seen by each exiting token",
                  buckets=(1, 2, 3, 4, 6, 8, 12, 16, 32, 64))
CYCLE_MS = Histogram("spd_cycle_ms", "Time between consecutive commits after an accept (one cycle)", buckets=_MS)
PHASE_MS = Histogram("spd_phase_ms", "Per-phase time per cycle", ["phase"], buckets=_MS)

"""Prometheus metrics of the orchestrator (served on --metrics-port)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

_SECONDS = (1e-4, 2.5e-4, 5e-4, 1e-3, 2e-3, 5e-3, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 5)  # Prometheus: base units
_LATENCY = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)  # whole-request latencies

REQUESTS = Counter("spd_requests_total", "Generate calls by outcome", ["outcome"])
CYCLES = Counter("spd_cycles_total", "Lockstep pipeline cycles (K)")
COMMITS = Counter("spd_commits_total", "Committed tokens (N): the generation token counter")
PROMPT_TOKENS = Counter("spd_prompt_tokens_total", "Prompt tokens of the requests admitted")
ACCEPTS = Counter("spd_accepts_total", "Judgements that accepted the draft")
REJECTS = Counter("spd_rejects_total", "Judgements that rejected the draft")
FLUSHES = Counter("spd_flushes_total", "Pipeline flushes (reject, no-draft reseed)")
RECOVERIES = Counter("spd_recoveries_total", "Re-prefills after a worker fault")
HEARTBEATS = Counter("spd_worker_heartbeats_total", "HELLOs and heartbeats received from the workers")
MALFORMED = Counter("spd_malformed_frames_total", "Dropped malformed frames at the orchestrator")
QUEUE = Gauge("spd_queue_depth", "Requests waiting")
RUNNING = Gauge("spd_running_requests", "Requests decoding now")
BATCH = Histogram("spd_stage_batch_size", "Tokens per stage forward, as seen by each exiting token",
                  buckets=(1, 2, 3, 4, 6, 8, 12, 16, 32, 64))
CYCLE = Histogram("spd_cycle_seconds", "Time between consecutive commits after an accept (one cycle)", buckets=_SECONDS)
PHASE = Histogram("spd_phase_seconds", "Per-phase time per cycle", ["phase"], buckets=_SECONDS)
TTFT = Histogram("spd_time_to_first_token_seconds", "Submission to the first token (queue included)", buckets=_LATENCY)
E2E = Histogram("spd_e2e_request_latency_seconds", "Submission to the last token, finished requests", buckets=_LATENCY)
QUEUE_TIME = Histogram("spd_request_queue_time_seconds", "Submission to admission into a slot", buckets=_LATENCY)
INTER_TOKEN = Histogram("spd_inter_token_latency_seconds", "Time between a request's consecutive tokens",
                        buckets=_SECONDS)


def serve(port: int, host: str) -> None:
    """Prometheus text on GET /metrics (404 on any other path), from a daemon thread."""
    import threading
    from http.server import ThreadingHTTPServer

    from prometheus_client import MetricsHandler

    class Handler(MetricsHandler):
        def do_GET(self):
            if self.path.split("?")[0] != "/metrics":
                self.send_error(404, "only /metrics is served here")
                return
            super().do_GET()

        def log_message(self, *args):  # no access log on stderr
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()

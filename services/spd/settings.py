"""The service's defaults and environment variables, in one place: CLI flags, the config
dataclasses (launcher, orchestrator, driver) and the Kubernetes manifests take them from here.
No torch, no I/O: importing it is free."""

from __future__ import annotations

import os

GRPC_PORT = 50051  # the orchestrator's public gRPC API
GRPC_ADDRESS = f"127.0.0.1:{GRPC_PORT}"  # where the local tools look for it
QUEUE_SIZE = 16  # requests waiting for a slot; one more is RESOURCE_EXHAUSTED
WORKER_WAIT_S = 60.0  # a request waits this long for a missing worker, then fails UNAVAILABLE
DRAFT_WAIT_S = 2.0  # a judgement waits this long for its draft before the target decides alone
PROGRESS_TIMEOUT_S = 20.0  # a request that commits nothing this long (plus its prefill allowance) is recovered
PREFILL_ALLOWANCE_S = 0.05  # ... allowance per prompt token (a prefill on a slow CPU)
MAX_RECOVERIES = 3  # per request; one more fault fails it UNAVAILABLE
HEARTBEAT_S = 0.5  # workers' heartbeat period
GATHER = 2.0  # stage 1 and the drafter wait at most this many recent compute times for the rest of a batch
HEARTBEAT_TIMEOUT_S = 2.0  # a worker silent this long is down (a dropped connection is noticed at once)

# Environment variables (each is also a flag where one exists)
ENV_LOG_LEVEL = "SPD_LOG_LEVEL"  # logging level of every spd process
ENV_TOKEN = "SPD_TOKEN"  # the API's bearer token (server: required; clients: sent)
ENV_CACHE = "SPD_CACHE"  # converted models and other caches (default ~/.cache/spd)
ENV_TOPOLOGY = "SPD_TOPOLOGY"  # the pipeline's topology JSON, or @file

CLI_LOG_LEVEL = "WARNING"  # an interactive command: quiet unless asked
WORKER_LOG_LEVEL = "INFO"  # processes `spd up` starts: their logs are the record of what happened


def log_level(default: str) -> str:
    return os.environ.get(ENV_LOG_LEVEL, default).upper()


def token() -> str | None:
    return os.environ.get(ENV_TOKEN) or None

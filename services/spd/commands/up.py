"""`spd up`: start a supervised local pipeline (all processes on this machine)."""

from __future__ import annotations

from pathlib import Path

from spd.core.schedule import SCHEDULES
from spd.runtime.launcher import Cluster, ClusterConfig
from spd import settings
from spd.runtime.gather import GATHER


def add_parser(sub) -> None:
    p = sub.add_parser("up", help="start n stages, the drafter and the orchestrator locally")
    p.add_argument("--n", type=int, default=5, help="pipeline stages, one process each (default 5)")
    p.add_argument("--port", type=int, default=settings.GRPC_PORT, help="orchestrator gRPC port")
    p.add_argument("--model", help="model directory (default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--draft", help="PDM directory ('random' for an untrained one; default: the shipped one)")
    p.add_argument("--split", default="uniform", help="uniform | balanced | boundaries '0,6,...,L' (default uniform)")
    p.add_argument("--devices", default="", help="comma-separated: one per stage, then the drafter, then "
                   "optionally one per spare (default: cpu; spares: the drafter's)")
    p.add_argument("--schedule", choices=SCHEDULES, default="pre",
                   help="draft before (pre) or after (post) each cycle's verification (default pre)")
    p.add_argument("--state-file", type=Path, help="write role -> pid/address JSON here")
    p.add_argument("--metrics-port", type=int, default=0, help="Prometheus /metrics port (default 0: off)")
    p.add_argument("--worker-wait", type=float, default=settings.WORKER_WAIT_S, help="seconds a request waits for a missing stage "
                   "before UNAVAILABLE")
    p.add_argument("--log-dir", type=Path, help="one log file per process (default: this terminal)")
    p.add_argument("--max-concurrency", type=int, default=1, help="requests decoding at once, sharing every stage "
                   "forward (more pads each single-token forward to this many rows)")
    p.add_argument("--gather", type=float, default=GATHER, help="with several requests decoding, stage 1 and the "
                   "drafter hold ready work for at most this many of their recent compute times, so the requests run "
                   "through the stages as one batch (0 = off)")
    p.add_argument("--http-port", type=int, default=0, help="also serve the OpenAI-compatible HTTP API on this port "
                   "(`spd http`; 0: none)")
    p.add_argument("--spares", type=int, default=0, help="warm spare workers that take over a dead stage or drafter "
                   "in about a second (0: a dead worker is restarted, which takes several seconds)")
    p.set_defaults(run=run)


def run(args) -> int:
    from spd.commands import UsageError
    from spd.core.split import check_width
    from spd.models.loading import load_config, resolve_model

    devices = [d for d in args.devices.split(",") if d]
    if devices and not args.n <= len(devices) <= args.n + 1 + args.spares:
        raise UsageError(f"--devices needs {args.n} to {args.n + 1 + args.spares} entries, got {len(devices)}")
    if not 1 <= args.max_concurrency <= 64:
        raise UsageError(f"--max-concurrency must be in 1..64, got {args.max_concurrency}")
    if not 0 <= args.spares <= 16:
        raise UsageError(f"--spares must be in 0..16, got {args.spares}")
    if not 0 <= args.http_port <= 65535 or args.http_port == args.port:
        raise UsageError(f"--http-port must be in 0..65535 and not the gRPC port, got {args.http_port}")
    if not 1 <= args.port <= 65535:
        raise UsageError(f"--port must be in 1..65535, got {args.port}")
    try:  # before any process starts: a bad width would otherwise crash-loop every stage
        check_width(args.n, load_config(resolve_model(args.model)).num_hidden_layers)
    except (ValueError, FileNotFoundError) as e:
        raise UsageError(f"--n/--model: {e}") from None
    cfg = ClusterConfig(args.n, args.port, args.model, args.draft, args.split, devices, args.schedule,
                        args.state_file, args.metrics_port, args.log_dir, spares=args.spares, max_concurrency=args.max_concurrency,
                        gather=args.gather,
                        http_port=args.http_port, worker_wait_s=args.worker_wait)
    return Cluster(cfg).run()

"""`spd up`: start a supervised local pipeline (all processes on this machine)."""

from __future__ import annotations

from spd.config import ClusterConfig, add_flags, from_args
from spd.core.schedule import SCHEDULES
from spd.runtime.launcher import Cluster

FLAGS = ("n", "port", "model", "draft", "split", "devices", "schedule", "state_file", "metrics_port", "worker_wait_s",
         "log_dir", "max_concurrency", "gather", "http_port", "spares")  # the ClusterConfig fields `spd up` exposes


def add_parser(sub) -> None:
    p = sub.add_parser("up", help="start n stages, the drafter and the orchestrator locally")
    add_flags(p, ClusterConfig, only=FLAGS, aliases={"worker_wait_s": "--worker-wait"},
              choices={"schedule": SCHEDULES})
    p.set_defaults(run=run)


def run(args) -> int:
    from spd.commands import UsageError
    from spd.core.split import check_width
    from spd.models.loading import load_config, resolve_model

    cfg = from_args(ClusterConfig, args)
    if cfg.devices and not cfg.n <= len(cfg.devices) <= cfg.n + 1 + cfg.spares:
        raise UsageError(f"--devices needs {cfg.n} to {cfg.n + 1 + cfg.spares} entries, got {len(cfg.devices)}")
    if not 1 <= cfg.max_concurrency <= 64:
        raise UsageError(f"--max-concurrency must be in 1..64, got {cfg.max_concurrency}")
    if not 0 <= cfg.spares <= 16:
        raise UsageError(f"--spares must be in 0..16, got {cfg.spares}")
    if not 0 <= cfg.http_port <= 65535 or cfg.http_port == cfg.port:
        raise UsageError(f"--http-port must be in 0..65535 and not the gRPC port, got {cfg.http_port}")
    if not 1 <= cfg.port <= 65535:
        raise UsageError(f"--port must be in 1..65535, got {cfg.port}")
    try:  # before any process starts: a bad width would otherwise crash-loop every stage
        check_width(cfg.n, load_config(resolve_model(cfg.model)).num_hidden_layers)
    except (ValueError, FileNotFoundError) as e:
        raise UsageError(f"--n/--model: {e}") from None
    return Cluster(cfg).run()

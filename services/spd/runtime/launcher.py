"""`spd up`: a whole pipeline on this machine — n stages, the drafter and the orchestrator as
separate processes, supervised (a crashed worker is restarted with backoff), with a state file
(role -> pid, address) and a single `ready` line once every process is healthy.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from spd.runtime.health import check
from spd.runtime.topology import free_ports, local_topology

log = logging.getLogger(__name__)
START_WINDOW_S = 20.0  # an error exit this soon after a spawn is a start failure


@dataclass
class ClusterConfig:
    n: int = 5  # pipeline stages
    port: int = 50051  # orchestrator gRPC port (0 = pick a free one)
    model: str | None = None  # model directory; None = embedded default
    draft: str | None = None  # PDM directory; None = shipped for this model, 'random' = untrained
    split: str = "uniform"  # stage split spec
    devices: list[str] = field(default_factory=list)  # one per stage then the drafter; empty = all cpu
    schedule: str = "pre"  # pre | post
    state_file: Path | None = None  # where to write role -> pid/address
    metrics_port: int = 0  # orchestrator Prometheus port; 0 = off
    log_dir: Path | None = None  # per-process logs (default: inherit stderr)
    extra_drafter_args: list[str] = field(default_factory=list)  # e.g. ["--script", "..."] (tests)
    extra_stage_args: list[str] = field(default_factory=list)  # e.g. ["--zero-compute"] (benchmarks)
    queue_size: int = 16  # orchestrator: requests waiting beyond the running one
    extra_orchestrator_args: list[str] = field(default_factory=list)  # e.g. ["--token", "..."]
    worker_wait_s: float = 60.0  # orchestrator: how long a request waits for a missing stage
    ready_timeout_s: float = 300.0  # give up if not healthy by then
    max_start_failures: int = 5  # a worker failing at start this many times in a row stops the launcher


@dataclass
class Proc:
    role: str  # "stage-J", "drafter", "orchestrator"
    argv: list[str]
    health: str  # host:port of its grpc health service
    popen: subprocess.Popen | None = None
    restarts: int = 0
    next_start: float = 0.0
    spawned_at: float = 0.0  # monotonic time of the last spawn
    start_failures: int = 0  # consecutive error exits soon after spawn (a crash loop, e.g. bad config)


class CrashLoop(RuntimeError):
    """A worker keeps exiting with an error right after it starts: restarting cannot help."""


class Cluster:
    def __init__(self, cfg: ClusterConfig):
        self.cfg = cfg
        # Every port in one draw, so no two of them can collide; port 0 = pick the gRPC port too.
        ports = free_ports(2 * cfg.n + 4)
        if not cfg.port:
            cfg.port = ports.pop()
        self.topology = local_topology(cfg.n, ports=ports[: cfg.n + 2])
        self._health_ports = ports[cfg.n + 2: 2 * cfg.n + 3]
        self.procs = self._plan()
        self.stop = False

    def _plan(self) -> list[Proc]:
        cfg, topo = self.cfg, self.topology
        ports = self._health_ports
        common = ["--topology", topo.to_json(), "--split", cfg.split]
        if cfg.model:
            common += ["--model", cfg.model]
        if cfg.draft:
            common += ["--draft", cfg.draft]
        devices = cfg.devices or ["cpu"] * (cfg.n + 1)
        procs = [Proc(f"stage-{j}", ["stage", "--index", str(j), "--of", str(cfg.n), "--device", devices[j - 1],
                                     "--health-port", str(ports[j - 1])] + common + cfg.extra_stage_args,
                      f"127.0.0.1:{ports[j - 1]}")
                 for j in range(1, cfg.n + 1)]
        procs.append(Proc("drafter", ["drafter", "--device", devices[min(cfg.n, len(devices) - 1)],
                                      "--health-port", str(ports[cfg.n])] + common + cfg.extra_drafter_args,
                          f"127.0.0.1:{ports[cfg.n]}"))
        orch = ["orchestrator", "--topology", topo.to_json(), "--port", str(cfg.port), "--schedule", cfg.schedule,
                "--metrics-port", str(cfg.metrics_port), "--queue-size", str(cfg.queue_size),
                "--worker-wait", str(cfg.worker_wait_s)] + cfg.extra_orchestrator_args + (["--model", cfg.model] if cfg.model else [])
        procs.append(Proc("orchestrator", orch, f"127.0.0.1:{cfg.port}"))
        return procs

    # -- lifecycle ------------------------------------------------------------------------------

    def _spawn(self, p: Proc) -> None:
        out = open(self.cfg.log_dir / f"{p.role}.log", "ab") if self.cfg.log_dir else None
        p.popen = subprocess.Popen([sys.executable, "-m", "spd.cli", "--log-level",
                                    os.environ.get("SPD_LOG_LEVEL", "INFO"), *p.argv],
                                   stdout=out or sys.stderr, stderr=subprocess.STDOUT, start_new_session=True)
        p.spawned_at = time.monotonic()
        log.info("[spawn] %s pid %d", p.role, p.popen.pid)

    def start(self) -> None:
        if self.cfg.log_dir:
            self.cfg.log_dir.mkdir(parents=True, exist_ok=True)
        for p in self.procs:
            self._spawn(p)
        self.write_state()

    def supervise_once(self) -> None:
        """Restart any dead process (exponential backoff, capped at 5 s)."""
        now = time.monotonic()
        for p in self.procs:
            if p.popen is not None and p.popen.poll() is None:
                continue
            if p.popen is not None:
                self._count_start_failure(p, now)
                log.warning("[recover] %s exited with %s; restarting", p.role, p.popen.returncode)
                p.restarts += 1
                p.next_start = now + min(5.0, 0.2 * 2 ** min(p.restarts, 5))
                p.popen = None
            if now >= p.next_start:
                self._spawn(p)
                self.write_state()

    def _count_start_failure(self, p: Proc, now: float) -> None:
        """An error exit (not a signal: kill -9 is a fault to recover from) within START_WINDOW_S of
        the spawn counts; max_start_failures in a row raise CrashLoop."""
        code = p.popen.returncode
        early = code > 0 and now - p.spawned_at < START_WINDOW_S
        p.start_failures = p.start_failures + 1 if early else 0
        if p.start_failures >= self.cfg.max_start_failures:
            raise CrashLoop(f"{p.role} exited with {code} within {START_WINDOW_S:.0f} s of starting, "
                            f"{p.start_failures} times in a row; see its log" +
                            (f" in {self.cfg.log_dir}" if self.cfg.log_dir else ""))

    def healthy(self) -> bool:
        return all(p.popen is not None and p.popen.poll() is None and check(p.health) for p in self.procs)

    def write_state(self) -> None:
        if not self.cfg.state_file:
            return
        state = {p.role: {"pid": p.popen.pid if p.popen else None, "health": p.health, "restarts": p.restarts}
                 for p in self.procs}
        for j, endpoint in enumerate(self.topology.stages, start=1):
            state[f"stage-{j}"]["zmq"] = endpoint
        state["drafter"]["zmq"] = self.topology.drafter
        state["orchestrator"].update(zmq=self.topology.orchestrator, grpc=f"127.0.0.1:{self.cfg.port}")
        tmp = Path(str(self.cfg.state_file) + ".tmp")
        tmp.write_text(json.dumps(state, indent=1))
        tmp.replace(self.cfg.state_file)

    def shutdown(self, grace_s: float = 5.0) -> None:
        for p in self.procs:
            if p.popen and p.popen.poll() is None:
                p.popen.terminate()
        deadline = time.monotonic() + grace_s
        for p in self.procs:
            if p.popen:
                try:
                    p.popen.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    p.popen.kill()
                    p.popen.wait(5)
        log.info("[stop] cluster down")

    def run(self) -> int:
        """Start, print `ready`, supervise until SIGINT/SIGTERM."""
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        self.start()
        started, announced = time.monotonic(), False
        try:
            while not self.stop:
                try:
                    self.supervise_once()
                except CrashLoop as e:
                    log.error("[recover] giving up: %s", e)
                    return 1
                if not announced and self.healthy():
                    print(f"ready grpc=127.0.0.1:{self.cfg.port} n={self.cfg.n}", flush=True)
                    announced = True
                elif not announced and time.monotonic() - started > self.cfg.ready_timeout_s:
                    log.error("cluster not healthy after %.0f s", self.cfg.ready_timeout_s)
                    return 1
                time.sleep(0.2)
        finally:
            self.shutdown()
        return 0

    def _on_signal(self, signum, frame) -> None:
        self.stop = True

"""`spd up`: a whole pipeline on this machine — n stages, the drafter and the orchestrator as
separate processes, supervised, with a state file (role -> pid, address; the launcher's own pid)
and a single `ready` line once every process is healthy.

Supervision: a process that exits is restarted with backoff; one that stops answering its health
check for `hung_after_s` (SIGSTOP, a wedged host thread) is killed and restarted the same way; one
that keeps failing right at start ends the launcher (CrashLoop). With `spares` > 0 the launcher also
keeps that many warm spare workers (`spd spare`): the orchestrator hands a dead worker's role to one
of them at once, and the launcher starts a new spare in the dead one's place. Children exit by themselves when
the launcher dies (`spd.runtime.lifeline`). The data plane is encrypted and authenticated with a
CurveZMQ key made for this launch (or SPD_CURVE_SECRET), so nothing outside the cluster can inject
frames.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import socket
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import zmq

from spd.runtime import curve, lifeline
from spd.runtime.health import LIVENESS, check
from spd.runtime.topology import free_ports, local_topology
from spd import settings
from spd.config import ClusterConfig

log = logging.getLogger(__name__)
HEALTH_EVERY_S = 1.0  # how often a running process's health is checked


@dataclass
class Proc:
    role: str  # "stage-J", "drafter", "orchestrator", "spare-K" (until the orchestrator assigns it a role)
    argv: list[str]
    health: str  # host:port of its grpc health service
    device: str = "cpu"  # the device it runs on (a spare replacing it gets the same one)
    role_file: Path | None = None  # a spare writes its assigned role here
    http: bool = False  # health is HTTP GET /live at `health` (the HTTP gateway), not grpc.health.v1
    live_service: str = ""  # health service name that says the process answers ("" = overall status)
    popen: subprocess.Popen | None = None
    restarts: int = 0
    next_start: float = 0.0
    spawned_at: float = 0.0  # monotonic time of the last spawn
    start_failures: int = 0  # consecutive error exits before it ever answered (a crash loop, e.g. bad config)
    healthy_at: float | None = None  # monotonic time of its last good health check (None: not yet healthy)
    checked_at: float = 0.0  # monotonic time of its last health check


class CrashLoop(RuntimeError):
    """A worker keeps exiting with an error right after it starts: restarting cannot help."""


class PortInUse(RuntimeError):
    """The gRPC port is taken (another cluster?): a second listener would split its requests."""


def ensure_port_free(port: int, host: str = "127.0.0.1") -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError as e:
            raise PortInUse(f"port {port} is already in use ({e.strerror}); is another `spd up` running?") from None


class Cluster:
    def __init__(self, cfg: ClusterConfig):
        self.cfg = cfg
        # Every port in one draw, so no two of them can collide; port 0 = pick the gRPC port too.
        ports = free_ports(2 * cfg.n + 4 + 2 * cfg.spares)
        if not cfg.port:
            cfg.port = ports.pop()
        self.topology = local_topology(cfg.n, ports=ports[: cfg.n + 2])
        self._health_ports = ports[cfg.n + 2: 2 * cfg.n + 3]
        self._roles_dir = Path(tempfile.mkdtemp(prefix="spd-roles-"))
        self._spares_made = 0
        self.procs = self._plan(ports[2 * cfg.n + 3:])
        self.stop = False
        self.env = dict(os.environ, **{lifeline.ENV: str(os.getpid())})
        if cfg.curve and not self.env.get(curve.ENV):
            self.env[curve.ENV] = zmq.curve_keypair()[1].decode()
        self.curve_secret = self.env.get(curve.ENV)  # for tools that must talk to the data plane (tests)

    def _plan(self, spare_ports: list[int]) -> list[Proc]:
        cfg, topo = self.cfg, self.topology
        ports = self._health_ports
        common = ["--topology", topo.to_json(), "--split", cfg.split, "--max-concurrency", str(cfg.max_concurrency),
                  "--gather", str(cfg.gather)]
        if cfg.model:
            common += ["--model", cfg.model]
        if cfg.draft:
            common += ["--draft", cfg.draft]
        self._common = common
        devices = cfg.devices or ["cpu"] * (cfg.n + 1)
        procs = [Proc(f"stage-{j}", ["stage", "--index", str(j), "--of", str(cfg.n), "--device", devices[j - 1],
                                     "--health-port", str(ports[j - 1])] + common + cfg.extra_stage_args,
                      f"127.0.0.1:{ports[j - 1]}", devices[j - 1])
                 for j in range(1, cfg.n + 1)]
        drafter_device = devices[min(cfg.n, len(devices) - 1)]
        procs.append(Proc("drafter", ["drafter", "--device", drafter_device,
                                      "--health-port", str(ports[cfg.n])] + common + cfg.extra_drafter_args,
                          f"127.0.0.1:{ports[cfg.n]}", drafter_device))
        for k in range(cfg.spares):
            device = devices[cfg.n + 1 + k] if len(devices) > cfg.n + 1 + k else drafter_device
            procs.append(self._spare(device, spare_ports[2 * k: 2 * k + 2]))
        orch = ["orchestrator", "--topology", topo.to_json(), "--port", str(cfg.port), "--schedule", cfg.schedule,
                "--metrics-port", str(cfg.metrics_port), "--queue-size", str(cfg.queue_size),
                "--worker-wait", str(cfg.worker_wait_s), "--max-concurrency", str(cfg.max_concurrency),
                "--draft", cfg.draft or "shipped"] + \
            cfg.extra_orchestrator_args + (["--model", cfg.model] if cfg.model else [])
        procs.append(Proc("orchestrator", orch, f"127.0.0.1:{cfg.port}", live_service=LIVENESS))
        if cfg.http_port:
            http = ["http", "--grpc", f"127.0.0.1:{cfg.port}", "--port", str(cfg.http_port)]
            procs.append(Proc("http", http + (["--model", cfg.model] if cfg.model else []),
                              f"127.0.0.1:{cfg.http_port}", http=True))
        return procs

    def _spare(self, device: str, ports: list[int] | None = None) -> Proc:
        """A new warm spare (`spd spare`) on `device`, listening on fresh ports."""
        self._spares_made += 1
        k = self._spares_made
        inbox, health = ports or free_ports(2)
        role_file = self._roles_dir / f"spare-{k}"
        argv = ["spare", "--endpoint", f"tcp://127.0.0.1:{inbox}", "--spare-id", str(k), "--role-file", str(role_file),
                "--device", device, "--health-port", str(health)] + self._common + self.cfg.extra_stage_args + \
            self.cfg.extra_drafter_args
        return Proc(f"spare-{k}", argv, f"127.0.0.1:{health}", device, role_file=role_file)

    # -- lifecycle ------------------------------------------------------------------------------

    def _spawn(self, p: Proc) -> None:
        argv = [sys.executable, "-m", "spd.cli", "--log-level", settings.log_level(settings.WORKER_LOG_LEVEL), *p.argv]
        out = open(self.cfg.log_dir / f"{p.role}.log", "ab") if self.cfg.log_dir else None
        try:
            p.popen = subprocess.Popen(argv, stdout=out or sys.stderr, stderr=subprocess.STDOUT, start_new_session=True,
                                       env=self.env)
        finally:
            if out:
                out.close()  # the child holds its own copy
        p.spawned_at = time.monotonic()
        p.healthy_at = None
        log.info("[spawn] %s pid %d", p.role, p.popen.pid)

    def start(self) -> None:
        ensure_port_free(self.cfg.port)
        if self.cfg.http_port:
            ensure_port_free(self.cfg.http_port)
        if self.cfg.log_dir:
            self.cfg.log_dir.mkdir(parents=True, exist_ok=True)
        for p in self.procs:
            self._spawn(p)
        self.write_state()

    def supervise_once(self) -> None:
        """Restart any dead process (exponential backoff, capped at 5 s); kill a hung one. With
        spares, a dead worker is replaced by a new spare instead: the orchestrator has already given
        its role to a spare that was ready."""
        now = time.monotonic()
        for i, p in enumerate(self.procs):
            if p.popen is not None and p.popen.poll() is None:
                self._adopt_role(p)
                self._watch_health(p, now)
                continue
            if p.popen is not None:
                self._count_start_failure(p, now)
                replace = self.cfg.spares and p.role not in ("orchestrator", "http")  # a worker: spares take its role
                log.warning("[recover] %s exited with %s; %s", p.role, p.popen.returncode,
                            "starting a new spare" if replace else "restarting")
                if replace:
                    p = self.procs[i] = dataclasses.replace(self._spare(p.device), restarts=p.restarts,
                                                            start_failures=p.start_failures)
                p.restarts += 1
                p.next_start = now + min(5.0, 0.2 * 2 ** min(p.restarts, 5))
                p.popen = None
                self.write_state()
            if now >= p.next_start:
                self._spawn(p)
                self.write_state()

    def _adopt_role(self, p: Proc) -> None:
        """A spare that took over a role is known by that role from now on (state file, tools)."""
        if p.role_file is not None and p.role.startswith("spare") and p.role_file.exists():
            role = p.role_file.read_text().strip()
            if role:
                log.info("[recover] %s (pid %s) is now %s", p.role, p.popen.pid if p.popen else "?", role)
                p.role = role
                self.write_state()

    def _watch_health(self, p: Proc, now: float) -> None:
        """A process that was healthy and has not answered for hung_after_s is killed (SIGKILL);
        the next supervise_once restarts it like any dead process."""
        if now - p.checked_at < HEALTH_EVERY_S:
            return
        p.checked_at = now
        assert p.popen is not None, "only running processes are health-checked"
        if _answers(p, timeout=min(1.0, self.cfg.hung_after_s / 2)):
            p.healthy_at = time.monotonic()
        elif p.healthy_at is not None and time.monotonic() - p.healthy_at > self.cfg.hung_after_s:
            log.warning("[recover] %s pid %d has not answered its health check for %.1f s: killing it",
                        p.role, p.popen.pid, time.monotonic() - p.healthy_at)
            p.popen.kill()
            p.popen.wait(5)

    def _count_start_failure(self, p: Proc, now: float) -> None:
        """An error exit (not a signal: kill -9 is a fault to recover from) before the process ever
        answered its health check counts, however long its start took (a loaded 2-core machine can
        take a minute to import torch); max_start_failures in a row raise CrashLoop."""
        assert p.popen is not None
        code = p.popen.returncode
        failed_at_start = code > 0 and p.healthy_at is None
        p.start_failures = p.start_failures + 1 if failed_at_start else 0
        if p.start_failures >= self.cfg.max_start_failures:
            raise CrashLoop(f"{p.role} exited with {code} before it ever answered, {p.start_failures} times "
                            f"in a row ({now - p.spawned_at:.0f} s after the last start); see its log" +
                            (f" in {self.cfg.log_dir}" if self.cfg.log_dir else ""))

    def healthy(self) -> bool:
        return all(p.popen is not None and p.popen.poll() is None and _answers(p, ready=True) for p in self.procs)

    def write_state(self) -> None:
        if not self.cfg.state_file:
            return
        state = {p.role: {"pid": p.popen.pid if p.popen else None, "health": p.health, "restarts": p.restarts}
                 for p in self.procs}
        state["orchestrator"].update(zmq=self.topology.orchestrator, grpc=f"127.0.0.1:{self.cfg.port}")
        state["launcher"] = {"pid": os.getpid()}
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
        shutil.rmtree(self._roles_dir, ignore_errors=True)
        log.info("[stop] cluster down")

    def run(self) -> int:
        """Start, print `ready`, supervise until SIGINT/SIGTERM."""
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        try:
            self.start()
        except PortInUse as e:
            log.error("%s", e)
            return 1
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


def _answers(p: Proc, timeout: float = 1.0, ready: bool = False) -> bool:
    """Liveness (or, with `ready`, readiness) of a process: grpc.health.v1, or HTTP for the gateway."""
    if p.http:
        try:
            with urllib.request.urlopen(f"http://{p.health}/live", timeout=timeout) as r:
                return r.status == 200
        except OSError:
            return False
    return check(p.health, timeout=timeout, service="" if ready else p.live_service)

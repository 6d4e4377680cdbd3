"""Start and stop a real multi-process pipeline (`spd up`'s Cluster) from tests."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

from spd.runtime.launcher import Cluster, ClusterConfig


@contextlib.contextmanager
def running_cluster(log_dir: Path, ready_s: float = 240.0, **kw):
    """Yield a healthy Cluster (processes supervised by the caller via supervise_once)."""
    cfg = ClusterConfig(port=0, log_dir=log_dir, **kw)  # the cluster draws all its ports at once
    cluster = Cluster(cfg)
    cluster.start()
    try:
        def healthy_or_supervised() -> bool:
            if cluster.healthy():
                return True
            cluster.supervise_once()  # restart a worker that died while starting (or raise CrashLoop)
            return False

        wait_for(healthy_or_supervised, ready_s, f"the cluster is healthy (logs in {log_dir})", period_s=0.3)
        yield cluster
    finally:
        cluster.shutdown()


def address(cluster: Cluster) -> str:
    return f"127.0.0.1:{cluster.cfg.port}"


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


@contextlib.contextmanager
def supervised(cluster: Cluster, period_s: float = 0.2):
    """Run the cluster's supervisor (restart dead processes) in a thread, as `spd up` does."""
    import threading

    stop = threading.Event()

    def loop():
        while not stop.wait(period_s):
            cluster.supervise_once()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield cluster
    finally:
        stop.set()
        thread.join(timeout=5)


def data_plane_push(ctx, cluster: Cluster, endpoint: str):
    """A PUSH socket into a worker's inbox holding the cluster's CurveZMQ key (an insider)."""
    import zmq

    from spd.runtime.curve import secure

    sock = secure(ctx.socket(zmq.PUSH), server=False, secret=cluster.curve_secret)
    sock.setsockopt(zmq.LINGER, 2000)
    sock.connect(endpoint)
    return sock


def wait_for(condition, timeout_s: float, what: str, period_s: float = 0.1):
    """Poll `condition()` until it returns something truthy (returned) or the deadline passes.
    The one wait-until-condition helper of the tests: wait on what should happen, never a fixed sleep."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"not within {timeout_s} s: {what}")
        time.sleep(period_s)


def pid_of(cluster: Cluster, role: str) -> int:
    return next(p.popen.pid for p in cluster.procs if p.role == role)


def metric(cluster: Cluster, name: str) -> float:
    """The orchestrator's Prometheus value `name` (summed over labels); needs metrics_port set."""
    import urllib.request

    text = urllib.request.urlopen(f"http://127.0.0.1:{cluster.cfg.metrics_port}/metrics", timeout=10).read().decode()
    return sum(float(line.split()[1]) for line in text.splitlines() if line.split(" ")[0] == name)

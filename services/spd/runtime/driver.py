"""The orchestrator's pipeline driver: runs up to `max_concurrency` requests over the worker processes,
each in its own slot with its own speculation (its tokens in flight, drafts, flushes, epochs).

It owns every ZeroMQ socket of the orchestrator (one thread, no locks): PREFILL to all workers,
then it only listens. Drafts flow drafter -> stage 1 directly; the driver hears of them to judge
later, and judges each token leaving stage n with the shared `Verifier`. Accepts need no message
at all; anything else (reject, no draft) bumps the epoch and broadcasts RESEED. A watchdog and the
heartbeat registry (and the drop of a worker's connection) turn a dead or restarted worker into a
recovery: hand its role to a warm spare if there is one, re-prefill the committed prefix under a
new epoch (with the routes, so every worker sends to the replacement) and continue.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import time
from dataclasses import dataclass

import zmq
from zmq.utils.monitor import recv_monitor_message

from spd import wire
from spd.runtime import metrics, sockets
from spd.runtime.jobs import Job
from spd.runtime.registry import Registry
from spd.runtime.request import Fault, Run, Unavailable
from spd.runtime.topology import Topology
from spd import settings

log = logging.getLogger(__name__)


@dataclass
class DriverConfig:
    vocab_size: int  # target vocabulary (to densify sparse distributions)
    context: int  # the target's context limit
    schedule: str = "pre"  # pre | post: tells the workers s0 and whether a draft precedes each judgement
    queue_size: int = settings.QUEUE_SIZE  # requests waiting for a slot; more -> RESOURCE_EXHAUSTED
    worker_wait_s: float = settings.WORKER_WAIT_S  # how long a request waits for missing workers before UNAVAILABLE
    draft_wait_s: float = settings.DRAFT_WAIT_S  # how long a judgement waits for its draft before the target decides alone
    progress_timeout_s: float = settings.PROGRESS_TIMEOUT_S  # no commit for this long (plus prefill allowance) -> recovery
    max_recoveries: int = settings.MAX_RECOVERIES  # per request; then UNAVAILABLE
    max_concurrency: int = 1  # requests decoding at once, each in its own slot of every worker


class Driver:
    def __init__(self, topology: Topology, cfg: DriverConfig):
        self.topology, self.cfg = topology, cfg
        self.n = topology.n
        self.jobs: "queue.Queue[Job]" = queue.Queue(maxsize=cfg.queue_size)
        self.registry = Registry(self.n)
        # Epochs only grow, across orchestrator restarts too (workers drop anything older).
        self.epoch = wire.next_epoch(0)
        self.stop = threading.Event()
        self.ctx = zmq.Context()
        self.inbox = sockets.inbox(self.ctx, topology.orchestrator)
        self.sockets: dict[str, zmq.Socket] = {}  # endpoint -> PUSH socket to a worker or a spare
        self.monitors: dict[str, zmq.Socket] = {}  # endpoint -> its socket's disconnect events
        self.routes = topology  # where each role listens now (a spare's endpoint once it took over)
        self._set_routes(topology)
        self._restarted = False
        self.runs: dict[int, Run] = {}  # slot -> the request decoding in it

    # -- sockets and routes ---------------------------------------------------------------------

    def _socket(self, endpoint: str) -> zmq.Socket:
        """The PUSH socket to `endpoint`, made on first use, with a monitor that reports its
        disconnects: a killed worker is noticed when its connection drops, not heartbeats later."""
        if endpoint not in self.sockets:
            s = sockets.sender(self.ctx)
            self.monitors[endpoint] = s.get_monitor_socket(zmq.EVENT_DISCONNECTED)
            s.connect(endpoint)
            self.sockets[endpoint] = s
        return self.sockets[endpoint]

    def _close(self, endpoint: str) -> None:
        sock = self.sockets.pop(endpoint)
        sock.disable_monitor()
        self.monitors.pop(endpoint).close(linger=0)
        sock.close(linger=0)

    def _set_routes(self, routes: Topology) -> None:
        """Send to the workers at `routes` from now on; close sockets nobody listens on any more."""
        if routes != self.routes:
            log.info("[route] %s", routes.to_json())
        self.routes = routes
        roles = (*routes.stages, routes.drafter)
        self.peers = [self._socket(e) for e in roles]
        spares = {w.endpoint for k, w in self.registry.workers.items() if k[0] == "spare"}
        for endpoint in [e for e in self.sockets if e not in roles and e not in spares]:
            self._close(endpoint)

    def _check_connections(self) -> None:
        for endpoint, monitor in list(self.monitors.items()):
            while monitor.poll(0):
                if recv_monitor_message(monitor)["event"] != zmq.EVENT_DISCONNECTED:
                    continue
                for role, index in self.registry.endpoint_down(endpoint):
                    log.warning("[recover] %s %d at %s: connection lost", role, index, endpoint)
                if endpoint not in (*self.routes.stages, self.routes.drafter):
                    self._close(endpoint)  # a dead spare: it will not come back at that endpoint
                    break

    def _fill_vacancies(self) -> None:
        """Give each role that lost its worker to an idle warm spare (stages first)."""
        for role, index in self.registry.vacancies():
            spare = self.registry.take_spare((role, index))
            if spare is None:
                return
            routes = self.routes.moved(role, index, spare.endpoint)
            wire.send(self._socket(spare.endpoint), wire.Assign(epoch=self.epoch, role=role, index=index, routes=routes),
                      timeout_ms=100)
            log.warning("[recover] %s %d: spare pid %d at %s takes over", role, index, spare.pid, spare.endpoint)
            self._set_routes(routes)

    def _register(self, beat: wire.Presence) -> None:
        """A HELLO / HEARTBEAT: liveness, restarts, spares, and where a (re)started worker listens."""
        role, index, endpoint = beat.role, beat.index, beat.endpoint
        metrics.HEARTBEATS.inc()
        if role not in ("stage", "drafter", "spare") or (role == "stage" and not 1 <= index <= self.n):
            return
        status = self.registry.beat(role, index, beat.incarnation, beat.pid, endpoint)
        if status == "restart":
            self._restarted = True
        if status in ("new", "restart") and endpoint:
            if role == "spare":
                self._socket(endpoint)  # connected ahead: an ASSIGN goes out at once
            elif endpoint != self.routes.endpoint(role, index):
                self._set_routes(self.routes.moved(role, index, endpoint))

    # -- thread ---------------------------------------------------------------------------------

    def start(self) -> threading.Thread:
        t = threading.Thread(target=self._loop, name="spd-driver", daemon=True)
        t.start()
        return t

    def ready(self) -> bool:
        return not self.registry.missing()

    def _loop(self) -> None:
        try:
            while not self.stop.is_set():
                self._admit(wait_s=0.0 if self.runs else 0.2)
                if self.runs:
                    self._step()
                else:
                    while self._poll(0) is not None:  # idle: heartbeats counted, stale data dropped
                        pass
        finally:
            self.ctx.destroy(linger=0)

    # -- requests -------------------------------------------------------------------------------

    def _admit(self, wait_s: float) -> None:
        """Start queued requests while a slot is free (they join the running ones between steps)."""
        while len(self.runs) < self.cfg.max_concurrency:
            try:
                job = self.jobs.get(timeout=wait_s)
            except queue.Empty:
                return
            wait_s = 0.0
            metrics.QUEUE.set(self.jobs.qsize())
            if job.cancelled.is_set():
                job.emit("done", "cancelled", None)
                continue
            try:
                self._await_workers([job])
            except Unavailable as e:
                self._fail(job, "unavailable", "UNAVAILABLE", str(e))
                continue
            if not self.runs:  # nothing in flight: a restart heard while waiting needs no recovery
                self.take_restart()
            slot = min(set(range(self.cfg.max_concurrency)) - set(self.runs))
            run = self.runs[slot] = Run(self, job, slot)
            metrics.RUNNING.set(len(self.runs))
            self._guard(run, run.start)

    def _step(self) -> None:
        """Handle one message (or a 20 ms timeout) for whichever request it belongs to, then let
        every request judge what it can; a worker fault recovers every request."""
        msg = self._poll(20)
        try:
            if self.take_restart():
                raise Fault("a worker restarted")
            missing = self.registry.missing(need_drafter=False)
            if missing:
                raise Fault(f"{', '.join(missing)} stopped sending heartbeats")
            if isinstance(msg, wire.Error) and self._current_error(msg):
                if wire.plausible_epoch(msg.epoch):  # the recovery's epochs must win over the one that failed
                    self.epoch = max(self.epoch, msg.epoch)
                raise Fault(f"{msg.role} {msg.index} reports a protocol error: {msg.reason}")
            if isinstance(msg, (wire.Draft, wire.Exit)):
                run = self.runs.get(msg.slot)
                if run is not None and msg.rid == run.job.rid and msg.epoch == run.epoch:
                    self._guard(run, run.on_message, msg)
            for run in list(self.runs.values()):
                self._guard(run, run.tick)
        except Fault as e:
            self._recover(str(e))

    def _current_error(self, msg: wire.Error) -> bool:
        """Does a worker's ERROR concern the present (not a message of an epoch already recovered from)?"""
        if msg.compute:  # a compute error: that worker's state is suspect
            return True
        run = self.runs.get(msg.slot)
        return run is not None and msg.epoch >= run.epoch

    def _guard(self, run: "Run", fn, *args) -> None:
        """Run one request's step; an error in it ends that request only (faults propagate)."""
        try:
            fn(*args)
        except Fault:
            raise
        except Unavailable as e:
            self.end(run, "unavailable", ("UNAVAILABLE", str(e)))
        except Exception as e:  # never let one request take the driver down
            log.exception("[fail] request %s", run.job.rid)
            self.end(run, "error", ("INTERNAL", f"internal error: {e}"))

    def end(self, run: "Run", outcome: str, error: tuple[str, str] | None = None) -> None:
        """A request is over (done, cancelled or failed): free its slot everywhere."""
        if self.runs.get(run.slot) is not run:
            return
        del self.runs[run.slot]
        metrics.RUNNING.set(len(self.runs))
        if error:
            self._fail(run.job, outcome, *error)
        else:
            metrics.REQUESTS.labels(outcome).inc()
        self.broadcast(wire.Cancel(rid=run.job.rid, slot=run.slot))

    def _fail(self, job: Job, outcome: str, code: str, message: str) -> None:
        metrics.REQUESTS.labels(outcome).inc()
        log.error("[fail] request %s: %s", job.rid, message)
        job.emit("error", code, message)

    def _recover(self, why: str) -> None:
        """A worker died or stalled: every running request re-prefills its committed prefix."""
        for run in list(self.runs.values()):
            run.stats.recoveries += 1
            metrics.RECOVERIES.inc()
            if run.stats.recoveries > self.cfg.max_recoveries:
                self.end(run, "unavailable", ("UNAVAILABLE", f"pipeline failed {run.stats.recoveries} times: {why}"))
        if not self.runs:
            return
        log.warning("[recover] %s; re-prefilling %d running request(s)", why, len(self.runs))
        try:
            self._await_workers([run.job for run in self.runs.values()])
        except Unavailable as e:
            for run in list(self.runs.values()):
                self.end(run, "unavailable", ("UNAVAILABLE", str(e)))
            return
        # The replacement's HELLO, heard while waiting for it, belongs to this fault: counting it
        # again at the next step made one kill two recoveries.
        self.take_restart()
        for run in list(self.runs.values()):
            self._guard(run, run.reprefill)

    def _await_workers(self, jobs: list[Job]) -> None:
        deadline = time.monotonic() + self.cfg.worker_wait_s
        while self.registry.missing(need_drafter=False):
            if time.monotonic() > deadline or all(job.cancelled.is_set() for job in jobs):
                raise Unavailable(f"pipeline incomplete: {', '.join(self.registry.missing(False))} not running")
            self._poll(100)

    # -- messaging ------------------------------------------------------------------------------

    def broadcast(self, message: wire.Control) -> int:
        """Send a control message to every worker under a new epoch, stamped onto it (the message's
        own epoch is ignored: build it without one). Returns that epoch."""
        self.epoch = wire.next_epoch(self.epoch)
        stamped = dataclasses.replace(message, epoch=self.epoch)
        for sock in self.peers:
            wire.send(sock, stamped, timeout_ms=100)
        return self.epoch

    def _poll(self, timeout_ms: int) -> wire.Message | None:
        """Next data message, consuming every heartbeat before it; None when none came in timeout_ms.

        Heartbeats are drained in a loop, not one per call: n + 1 workers beat every 0.5 s, and an
        idle driver that took one message per wake-up fell behind at n >= 9 (workers looked dead)."""
        self._check_connections()
        self._fill_vacancies()
        deadline = time.monotonic() + timeout_ms / 1e3
        while True:
            wait_ms = max(0, int((deadline - time.monotonic()) * 1e3))
            try:
                msg = wire.recv(self.inbox, wait_ms)
            except wire.WireError as e:
                metrics.MALFORMED.inc()
                log.warning("[drop] malformed frame at the orchestrator: %s", e)
                continue
            if not isinstance(msg, wire.Presence):
                return msg
            self._register(msg)

    def take_restart(self) -> bool:
        restarted, self._restarted = self._restarted, False
        return restarted

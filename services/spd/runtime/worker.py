"""What stage and drafter processes share: sockets, registration, heartbeats, the receive loop.

A worker owns one PULL inbox (bound) and PUSH sockets to its peers (connected; re-connected when a
PREFILL brings new routes because a spare replaced one of them). It registers with
the orchestrator (HELLO with a fresh incarnation id) and sends heartbeats from a thread of its own
(own socket), so a long forward never looks like a death. Malformed frames are
dropped, logged and counted; messages of older epochs are dropped; messages of newer epochs wait
for the control message (PREFILL / RESEED / CANCEL) that opens that epoch. A message that breaks
the protocol (e.g. a KV length that does not match) is reported to the orchestrator (ERROR), which
recovers the pipeline at once.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
import uuid

import zmq

from spd import wire
from spd.runtime import sockets
from spd.runtime.lifeline import supervisor_gone
from spd.runtime.topology import Topology
from spd import settings

log = logging.getLogger(__name__)

POLL_MS = 100  # inbox poll: bounds how late a stop flag is noticed
MAX_PENDING = 4096  # buffered future-epoch / out-of-order messages
MAX_DRAIN = 256  # messages handled before computing what is ready


class Worker:
    role = "worker"
    to_orch: zmq.Socket  # PUSH sockets are made per route by _connect (name -> endpoint in _routes)

    def __init__(self, topology: Topology, endpoint: str, index: int = 0, handover: "Worker | None" = None):
        self.topology, self.endpoint, self.index = topology, endpoint, index
        self.incarnation = uuid.uuid4().hex[:12]
        if handover is None:
            self.ctx = zmq.Context()
            self.inbox = sockets.inbox(self.ctx, endpoint)
        else:  # a spare taking a role: same context, same bound inbox (its endpoint is now this role's)
            self.ctx, self.inbox = handover.ctx, handover.inbox
        self.stop = False
        self.wake_at: float | None = None  # monotonic time to call after_messages even if nothing arrives
        self.dropped = {"malformed": 0, "stale": 0, "overflow": 0, "protocol": 0}
        self._routes_epoch = -1  # epoch of the PREFILL whose routes this worker follows
        self._connected: dict[str, str] = {}  # attribute name of a PUSH socket -> endpoint it is connected to
        self._connect()
        self._beats = threading.Thread(target=self._heartbeat_loop, name="heartbeat", daemon=True)

    def _routes(self) -> dict[str, str]:
        """Attribute name -> endpoint of every PUSH socket this worker sends on (subclasses add theirs)."""
        return {"to_orch": self.topology.orchestrator}

    def _connect(self) -> None:
        """(Re)connect the PUSH sockets whose endpoint is new or changed."""
        for name, endpoint in self._routes().items():
            if self._connected.get(name) == endpoint:
                continue
            if name in self._connected:
                getattr(self, name).close(linger=0)
            setattr(self, name, self._push(endpoint))
            self._connected[name] = endpoint

    def reroute(self, topology: Topology) -> None:
        """Adopt the orchestrator's routes (a spare took a dead worker's place) before running a PREFILL."""
        if topology != self.topology:
            log.info("[route] %s %d: new routes %s", self.role, self.index, topology.to_json())
            self.topology = topology
            self._connect()

    def _push(self, endpoint: str) -> zmq.Socket:
        s = sockets.sender(self.ctx)
        s.connect(endpoint)
        return s

    def send(self, sock: zmq.Socket, message: wire.Message) -> None:
        """The message must name the request: rid, epoch, slot, pos (each worker keeps them per slot)."""
        if not wire.send(sock, message, timeout_ms=2000):
            log.warning("[send] %s to a peer timed out (peer down?)", message.kind)

    def run(self) -> None:
        """Loop until SIGTERM/SIGINT; the handlers only set a flag."""
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        log.info("[start] %s %d incarnation %s pid %d", self.role, self.index, self.incarnation, os.getpid())
        try:
            self._serve()
        finally:
            self.close()

    def _serve(self) -> None:
        """Heartbeats on, then handle inbox messages until the stop flag is set. Everything already
        queued is handled before `after_messages` computes, so inputs of several requests that are
        ready together can run as one batch."""
        self._beats.start()
        while not self.stop:
            msg, handled = self._recv(self._poll_ms()), 0
            while msg is not None:
                self._guarded(self._route_and_handle, msg)
                handled += 1
                msg = self._recv(0) if handled < MAX_DRAIN and not self.stop else None
            if handled or (self.wake_at is not None and time.monotonic() >= self.wake_at):
                self.wake_at = None
                self._guarded(lambda _: self.after_messages(), None)
        self._beats.join(timeout=2 * settings.HEARTBEAT_S)

    def _poll_ms(self) -> int:
        if self.wake_at is None:
            return POLL_MS
        return max(0, min(POLL_MS, int(1e3 * (self.wake_at - time.monotonic()) + 0.999)))

    def _recv(self, timeout_ms: int) -> wire.Message | None:
        try:
            return wire.recv(self.inbox, timeout_ms)
        except wire.WireError as e:
            self.dropped["malformed"] += 1
            log.warning("[drop] malformed message (%s); %d so far", e, self.dropped["malformed"])
            return None

    def _route_and_handle(self, msg: wire.Message) -> None:
        if (isinstance(msg, wire.Prefill) and msg.routes is not None and msg.epoch > self._routes_epoch
                and wire.plausible_epoch(msg.epoch)):
            self.reroute(msg.routes)
            self._routes_epoch = msg.epoch
        self.handle(msg)

    def _guarded(self, fn, msg: wire.Message | None) -> None:
        try:
            fn(msg)
        except (KeyError, TypeError, ValueError, IndexError, RuntimeError) as e:
            self.dropped["protocol"] += 1
            where = f"{msg.kind} slot {msg.slot} pos {msg.pos}" if msg else "compute"
            log.error("[protocol] %s %d dropped %s: %s", self.role, self.index, where, e)
            # Loudly: the orchestrator recovers at once instead of waiting out its progress timeout.
            reason = f"{where}: {e}"[:500]
            if msg is None:
                error = wire.Error(role=self.role, index=self.index, reason=reason, compute=True)
            else:
                error = wire.Error(rid=msg.rid, epoch=msg.epoch, slot=msg.slot, pos=msg.pos, role=self.role,
                                   index=self.index, reason=reason)
            self.send(self.to_orch, error)

    def handle(self, msg: wire.Message) -> None:
        raise NotImplementedError

    def after_messages(self) -> None:
        """Called once the queued messages are handled (stages compute here), and at `wake_at`."""

    def plausible(self, control: wire.Message) -> bool:
        """A control message may open its epoch only if that epoch is not from the far future."""
        if wire.plausible_epoch(control.epoch):
            return True
        self.dropped["protocol"] += 1
        log.warning("[drop] %s %d: %s with epoch %d from the future (forged?)", self.role, self.index, control.kind, control.epoch)
        return False

    def _on_signal(self, signum, frame) -> None:
        self.stop = True

    def _heartbeat_loop(self) -> None:
        sock = self._push(self.topology.orchestrator)
        try:
            beat: type[wire.Presence] = wire.Hello
            while not self.stop:
                if supervisor_gone():
                    log.error("[stop] %s %d: the supervisor that started it is gone; exiting", self.role, self.index)
                    self.stop = True
                    break
                wire.send(sock, beat(role=self.role, index=self.index, incarnation=self.incarnation, pid=os.getpid(),
                                     endpoint=self.endpoint, dropped=dict(self.dropped)), timeout_ms=0)
                beat = wire.Heartbeat
                time.sleep(settings.HEARTBEAT_S)
        finally:
            sock.close(linger=0)

    def close(self) -> None:
        self.stop = True
        if self._beats.is_alive():
            self._beats.join(timeout=2 * settings.HEARTBEAT_S)
        self.ctx.destroy(linger=0)
        log.info("[stop] %s %d", self.role, self.index)

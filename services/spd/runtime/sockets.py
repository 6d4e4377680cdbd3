"""The data plane's ZeroMQ sockets, made in one place: every process uses the same limits, keepalive
and encryption (runtime/curve.py) for its inbox and for the sockets it sends on."""

from __future__ import annotations

import zmq

from spd import wire
from spd.runtime.curve import secure
from spd.runtime.topology import bind_endpoint

SNDHWM = 10_000  # messages a PUSH socket queues for a slow or absent peer before a send times out
HEARTBEAT_IVL_MS = 1000  # ZMTP pings: a peer that vanished without closing its connection (node loss)
HEARTBEAT_TIMEOUT_MS = 3000  # ... is dropped after this, not left half-open


def _socket(ctx: zmq.Context, kind: int) -> zmq.Socket:
    s = ctx.socket(kind)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.MAXMSGSIZE, wire.MAX_MESSAGE_BYTES)
    s.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_IVL_MS)
    s.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
    return s


def inbox(ctx: zmq.Context, endpoint: str) -> zmq.Socket:
    """A process's one PULL inbox, bound to `endpoint`."""
    s = secure(_socket(ctx, zmq.PULL), server=True)
    s.bind(bind_endpoint(endpoint))
    return s


def sender(ctx: zmq.Context) -> zmq.Socket:
    """A PUSH socket, not yet connected (the caller may attach a monitor first)."""
    s = secure(_socket(ctx, zmq.PUSH), server=False)
    s.setsockopt(zmq.SNDHWM, SNDHWM)
    return s

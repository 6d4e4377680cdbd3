"""Optional CurveZMQ encryption of the data plane, with one pipeline-wide key.

`spd up` makes a fresh key for each launch and hands it to its processes; elsewhere set
SPD_CURVE_SECRET (a Z85 secret key, e.g. from `python -c "import zmq; print(zmq.curve_keypair()[1].decode())"`)
in every process of a pipeline: every inbox becomes a CURVE server and every sending socket a CURVE
client of the same key pair, so traffic is encrypted and a peer without the key cannot complete
the handshake (there is no per-peer authorisation: the key is the pipeline's shared secret).
"""

from __future__ import annotations

import os

import zmq

ENV = "SPD_CURVE_SECRET"


def secure(sock: zmq.Socket, server: bool, secret: str | None = None) -> zmq.Socket:
    """Turn on CURVE for `sock` (before bind/connect) with `secret`, else SPD_CURVE_SECRET if set."""
    secret = secret or os.environ.get(ENV)
    if not secret:
        return sock
    secret_b = secret.encode()
    public = zmq.curve_public(secret_b)
    sock.curve_secretkey, sock.curve_publickey = secret_b, public
    if server:
        sock.curve_server = True
    else:
        sock.curve_serverkey = public
    return sock

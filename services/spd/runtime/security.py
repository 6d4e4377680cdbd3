"""Optional protection of the public gRPC port: TLS and a bearer token.

The ZeroMQ data plane binds loopback in the local launcher; in Kubernetes a NetworkPolicy keeps it
among the pipeline pods.
"""

from __future__ import annotations

import hmac
from pathlib import Path

import grpc


class TokenInterceptor(grpc.ServerInterceptor):
    """Rejects SPD calls without `authorization: Bearer <token>` (health checks stay open)."""

    def __init__(self, token: str):
        self._expected = f"Bearer {token}".encode()

        def deny(request, context):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")

        self._deny = grpc.unary_unary_rpc_method_handler(deny)

    def intercept_service(self, continuation, details):
        if details.method.startswith("/grpc.health."):
            return continuation(details)
        given = dict(details.invocation_metadata).get("authorization", "").encode()
        if hmac.compare_digest(given, self._expected):
            return continuation(details)
        return self._deny


def server_credentials(cert: str, key: str) -> grpc.ServerCredentials:
    return grpc.ssl_server_credentials([(Path(key).read_bytes(), Path(cert).read_bytes())])

"""grpc.health.v1 for every process: workers serve it on their own port, the orchestrator on its API port."""

from __future__ import annotations

from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
LIVENESS = "liveness"  # service name that is SERVING while the process itself answers (liveness probes)


def add_health(server: grpc.Server) -> health.HealthServicer:
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    servicer.set("", NOT_SERVING)
    return servicer


def start_health_server(port: int, host: str = "127.0.0.1") -> tuple[grpc.Server, health.HealthServicer]:
    """A standalone health server (workers). Returns (server, servicer); set status via servicer.set."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = add_health(server)
    server.add_insecure_port(f"{host}:{port}")
    server.start()
    return server, servicer


def check(address: str, timeout: float = 1.0, service: str = "") -> bool:
    """Is `service` ("" = the process's overall status) at address SERVING?"""
    try:
        with grpc.insecure_channel(address) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
            return reply.status == SERVING
    except grpc.RpcError:
        return False

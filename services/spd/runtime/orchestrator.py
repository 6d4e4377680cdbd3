"""The orchestrator process: gRPC API + health + metrics in front of the pipeline driver."""

from __future__ import annotations

import logging
import signal
import threading
from concurrent import futures
from dataclasses import dataclass

import grpc

from spd.api.validation import Limits
from spd.core.stopping import eos_ids_of
from spd.models.loading import load_config, load_tokenizer, resolve_model
from spd.runtime.driver import Driver, DriverConfig
from spd.runtime import metrics
from spd.runtime.health import LIVENESS, NOT_SERVING, SERVING, add_health
from spd.runtime.lifeline import supervisor_gone
from spd.runtime.security import TokenInterceptor, server_credentials
from spd.runtime.servicer import SPDServicer
from spd.runtime.topology import Topology
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection

from spd_client.v1 import spd_pb2, spd_pb2_grpc
from spd import settings

log = logging.getLogger(__name__)

SERVICE = spd_pb2.DESCRIPTOR.services_by_name["SPD"].full_name  # "spd.v1.SPD"


@dataclass
class OrchestratorConfig:
    topology: Topology  # where the workers listen
    model: str | None = None  # model directory or None for the default (tokenizer, config)
    port: int = settings.GRPC_PORT  # gRPC API port
    host: str = "127.0.0.1"  # gRPC bind address ("0.0.0.0" in pods)
    metrics_port: int = 0  # Prometheus endpoint; 0 = off
    schedule: str = "pre"  # staircase schedule: pre | post
    queue_size: int = settings.QUEUE_SIZE  # requests waiting for a slot
    max_concurrency: int = 1  # requests decoding at once (the stages' --max-concurrency must match)
    max_tokens: int = 4096  # largest max_tokens a request may ask for
    worker_wait_s: float = settings.WORKER_WAIT_S  # a request fails UNAVAILABLE if a stage stays missing this long
    tls_cert: str | None = None  # PEM certificate: serve gRPC over TLS (with tls_key)
    tls_key: str | None = None  # PEM private key
    token: str | None = None  # require "authorization: Bearer <token>" on SPD calls
    draft: str = "shipped"  # what the drafter runs, as GetInfo reports it (a PDM directory, shipped, random)


def serve(cfg: OrchestratorConfig) -> None:
    model_dir = resolve_model(cfg.model)
    config, tokenizer = load_config(model_dir), load_tokenizer(model_dir)
    driver = Driver(cfg.topology, DriverConfig(config.vocab_size, config.max_position_embeddings, cfg.schedule,
                                               cfg.queue_size, worker_wait_s=cfg.worker_wait_s,
                                               max_concurrency=cfg.max_concurrency))
    driver_thread = driver.start()
    interceptors = [TokenInterceptor(cfg.token)] if cfg.token else []
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=cfg.queue_size + cfg.max_concurrency + 8), interceptors=interceptors,
                         options=[("grpc.max_receive_message_length", 4 << 20),
                                  ("grpc.so_reuseport", 0)])  # a second server on this port fails, not shares it
    limits = Limits(max_tokens=cfg.max_tokens)
    info = spd_pb2.Info(model=model_dir.name, n=cfg.topology.n, context_length=config.max_position_embeddings,
                        max_tokens=limits.max_tokens, default_max_tokens=limits.default_max_tokens,
                        queue_size=cfg.queue_size, max_concurrency=cfg.max_concurrency, schedule=cfg.schedule,
                        draft=cfg.draft)
    spd_pb2_grpc.add_SPDServicer_to_server(SPDServicer(driver, tokenizer, eos_ids_of(tokenizer, config), limits, info),
                                           server)
    health = add_health(server)
    health.set(LIVENESS, SERVING)  # the process answers: what a liveness probe asks (not pipeline readiness)
    reflection.enable_server_reflection((SERVICE, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                                         reflection.SERVICE_NAME), server)
    if bool(cfg.tls_cert) != bool(cfg.tls_key):
        raise SystemExit("spd orchestrator: --tls-cert and --tls-key go together")
    if cfg.tls_cert and cfg.tls_key:
        server.add_secure_port(f"{cfg.host}:{cfg.port}", server_credentials(cfg.tls_cert, cfg.tls_key))
    else:
        server.add_insecure_port(f"{cfg.host}:{cfg.port}")
    server.start()
    if cfg.metrics_port:
        metrics.serve(cfg.metrics_port, cfg.host)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    log.info("[start] orchestrator on %s:%d for %d stages", cfg.host, cfg.port, cfg.topology.n)
    try:
        while not stop.wait(0.5):
            status = SERVING if driver.ready() else NOT_SERVING
            health.set("", status)
            health.set(SERVICE, status)  # clients that check the service by name get the same answer
            if supervisor_gone():
                log.error("[stop] orchestrator: the supervisor that started it is gone; exiting")
                break
    finally:
        health.set("", NOT_SERVING)
        health.set(SERVICE, NOT_SERVING)
        server.stop(grace=2).wait(5)
        driver.stop.set()
        driver_thread.join(timeout=5)
        log.info("[stop] orchestrator")

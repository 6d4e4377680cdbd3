"""The orchestrator process: gRPC API + health + metrics in front of the pipeline driver."""

from __future__ import annotations

import logging
import signal
import threading
from concurrent import futures

import grpc

from spd.api.validation import Limits
from spd.config import OrchestratorConfig
from spd.core.stopping import eos_ids_of
from spd.models.loading import load_config, load_tokenizer, resolve_model
from spd.runtime.driver import Driver, DriverConfig
from spd.runtime import metrics
from spd.runtime.health import LIVENESS, NOT_SERVING, SERVING, add_health
from spd.runtime.lifeline import supervisor_gone
from spd.runtime.security import TokenInterceptor, server_credentials
from spd.runtime.servicer import SPDServicer
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection

from spd_client.v1 import spd_pb2, spd_pb2_grpc

log = logging.getLogger(__name__)

SERVICE = spd_pb2.DESCRIPTOR.services_by_name["SPD"].full_name  # "spd.v1.SPD"


def serve(cfg: OrchestratorConfig) -> None:
    model_dir = resolve_model(cfg.model)
    config, tokenizer = load_config(model_dir), load_tokenizer(model_dir)
    driver = Driver(cfg.topology, DriverConfig(vocab_size=config.vocab_size, context=config.max_position_embeddings,
                                               schedule=cfg.schedule, queue_size=cfg.queue_size,
                                               worker_wait_s=cfg.worker_wait_s, max_concurrency=cfg.max_concurrency))
    driver_thread = driver.start()
    interceptors = [TokenInterceptor(cfg.token)] if cfg.token else []
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=cfg.queue_size + cfg.max_concurrency + 8), interceptors=interceptors,
                         options=[("grpc.max_receive_message_length", 4 << 20),
                                  ("grpc.so_reuseport", 0)])  # a second server on this port fails, not shares it
    try:
        limits = Limits(max_tokens=cfg.max_tokens, default_max_tokens=cfg.default_max_tokens)
    except ValueError as e:
        raise SystemExit(f"spd orchestrator: {e}") from None
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

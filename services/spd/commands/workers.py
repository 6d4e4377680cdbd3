"""`spd stage`, `spd drafter`, `spd orchestrator`: the processes of a pipeline (one device each)."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import re
import socket
from pathlib import Path
from typing import Any

from spd.config import OrchestratorConfig, WorkerConfig, add_flags, from_args
from spd.core.schedule import SCHEDULES
from spd.runtime.topology import Topology
from spd import settings

log = logging.getLogger(__name__)


COMMON = ("topology", "model", "split", "draft", "device", "dtype", "threads", "health_port", "health_host",
          "max_concurrency", "gather")  # WorkerConfig fields every worker takes
DRAFTER = ("ls", "script", "script_wrong_every")  # ... and those of a drafter


def _flags(p: argparse.ArgumentParser, *groups: tuple[str, ...]) -> None:
    add_flags(p, WorkerConfig, only=[f for g in groups for f in g], choices={"dtype": ("float32", "bfloat16", "float16")})


def add_parser(sub) -> None:
    st = sub.add_parser("stage", help="run pipeline stage J of N")
    st.add_argument("--index", type=int, help="1-based stage index (default: $SPD_STAGE_INDEX, else in a Kubernetes "
                    "StatefulSet pod the ordinal of its hostname + 1: spd-stage-3 -> 4)")
    st.add_argument("--of", type=int, required=True, help="number of stages n")
    _flags(st, COMMON, ("zero_compute",))
    st.set_defaults(run=run_stage)
    dr = sub.add_parser("drafter", help="run the drafter (PDM)")
    _flags(dr, COMMON, DRAFTER)
    dr.set_defaults(run=run_drafter)
    sp = sub.add_parser("spare", help="run a warm spare worker: takes a stage's or the drafter's role when assigned")
    sp.add_argument("--endpoint", required=True, help="this process's own ZMQ inbox, e.g. tcp://10.0.0.7:5600")
    sp.add_argument("--spare-id", type=int, default=0, help="a number naming this spare in logs and heartbeats")
    sp.add_argument("--role-file", type=Path, help="write the assigned role here (used by `spd up`)")
    _flags(sp, COMMON, DRAFTER, ("zero_compute",))  # whichever role it is given
    sp.set_defaults(run=run_spare)
    orch = sub.add_parser("orchestrator", help="run the gRPC orchestrator")
    orch.add_argument("--topology", help="JSON (or @file); default $SPD_TOPOLOGY")
    add_flags(orch, OrchestratorConfig, skip=("topology",), aliases={"worker_wait_s": "--worker-wait"},
              choices={"schedule": SCHEDULES})
    orch.set_defaults(token=settings.token())
    orch.set_defaults(run=run_orchestrator)


def stage_index(arg: int | None, env=os.environ) -> int:
    """The stage index: --index, else $SPD_STAGE_INDEX, else (in a pod) the StatefulSet ordinal + 1.

    The hostname is used only inside Kubernetes ($KUBERNETES_SERVICE_HOST is set in every pod), so a
    machine named like "node-3" never picks an index by accident.
    """
    if arg is not None:
        return arg
    if env.get("SPD_STAGE_INDEX"):
        return int(env["SPD_STAGE_INDEX"])
    if env.get("KUBERNETES_SERVICE_HOST"):
        hostname = env.get("HOSTNAME") or socket.gethostname()
        m = re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?-(\d+)", hostname)
        if m:
            return int(m.group(2)) + 1
    raise SystemExit("no stage index: pass --index J, set SPD_STAGE_INDEX, or run in a StatefulSet pod "
                     f"(hostname NAME-ORDINAL, HOSTNAME={env.get('HOSTNAME')!r})")


@dataclasses.dataclass(frozen=True)
class _Setup:
    """What every worker process loads before its role's tensors."""

    topology: Topology  # where every process listens
    model_dir: Path  # the target model
    config: Any  # its HF config
    split: Any  # PipelineSplit: which layers each stage holds
    dtype: Any  # torch dtype of weights and activations


def _setup(cfg: WorkerConfig) -> _Setup:
    import torch  # here, not at import: `spd --help` should not load torch

    from spd.pipeline import make_split
    from spd.models.loading import load_config, resolve_model

    torch.set_num_threads(cfg.threads)
    topology = Topology.from_arg(cfg.topology)
    model_dir = resolve_model(cfg.model)
    config = load_config(model_dir)
    split = make_split(cfg.split, config.num_hidden_layers, topology.n)
    return _Setup(topology, model_dir, config, split, getattr(torch, cfg.dtype))


def _serve_health(cfg: WorkerConfig):
    if not cfg.health_port:
        return None, None
    from spd.runtime.health import start_health_server

    return start_health_server(cfg.health_port, cfg.health_host)


def _serve_worker(worker, server, health) -> int:
    """Mark the process healthy and run the worker loop until it is told to stop."""
    from spd.runtime.health import SERVING

    if health:
        health.set("", SERVING)
    try:
        worker.run()
    finally:
        if server:
            server.stop(0)
    return 0


def _stage(cfg: WorkerConfig, s: _Setup, index: int):
    """Stage `index`'s tensors (or a compute-free stand-in for benchmarks)."""
    from spd.pipeline import anchors_for

    if cfg.zero_compute:
        from spd.runtime.zero_stage import ZeroComputeStage

        return ZeroComputeStage(index, s.topology.n, s.config.hidden_size, s.config.vocab_size, cfg.max_concurrency)
    from spd.core.stage import load_stage

    return load_stage(s.model_dir, s.config, s.split.layers_of(index), anchors_for(cfg.draft, s.model_dir, s.split),
                      cfg.device, s.dtype, rows=cfg.max_concurrency)


def _drafter_state(cfg: WorkerConfig, s: _Setup):
    """The PDM with the target's embedding (or, in tests, a scripted drafter)."""
    from spd.pipeline import load_pdm

    if cfg.script:
        from spd.core.scripted import ScriptedDrafter

        script = [int(t) for t in cfg.script.split(",")]
        return ScriptedDrafter([], s.config.vocab_size, wrong_every=cfg.script_wrong_every, continuation=script,
                               n=s.topology.n)
    from spd.core.drafter import DrafterState
    from spd.core.stage import load_embedding

    pdm = load_pdm(cfg.draft, s.model_dir, s.config, s.split, cfg.ls, cfg.device, s.dtype)
    return DrafterState(pdm, load_embedding(s.model_dir, s.config, cfg.device, s.dtype), s.split, rows=cfg.max_concurrency)


def run_stage(args) -> int:
    from spd.runtime.stage_worker import StageWorker

    args.index = stage_index(args.index)
    cfg = from_args(WorkerConfig, args)
    setup = _setup(cfg)
    n = setup.topology.n
    if args.of != n or not 1 <= args.index <= n:
        raise SystemExit(f"--index {args.index} --of {args.of} does not match a topology of {n} stages")
    server, health = _serve_health(cfg)
    return _serve_worker(StageWorker(setup.topology, args.index, _stage(cfg, setup, args.index), gather=cfg.gather),
                         server, health)


def run_drafter(args) -> int:
    from spd.runtime.drafter_worker import DrafterWorker

    cfg = from_args(WorkerConfig, args)
    setup = _setup(cfg)
    server, health = _serve_health(cfg)
    return _serve_worker(DrafterWorker(setup.topology, _drafter_state(cfg, setup), gather=cfg.gather), server, health)


def run_spare(args) -> int:
    """A warm spare: imports everything now, loads a role's tensors when the orchestrator assigns one."""
    from spd.runtime.drafter_worker import DrafterWorker
    from spd.runtime.spare import Spare
    from spd.runtime.stage_worker import StageWorker
    import spd.core.drafter  # noqa: F401  (imported ahead: takeover should cost only the tensor load)
    import spd.core.stage  # noqa: F401

    cfg = from_args(WorkerConfig, args)
    setup = _setup(cfg)
    server, health = _serve_health(cfg)
    if health:
        from spd.runtime.health import SERVING

        health.set("", SERVING)
    spare = Spare(setup.topology, args.endpoint, args.spare_id)
    try:
        a = spare.wait_for_role()
        if a is None:
            return 0
        if args.role_file:  # tells `spd up` which role this process now has (its state file)
            args.role_file.write_text(f"{a.role}-{a.index}" if a.role == "stage" else a.role)
        setup = dataclasses.replace(setup, topology=a.routes)
        worker: StageWorker | DrafterWorker
        if a.role == "stage":
            worker = StageWorker(a.routes, a.index, _stage(cfg, setup, a.index), args.endpoint, spare,
                                 gather=cfg.gather)
        else:
            worker = DrafterWorker(a.routes, _drafter_state(cfg, setup), args.endpoint, spare, gather=cfg.gather)
        worker.run()
    finally:
        if server:
            server.stop(0)
    return 0


def run_orchestrator(args) -> int:
    from spd.runtime.orchestrator import serve

    import torch

    torch.set_num_threads(1)
    serve(from_args(OrchestratorConfig, args, topology=Topology.from_arg(args.topology)))
    return 0

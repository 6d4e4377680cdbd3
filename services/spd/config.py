"""The configuration of every command and process, as dataclasses, and the one rule that turns a
dataclass into command-line flags and back (`add_flags`, `from_args`).

A field's flag is its name with dashes (`batch_tokens` -> `--batch-tokens`; a bool that defaults
to True is switched off by `--no-<name>`), its type and default are the field's, and its help is
the field's comment. A config is rebuilt from the parsed arguments by field name, never by
position, so reordering or adding a field cannot mis-wire a flag. Defaults shared by several
configs come from spd.settings. Torch-free: `spd --help` imports it.
"""

from __future__ import annotations

import argparse
import inspect
import re
import types
import typing
from dataclasses import MISSING, dataclass, field, fields
from functools import cache
from pathlib import Path
from typing import Any, Iterable, TypeVar

from spd import settings
from spd.api.validation import Limits
from spd.runtime.topology import Topology


# ------------------------------------------------------------------------------------------ training

@dataclass
class LoopConfig:
    """What every student's training run shares (spd.train.loop)."""

    model: str | None = None  # target model directory (default: embedded SmolLM2-135M-Instruct)
    tokens: int = 0  # budget of assistant tokens to train on (0 = `epochs` passes over the cache as it is now)
    lr: float = 1e-4  # peak learning rate
    warmup: int = 20  # optimizer steps of linear warm-up (then linear decay to 0 at the budget)
    weight_decay: float = 0.01  # AdamW weight decay
    batch_tokens: int = 1024  # loss positions per optimizer step
    vocab: int = 12288  # draft vocabulary size V_s
    data: str = "selfgen-train"  # teacher cache name under $SPD_CACHE/teacher/<model>/, or a path
    heldout: str = "selfgen-heldout"  # held-out cache name or path ("" = none)
    eval_seqs: int = 24  # held-out sequences per evaluation
    eval_every_s: float = 600.0  # seconds between held-out evaluations
    ckpt_every_s: float = 300.0  # seconds between checkpoints
    out: str = "runs/pdm"  # run directory: ckpt.pt, history.jsonl, the exported draft
    resume: bool = False  # continue from OUT/ckpt.pt
    seed: int = 0  # initialisation and shuffle seed
    threads: int = 1  # CPU threads for torch
    wait: bool = False  # wait for the cache to grow (still being generated) until the budget is met
    init_head: bool = True  # head rows from the target's LM head (--no-init-head: random)
    init_from: str = ""  # start from this exported draft's weights and vocabulary (a warm restart on a fresh machine: AdamW starts anew)
    epochs: int = 1  # passes over the cache
    skip_shards: int = 0  # a fresh run's first epoch starts at this shard (of each rank's): a warm start (--init-from) continuing on parts its draft has not seen
    max_steps: int = 0  # stop after this many optimizer steps (0 = the budget)
    max_seconds: float = 0.0  # stop (checkpointed, resumable) after this wall time (0 = none)
    fit_seconds: float = 0.0  # fit the budget to this much training time: once a tenth of it has run after the first step, the budget becomes at most what the positions/s since then reach in the time left, and the schedule decays to 0 on time (0 = off)
    progress: bool = True  # progress bar (--no-progress: logs only)
    device: str = "cpu"  # torch device of the draft (cuda for the GPU recipe)
    amp: str = "auto"  # autocast dtype of the forward: auto (bf16 where the device has bf16 units, spd.train.precision) | bfloat16 | float32 (master weights stay fp32)
    notes: dict = field(default_factory=dict)  # extra provenance written into the export


# the LoopConfig fields that every student of one run shares: the data, its order, the run's clock
SHARED = ("model", "data", "heldout", "eval_seqs", "epochs", "skip_shards", "seed", "wait", "threads", "device", "progress",
          "resume", "max_seconds", "ckpt_every_s")


@dataclass
class TrainConfig(LoopConfig):
    """A Pipeline Draft Module (spd.train.trainer)."""

    n: int = 5  # pipeline width the PDM is trained for
    ls: int = 1  # PDM decoder layers (L_s)
    anchors: list[int] | None = None  # anchor layers (default [0,e1,e3,e6,L-1]; PPSD: 0,e1)
    schedule: str = "pre"  # staircase the PDM is trained for: pre (s0 = 0) | post (s0 = 1)
    p_full: float = 0.5  # P(a = n) of the simulated fill level; else uniform 1..n-1
    fill: str = "design"  # simulated fill levels: design (as p_full) | judged:P (as the engine judges at acceptance P)
    prev: bool = False  # each position's input also fuses its predecessor's anchors, at the predecessor's staircase depth (PDMConfig.prev)


@dataclass
class EagleTrainConfig(LoopConfig):
    """The EAGLE-3-style baseline draft (spd.eagle.train)."""

    feature_layers: list[int] | None = None  # low,mid,high target layers (default L/6, L/2, L-1)
    ttt: int = 4  # training-time-test unroll steps
    lr: float = 1.5e-3  # peak learning rate
    vocab: int = 16384  # draft vocabulary size V_s
    out: str = "runs/eagle3"  # run directory: ckpt.pt, history.jsonl, draft/


# ------------------------------------------------------------------------------------------ serving

@dataclass
class ClusterConfig:
    """`spd up`: a supervised local pipeline (spd.runtime.launcher)."""

    n: int = 5  # pipeline stages, one process each
    port: int = settings.GRPC_PORT  # orchestrator gRPC port (0 = pick a free one)
    model: str | None = None  # model directory (default: embedded SmolLM2-135M-Instruct)
    draft: str | None = None  # PDM directory ('random' for an untrained one; default: the shipped one)
    split: str = "uniform"  # stage split: uniform | balanced | boundaries '0,6,...,L'
    devices: list[str] = field(default_factory=list)  # one per stage, then the drafter, then optionally one per spare (default: cpu)
    schedule: str = "pre"  # draft before (pre) or after (post) each cycle's verification
    state_file: Path | None = None  # write role -> pid/address JSON here
    metrics_port: int = 0  # orchestrator Prometheus /metrics port (0 = off)
    log_dir: Path | None = None  # one log file per process (default: this terminal)
    extra_drafter_args: list[str] = field(default_factory=list)  # e.g. ["--script", "..."] (tests)
    extra_stage_args: list[str] = field(default_factory=list)  # e.g. ["--zero-compute"] (benchmarks)
    queue_size: int = settings.QUEUE_SIZE  # requests waiting for a slot; one more is RESOURCE_EXHAUSTED
    extra_orchestrator_args: list[str] = field(default_factory=list)  # e.g. ["--token", "..."]
    worker_wait_s: float = settings.WORKER_WAIT_S  # seconds a request waits for a missing stage before UNAVAILABLE
    ready_timeout_s: float = 300.0  # give up if not healthy by then
    max_start_failures: int = 5  # a worker failing at start this many times in a row stops the launcher
    hung_after_s: float = 4.0  # a process that was healthy and then fails health checks this long is killed
    curve: bool = True  # encrypt/authenticate ZeroMQ with a per-launch key (SPD_CURVE_SECRET if set)
    spares: int = 0  # warm spare workers that take over a dead stage or drafter in about a second (0: restart it, several seconds)
    max_concurrency: int = 1  # requests decoding at once, sharing every stage forward (slots in every worker)
    gather: float = settings.GATHER  # stage 1 and the drafter hold ready work for at most this many of their recent compute times, so requests run through the stages as one batch (0 = off)
    http_port: int = 0  # also serve the OpenAI-compatible HTTP API (`spd http`) on this port (0 = none)


@dataclass
class WorkerConfig:
    """`spd stage`, `spd drafter`, `spd spare`: one worker process on one device (spd.commands.workers)."""

    topology: str | None = None  # JSON (or @file) with every worker's ZMQ endpoint (default $SPD_TOPOLOGY)
    model: str | None = None  # model directory (default: embedded SmolLM2-135M-Instruct)
    split: str = "uniform"  # stage split: uniform | balanced | boundaries '0,6,...,L'
    draft: str | None = None  # PDM directory ('random' for an untrained one); sets the anchors
    device: str = "cpu"  # the one device this process uses (cpu, cuda:K)
    dtype: str = "float32"  # weights and activations: float32 | bfloat16 | float16
    threads: int = 1  # CPU threads for torch
    health_port: int = 0  # grpc.health.v1 port (0 = none)
    health_host: str = "127.0.0.1"  # health bind address
    max_concurrency: int = 1  # requests the pipeline decodes at once, at this fixed batch shape (batch-invariant); must match the orchestrator's
    gather: float = settings.GATHER  # stage 1 and the drafter hold ready work while other requests decode, for at most this many of their recent compute times (0 = off)
    ls: int = 1  # the drafter's: layers of a random PDM
    script: str | None = None  # the drafter's, TEST ONLY: comma-separated continuation to propose instead of a PDM
    script_wrong_every: int = 0  # the drafter's, TEST ONLY: with --script, every k-th draft wrong
    zero_compute: bool = False  # a stage's, BENCHMARK ONLY: compute nothing


@dataclass
class OrchestratorConfig:
    """`spd orchestrator`: the gRPC front of a pipeline (spd.runtime.orchestrator)."""

    topology: Topology  # where the workers listen
    model: str | None = None  # model directory, for the tokenizer and config (default: embedded SmolLM2)
    port: int = settings.GRPC_PORT  # gRPC API port
    host: str = "127.0.0.1"  # bind address (0.0.0.0 in pods)
    metrics_port: int = 0  # Prometheus /metrics port (0 = off)
    schedule: str = "pre"  # staircase schedule: pre | post
    queue_size: int = settings.QUEUE_SIZE  # requests waiting for a slot; one more is RESOURCE_EXHAUSTED
    max_concurrency: int = 1  # requests decoding at once (the workers' --max-concurrency must match)
    max_tokens: int = Limits.max_tokens  # largest max_tokens a request may ask for
    default_max_tokens: int = Limits.default_max_tokens  # max_tokens of a request that leaves it unset (at most --max-tokens)
    worker_wait_s: float = settings.WORKER_WAIT_S  # seconds a request waits for a missing stage before UNAVAILABLE
    tls_cert: str | None = None  # PEM certificate: serve the API over TLS (with tls_key)
    tls_key: str | None = None  # PEM private key for --tls-cert
    token: str | None = None  # require "authorization: Bearer <token>" on SPD calls ($SPD_TOKEN)
    draft: str = "shipped"  # what the drafter runs, as GetInfo reports it (a PDM directory, shipped, random)


# ------------------------------------------------------------------------------------------ flags

C = TypeVar("C")


@cache
def field_help(cls: type) -> dict[str, str]:
    """Each field's comment (`name: type = default  # help`), over the class and its bases."""
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__[:-1]):
        try:
            source = inspect.getsource(klass)
        except (OSError, TypeError):  # no source shipped: flags without help rather than no CLI
            continue
        for line in source.splitlines():
            m = re.match(r"\s+(\w+): [^#]+#\s*(.+)$", line)
            if m:
                out[m.group(1)] = m.group(2)
    return out


def _scalar(hint: Any) -> tuple[Any, bool]:
    """(element type, is a list) of a field's annotation, Optional unwrapped."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and len(args) == 1:
        return _scalar(args[0])
    if typing.get_origin(hint) is list:
        return args[0], True
    return hint, False


def _comma_list(element: type):
    def parse(text: str) -> list:
        return [element(x) for x in text.split(",") if x]
    parse.__name__ = f"comma-separated {element.__name__}"
    return parse


def add_flags(parser: argparse.ArgumentParser, cls: type, only: Iterable[str] | None = None,
              skip: Iterable[str] = (), aliases: dict[str, str] | None = None,
              choices: dict[str, Iterable[str]] | None = None) -> None:
    """One flag per field of dataclass `cls` (all, or `only`, minus `skip`). Fields whose flag the
    parser already has (a base class shared by two configs) are left as they are. `aliases`: an
    extra, older spelling of a flag; `choices`: allowed values of a field."""
    hints, helps = typing.get_type_hints(cls), field_help(cls)
    wanted = set(only) if only is not None else None
    aliases, choices = aliases or {}, choices or {}
    have = {s for a in parser._actions for s in a.option_strings}
    for f in fields(cls):
        if (wanted is not None and f.name not in wanted) or f.name in skip:
            continue
        flag = "--" + f.name.replace("_", "-")
        default = f.default if f.default is not MISSING else (f.default_factory() if f.default_factory is not MISSING else None)
        element, is_list = _scalar(hints[f.name])
        if element is bool:  # a switch; left unset (SUPPRESS) it keeps the field's default
            flag = flag if not default else "--no-" + f.name.replace("_", "-")
            kw: dict[str, Any] = {"action": "store_false" if default else "store_true", "default": argparse.SUPPRESS}
        else:
            kw = {"type": _comma_list(element) if is_list else element, "default": default}
            if f.name in choices:
                kw["choices"] = list(choices[f.name])
        if flag in have:
            continue
        names = [flag] + ([aliases[f.name]] if f.name in aliases else [])
        parser.add_argument(*names, dest=f.name, help=helps.get(f.name, ""), **kw)


def from_args(cls: type[C], args: argparse.Namespace, **overrides) -> C:
    """An instance of dataclass `cls` from parsed arguments, by field name: each field the namespace
    has (or `overrides` gives); the others keep their defaults."""
    given = {f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)}  # type: ignore[arg-type]
    return cls(**{**given, **overrides})

"""Driving runtime objects (StageWorker, DrafterWorker, Driver) in process: an ipc topology, every
send recorded instead of made, and messages built by hand."""

from __future__ import annotations

import dataclasses

import torch

from spd import wire
from spd.core.sampling import SamplingParams
from spd.runtime.topology import Topology


def ipc_topology(tmp_path) -> Topology:
    """Two stages, the drafter and the orchestrator, on ipc endpoints under tmp_path."""
    s1, s2, drafter, orch = (f"ipc://{tmp_path}/{name}" for name in ("s1", "s2", "drafter", "orch"))
    return Topology((s1, s2), drafter, orch)


def record_sends(worker):
    """Replace worker.send: each send is appended to worker.sent as (socket, kind, header, tensors)."""
    worker.sent = []
    worker.send = lambda sock, kind, header, tensors=None: worker.sent.append((sock, kind, header, tensors))
    return worker


def message(kind: str, slot: int, epoch: int, pos: int = 0, tensors=None, **header) -> wire.Message:
    return wire.Message(kind, {"rid": f"r{slot}", "epoch": epoch, "pos": pos, "slot": slot, **header}, tensors or {})


def prefill(slot: int, ids: list[int], epoch: int) -> wire.Message:
    """The PREFILL the orchestrator broadcasts for a greedy request of prompt `ids` (pre-step)."""
    return message("PREFILL", slot, epoch, base=0, params=dataclasses.asdict(SamplingParams()), prompt_len=len(ids),
                   s0=0, draft_limit=100, tensors={"ids": torch.tensor(ids)})

"""Driving runtime objects (StageWorker, DrafterWorker, Driver) in process: an ipc topology, every
send recorded instead of made, and typed messages built by hand."""

from __future__ import annotations

import torch

from spd import wire
from spd.core.sampling import SamplingParams
from spd.runtime.topology import Topology


def ipc_topology(tmp_path) -> Topology:
    """Two stages, the drafter and the orchestrator, on ipc endpoints under tmp_path."""
    s1, s2, drafter, orch = (f"ipc://{tmp_path}/{name}" for name in ("s1", "s2", "drafter", "orch"))
    return Topology((s1, s2), drafter, orch)


def record_sends(worker):
    """Replace worker.send: each send is appended to worker.sent as (socket, message)."""
    worker.sent = []
    worker.send = lambda sock, message: worker.sent.append((sock, message))
    return worker


def sent(worker, cls: type[wire.Message]) -> list:
    """The messages of type `cls` the worker sent, in order."""
    return [m for _, m in worker.sent if isinstance(m, cls)]


def prefill(slot: int, ids: list[int], epoch: int) -> wire.Prefill:
    """The PREFILL the orchestrator broadcasts for a greedy request of prompt `ids` (pre-step)."""
    return wire.Prefill(rid=f"r{slot}", epoch=epoch, slot=slot, params=SamplingParams(), prompt_len=len(ids), s0=0,
                        draft_limit=100, ids=torch.tensor(ids))


def reseed(slot: int, epoch: int, pos: int, token: int) -> wire.Reseed:
    """Position `pos` committed as `token`: the fill restarts there."""
    return wire.Reseed(rid=f"r{slot}", epoch=epoch, slot=slot, pos=pos, base=pos, token=token)


def draft(slot: int, epoch: int, pos: int, token: int, rid: str = "") -> wire.Draft:
    return wire.Draft(rid=rid or f"r{slot}", epoch=epoch, slot=slot, pos=pos, base=0, token=token)


def anchors(slot: int, epoch: int, stage: int, pos: int, count: int) -> wire.Anchors:
    """Stage `stage` saw positions pos .. pos + count - 1 (no anchor tensors: a scripted drafter needs none)."""
    return wire.Anchors(rid=f"r{slot}", epoch=epoch, slot=slot, pos=pos, base=0, tokens=[0] * count, stage=stage,
                        count=count)


def exit_(slot: int, epoch: int, pos: int, argmax: int, rid: str = "") -> wire.Exit:
    """Stage n's summary of the token leaving at `pos` (greedy: the decided token only)."""
    return wire.Exit(rid=rid or f"r{slot}", epoch=epoch, slot=slot, pos=pos, base=0, tokens=[0], argmax=argmax)

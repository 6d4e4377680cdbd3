"""Data-parallel training under torchrun: which shards a rank reads, and the few collectives that keep
ranks in lockstep (gloo on CPUs, NCCL on GPUs). Without torchrun (WORLD_SIZE unset or 1) every
call is a local no-op, so the loop has one code path.

Rank r reads shards r, r + W, r + 2W, ... of the cache. After every sequence the ranks add up the
loss rows they have accumulated (`agree`), so all of them take an optimizer step at the same
sequence, when the global count reaches batch_tokens; the gradients are then summed across ranks
(`sum_grads`). Each rank's loss is divided by the *global* batch_tokens, so the summed gradient is
the one a single process would compute over the same global batch. (torch's DistributedDataParallel
cannot be used as is: the students run their modules' parts directly, not through forward().)
"""

from __future__ import annotations

import os
from typing import Sequence

import torch
import torch.distributed as dist


class Ranks:
    def __init__(self, device: str = "cpu"):
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        cuda = torch.device(device).type == "cuda"
        if self.world > 1 and cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))  # "cuda" then means this rank's GPU
        if self.world > 1 and not dist.is_initialized():
            dist.init_process_group("nccl" if cuda else "gloo")
        self.rank = dist.get_rank() if self.world > 1 else 0
        self.device = torch.device(device)

    @property
    def main(self) -> bool:
        """The rank that evaluates, logs and writes checkpoints."""
        return self.rank == 0

    def mine(self, shards: list) -> list:
        return shards[self.rank::self.world]

    def agree(self, rows: int, *flags: bool) -> tuple[int, list[bool]]:
        """(rows summed over ranks, each flag raised by any rank)."""
        if self.world == 1:
            return rows, list(flags)
        t = torch.tensor([rows, *map(int, flags)], dtype=torch.long, device=self.device)
        dist.all_reduce(t)
        return int(t[0]), [bool(x) for x in t[1:]]

    def sum_grads(self, params: Sequence[torch.nn.Parameter]) -> None:
        if self.world == 1:
            return
        grads: list[torch.Tensor] = []
        for p in params:
            if p.grad is None:  # no loss row on this rank since the last step
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)
        flat = torch.cat([g.reshape(-1) for g in grads])  # one collective, not one per tensor
        dist.all_reduce(flat)
        for g, part in zip(grads, flat.split([g.numel() for g in grads])):
            g.copy_(part.view_as(g))

    def gather(self, obj) -> list:
        """Every rank's `obj`, in rank order (on every rank)."""
        if self.world == 1:
            return [obj]
        out: list = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

"""A pipeline stage as a process: forwards what reaches it, sends hidden states on, anchors to the
drafter and, from the last stage, a compact summary of the exiting token's distribution.

Inputs: PREFILL (the prompt; stage 1 runs it), RESEED (truncate the KV cache to `base`; stage 1
runs the token), DRAFT (stage 1: a drafted token), HIDDEN (stages 2..n), CANCEL (request over).
Within an epoch inputs are run in position order, exactly when position == KV length; anything
else waits in a small buffer (messages on different sockets may overtake each other).
"""

from __future__ import annotations

import logging
import time

import torch

from spd import wire
from spd.core.sampling import SamplingParams, choose, process
from spd.core.stage import Stage
from spd.runtime.topology import Topology
from spd.runtime.worker import MAX_PENDING, Worker

log = logging.getLogger(__name__)


class StageWorker(Worker):
    role = "stage"

    def __init__(self, topology: Topology, index: int, stage: Stage, endpoint: str | None = None,
                 handover: Worker | None = None):
        self.first, self.last = index == 1, index == topology.n
        super().__init__(topology, endpoint or topology.stages[index - 1], index, handover)
        self.stage = stage
        self.params = SamplingParams()
        self.base = 0
        self.pending: dict[int, wire.Message] = {}  # pos -> input of the current epoch, waiting its turn
        self.future: list[wire.Message] = []  # inputs of epochs not opened yet

    def _routes(self) -> dict[str, str]:
        t = self.topology
        return {**super()._routes(), "to_next": t.orchestrator if self.last else t.stages[self.index],
                "to_drafter": t.drafter}

    # -- message handling --------------------------------------------------------------------------

    def handle(self, msg: wire.Message) -> None:
        if msg.kind in ("PREFILL", "RESEED", "CANCEL"):
            if msg.epoch < self.epoch or not self.plausible(msg):
                self.dropped["stale"] += 1
                return
            self._open_epoch(msg)
        elif msg.kind in ("HIDDEN", "DRAFT"):
            if msg.epoch < self.epoch:
                self.dropped["stale"] += 1
                return
            if msg.epoch > self.epoch:
                self._hold(self.future, msg)
                return
            self.pending[msg.pos] = msg
        else:
            log.debug("stage %d ignores %s", self.index, msg.kind)
            return
        self._run_ready()

    def _open_epoch(self, msg: wire.Message) -> None:
        h = msg.header
        self.rid, self.epoch = msg.rid, msg.epoch
        self.pending = {}
        if msg.kind == "CANCEL":
            self.stage.truncate(0)
            return
        if msg.kind == "PREFILL":
            self.params = SamplingParams(**h["params"])
            self.base = 0
            self.stage.truncate(0)
            if self.first:
                self.pending[0] = msg
        else:  # RESEED: everything from `base` on is void
            self.base = h["base"]
            if self.stage.kv_length < self.base:
                raise RuntimeError(f"reseed at {self.base} but KV holds only {self.stage.kv_length} positions")
            self.stage.truncate(self.base)
            if self.first:
                self.pending[self.base] = msg
        waiting, self.future = self.future, []
        for m in waiting:
            if m.epoch == self.epoch:
                self.pending[m.pos] = m
            elif m.epoch > self.epoch:
                self.future.append(m)

    def _hold(self, buf: list, msg: wire.Message) -> None:
        if len(buf) >= MAX_PENDING:
            buf.pop(0)
            self.dropped["overflow"] += 1
        buf.append(msg)

    def _run_ready(self) -> None:
        while self.stage.kv_length in self.pending:
            self._forward(self.pending.pop(self.stage.kv_length))
        if len(self.pending) > MAX_PENDING:
            self.pending.clear()
            self.dropped["overflow"] += 1

    # -- compute ----------------------------------------------------------------------------------

    def _forward(self, msg: wire.Message) -> None:
        chain = list(msg.header.get("stage_ms", [])) if msg.kind == "HIDDEN" else []
        for pos, tokens, x in self._inputs(msg):
            log.debug("[forward] epoch %d %s pos %d (%d tokens)", self.epoch, msg.kind, pos, len(tokens))
            t0 = time.perf_counter()
            out = self.stage(x, pos)
            t_ms = 1e3 * (time.perf_counter() - t0)
            head = {"pos": pos, "base": self.base, "tokens": tokens, "t_ms": t_ms, "stage_ms": chain + [t_ms]}
            anchors = {f"a{b}": h for b, h in out.anchors.items()}
            self.send(self.to_drafter, "ANCHORS", {**head, "stage": self.index, "count": len(tokens)}, anchors)
            if self.last:
                self._exit(head, out.logits[-1])
            else:
                self.send(self.to_next, "HIDDEN", head, {"h": out.hidden})

    def _inputs(self, msg: wire.Message):
        """(position, token ids, stage input) chunks of one message.

        A PREFILL runs the prompt as one chunk and, when it re-prefills after a fault, every
        generated token after it one at a time, exactly as they were first computed, so the rebuilt
        KV caches are bit-identical and greedy output cannot change.
        """
        if msg.kind == "PREFILL":
            ids = msg.tensors["ids"].to(torch.long)
            split = int(msg.header.get("prompt_len", len(ids)))
            yield 0, ids[:split].tolist(), ids[:split]
            for pos in range(split, len(ids)):
                yield pos, [int(ids[pos])], ids[pos:pos + 1]
        elif msg.kind in ("RESEED", "DRAFT"):
            token = int(msg.header["token"])
            yield msg.pos, [token], torch.tensor([token])
        else:
            yield msg.pos, list(msg.header["tokens"]), msg.tensors["h"].clone()

    def _decided(self, logits: torch.Tensor, position: int) -> int:
        return choose(logits, self.params, position)[0] if self.params.decided else int(torch.argmax(logits))

    def _exit(self, head: dict, logits: torch.Tensor) -> None:
        """The exiting token's distribution, compactly: the decided token (greedy: argmax; gumbel:
        argmax(log p + G)), plus the processed support for rejection sampling."""
        pos = head["pos"] + len(head["tokens"]) - 1  # the last position of this input
        summary = {**head, "pos": pos, "argmax": self._decided(logits, pos + 1)}
        tensors = None
        if not self.params.decided:  # rejection sampling needs the whole processed distribution
            p = process(logits, self.params)
            ids = torch.nonzero(p).flatten()
            tensors = {"ids": ids.to(torch.int32), "probs": p[ids]}
        self.send(self.to_next, "EXIT", summary, tensors)

"""A pipeline stage as a process: forwards what reaches it, sends hidden states on, anchors to the
drafter and, from the last stage, a compact summary of the exiting token's distribution.

Inputs: PREFILL (the prompt; stage 1 runs it), RESEED (truncate the KV cache to `base`; stage 1
runs the token), DRAFT (stage 1: a drafted token), HIDDEN (stages 2..n), CANCEL (request over).
Every message names its request's slot; each slot has its own KV cache, epoch and buffers, so a
flush in one request never touches another's. Within a slot's epoch inputs are run in position
order, exactly when position == that slot's KV length; anything else waits in a small buffer
(messages on different sockets may overtake each other). Single-token inputs that are ready in
several slots at once run as one batched forward (`Stage.forward_rows`, batch-invariant).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import torch
import zmq

from spd import settings, wire
from spd.core.sampling import SamplingParams, decided_token, sampling_probs
from spd.core.stage import Stage
from spd.core.target import prefill_chunks
from spd.runtime.gather import Gather
from spd.runtime.topology import Topology
from spd.runtime.worker import MAX_PENDING, Worker

log = logging.getLogger(__name__)

Input = wire.Prefill | wire.Reseed | wire.Draft | wire.Hidden  # what a stage runs (stage 1: the first three)


@dataclass
class _Slot:
    """One request's state in this stage."""
    rid: str = ""
    epoch: int = -1
    base: int = 0  # first position of the current epoch's fill
    params: SamplingParams = field(default_factory=SamplingParams)
    limit: int = 0  # positions below this may still get a draft (the request's draft limit)
    pending: dict[int, Input] = field(default_factory=dict)  # pos -> input of the current epoch
    future: list[wire.Hidden | wire.Draft] = field(default_factory=list)  # inputs of epochs not opened yet


class StageWorker(Worker):
    role = "stage"
    to_next: zmq.Socket  # stage j+1, or the orchestrator from stage n
    to_drafter: zmq.Socket

    def __init__(self, topology: Topology, index: int, stage: Stage, endpoint: str | None = None,
                 handover: Worker | None = None, gather: float = settings.GATHER):
        self.first, self.last = index == 1, index == topology.n
        super().__init__(topology, endpoint or topology.stages[index - 1], index, handover)
        self.stage = stage
        self.slots: dict[int, _Slot] = {}
        self.gather = Gather(gather)  # stage 1: ready tokens wait a little for the other decoding slots

    def _routes(self) -> dict[str, str]:
        t = self.topology
        return {**super()._routes(), "to_next": t.orchestrator if self.last else t.stages[self.index],
                "to_drafter": t.drafter}

    # -- message handling --------------------------------------------------------------------------

    def handle(self, msg: wire.Message) -> None:
        sid = msg.slot
        slot = self.slots.setdefault(sid, _Slot())
        if isinstance(msg, (wire.Prefill, wire.Reseed, wire.Cancel)):
            if msg.epoch < slot.epoch or not self.plausible(msg):
                self.dropped["stale"] += 1
                return
            self._open_epoch(sid, slot, msg)
        elif isinstance(msg, (wire.Hidden, wire.Draft)):
            if msg.epoch < slot.epoch:
                self.dropped["stale"] += 1
            elif msg.epoch > slot.epoch:
                self._hold(slot.future, msg)
            else:
                slot.pending[msg.pos] = msg
        else:
            log.debug("stage %d ignores %s", self.index, msg.kind)

    def _open_epoch(self, sid: int, slot: _Slot, msg: wire.Prefill | wire.Reseed | wire.Cancel) -> None:
        slot.rid, slot.epoch, slot.pending = msg.rid, msg.epoch, {}
        if isinstance(msg, wire.Cancel):
            self.stage.release(sid)
            return
        if isinstance(msg, wire.Prefill):
            slot.params, slot.limit = msg.params, msg.draft_limit
            slot.base = 0
            self.stage.truncate(0, sid)
            if self.first:
                slot.pending[0] = msg
        else:  # RESEED: everything from `base` on is void
            slot.base = msg.base
            if self.stage.kv_length_of(sid) < slot.base:
                raise RuntimeError(f"slot {sid}: reseed at {slot.base} but KV holds only "
                                   f"{self.stage.kv_length_of(sid)} positions")
            self.stage.truncate(slot.base, sid)
            if self.first:
                slot.pending[slot.base] = msg
        waiting, slot.future = slot.future, []
        for m in waiting:
            if m.epoch == slot.epoch:
                slot.pending[m.pos] = m
            elif m.epoch > slot.epoch:
                slot.future.append(m)

    def _hold(self, buf: list, msg: wire.Hidden | wire.Draft) -> None:
        if len(buf) >= MAX_PENDING:
            buf.pop(0)
            self.dropped["overflow"] += 1
        buf.append(msg)

    def after_messages(self) -> None:
        """Run everything that is ready, in rounds: each slot's next input once, chunks alone and
        single tokens of several slots batched (stage 1 first gathers them: runtime/gather.py). A
        prompt's chunks take one round each, so the others' decode steps run between them."""
        while True:
            ready = [sid for sid, slot in self.slots.items() if self.stage.kv_length_of(sid) in slot.pending]
            if not ready:
                break
            inputs = {sid: self._next_input(sid) for sid in ready}  # sid -> (msg, pos, tokens, x)
            singles = [sid for sid in ready if len(inputs[sid][2]) == 1]
            chunks = [sid for sid in ready if sid not in singles]
            if not chunks and self.first and self._gathering(len(singles)):
                break  # they stay pending until the batch is whole
            for sid, (msg, pos, tokens, _) in inputs.items():
                self._consume(sid, msg, pos, len(tokens))
            for sid in chunks:
                self._forward_chunk(sid, *inputs[sid])
            rows = max(self.stage.rows, 1)
            for g in range(0, len(singles), rows):
                self._forward_batch([(sid, *inputs[sid]) for sid in singles[g:g + rows]])
        for sid, slot in self.slots.items():
            if len(slot.pending) > MAX_PENDING:
                slot.pending.clear()
                self.dropped["overflow"] += 1

    def _next_input(self, sid: int) -> tuple[Input, int, list[int], torch.Tensor]:
        """The slot's input at its KV length: (message, position, token ids, stage input)."""
        pos = self.stage.kv_length_of(sid)
        msg = self.slots[sid].pending[pos]
        return (msg, pos, *_input_at(msg, pos))

    def _consume(self, sid: int, msg: Input, pos: int, width: int) -> None:
        """That input runs now; the rest of a longer message waits for the next round."""
        pending = self.slots[sid].pending
        del pending[pos]
        if pos + width < _end(msg):
            pending[pos + width] = msg

    def _gathering(self, ready: int) -> bool:
        """Hold `ready` single tokens while other slots are decoding (wake up at `wake_at`)."""
        decoding = sum(0 < self.stage.kv_length_of(sid) < slot.limit for sid, slot in self.slots.items())
        self.wake_at = self.gather.hold_until(ready, decoding, time.monotonic())
        return self.wake_at is not None

    # -- compute ----------------------------------------------------------------------------------

    def _forward_chunk(self, sid: int, msg: Input, pos: int, tokens: list[int], x: torch.Tensor) -> None:
        log.debug("[forward] slot %d %s pos %d (%d tokens)", sid, msg.kind, pos, len(tokens))
        t0 = time.perf_counter()
        out = self.stage(x, pos, sid)
        self._send_on(sid, msg, pos, tokens, out, 1e3 * (time.perf_counter() - t0), batch=1)

    def _forward_batch(self, group: list[tuple[int, Input, int, list[int], torch.Tensor]]) -> None:
        t0 = time.perf_counter()
        outs = self.stage.forward_rows([(sid, x, pos) for sid, _, pos, _, x in group])
        self.gather.observe(time.perf_counter() - t0)
        t_ms = 1e3 * (time.perf_counter() - t0)
        for (sid, msg, pos, tokens, _), out in zip(group, outs):
            self._send_on(sid, msg, pos, tokens, out, t_ms, batch=len(group))

    def _send_on(self, sid: int, msg: Input, pos: int, tokens: list[int], out, t_ms: float, batch: int) -> None:
        slot = self.slots[sid]
        stage_ms = [*msg.stage_ms, t_ms] if isinstance(msg, wire.Hidden) else [t_ms]
        batches = [*msg.batch, batch] if isinstance(msg, wire.Hidden) else [batch]
        self.send(self.to_drafter, wire.Anchors(
            rid=slot.rid, epoch=slot.epoch, slot=sid, pos=pos, base=slot.base, tokens=tokens, t_ms=t_ms,
            stage_ms=stage_ms, batch=batches, stage=self.index, count=len(tokens), anchors=dict(out.anchors)))
        if not self.last:
            self.send(self.to_next, wire.Hidden(
                rid=slot.rid, epoch=slot.epoch, slot=sid, pos=pos, base=slot.base, tokens=tokens, t_ms=t_ms,
                stage_ms=stage_ms, batch=batches, h=out.hidden))
            return
        # The exiting token's distribution, compactly: the decided token (greedy: argmax; gumbel:
        # argmax(log p + G)), plus the processed support for rejection sampling.
        last = pos + len(tokens) - 1  # the last position of this input
        logits, params = out.logits[-1], slot.params
        self.send(self.to_next, wire.Exit(
            rid=slot.rid, epoch=slot.epoch, slot=sid, pos=last, base=slot.base, tokens=tokens, t_ms=t_ms,
            stage_ms=stage_ms, batch=batches, argmax=decided_token(logits, params, last + 1),
            dist=None if params.decided else wire.SparseDist.of(sampling_probs(logits, params))))


def _input_at(msg: Input, pos: int) -> tuple[list[int], torch.Tensor]:
    """The input of `msg` that starts at `pos`: (token ids, stage input).

    A PREFILL runs the prompt in the chunks of `prefill_chunks` and, when it re-prefills after a
    fault, every generated token after it one at a time, exactly as they were first computed, so
    the rebuilt KV caches are bit-identical and greedy output cannot change.
    """
    if isinstance(msg, wire.Prefill):
        ids = msg.ids.to(torch.long)
        split = msg.prompt_len
        end = next((e for s, e in prefill_chunks(split) if s == pos), None) if pos < split else pos + 1
        if end is None or end > len(ids):
            raise ValueError(f"PREFILL of {len(ids)} tokens has no input at {pos}")
        return ids[pos:end].tolist(), ids[pos:end]
    if isinstance(msg, (wire.Reseed, wire.Draft)):
        return [msg.token], torch.tensor([msg.token])
    return list(msg.tokens), msg.h.clone()


def _end(msg: Input) -> int:
    """The position after the last one a message's inputs cover."""
    if isinstance(msg, wire.Prefill):
        return len(msg.ids)
    return msg.pos + (1 if isinstance(msg, (wire.Reseed, wire.Draft)) else len(msg.tokens))

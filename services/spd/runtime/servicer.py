"""The public gRPC API (spd.v1.SPD): validation, queueing, streaming; the driver does the decoding."""

from __future__ import annotations

import logging
import queue
import uuid

import grpc

from spd.api.validation import InvalidRequest, Limits, validate
from spd.core.sampling import SamplingParams
from spd.core.stopping import StopRule
from spd.core.target import prompt_problem
from spd.runtime import metrics
from spd.runtime.driver import Driver
from spd.runtime.jobs import Job
from spd.runtime.stats import RequestStats
from spd.text import TextStream, encode_prompt
from spd_client.v1 import spd_pb2, spd_pb2_grpc

log = logging.getLogger(__name__)

EVENT_POLL_S = 0.2  # how often a waiting handler checks whether its job was cancelled


class SPDServicer(spd_pb2_grpc.SPDServicer):
    def __init__(self, driver: Driver, tokenizer, eos_ids: frozenset[int], limits: Limits = Limits(),
                 info: spd_pb2.Info | None = None):
        self.driver, self.tokenizer, self.eos_ids, self.limits = driver, tokenizer, eos_ids, limits
        self.info = info or spd_pb2.Info()

    def GetInfo(self, request, context):
        return self.info

    def Generate(self, request, context):
        job = self._submit(request, context)
        text, ids = TextStream(self.tokenizer, job.stop.stop), []
        for kind, *rest in self._events(job, context):
            if kind == "token":
                ids.append(rest[0])
                text.push(rest[0])
            else:
                return spd_pb2.GenerateResponse(text=text.text(), token_ids=ids, finish_reason=rest[0],
                                                stats=_stats(rest[1]))

    def GenerateStream(self, request, context):
        job = self._submit(request, context)
        text = TextStream(self.tokenizer, job.stop.stop)
        for kind, *rest in self._events(job, context):
            if kind == "token":
                delta = text.push(rest[0])
                yield spd_pb2.GenerateChunk(token_ids=[rest[0]], text=delta)
            else:
                yield spd_pb2.GenerateChunk(text=text.flush(), finish_reason=rest[0], stats=_stats(rest[1]))

    # -- helpers ----------------------------------------------------------------------------------

    def _submit(self, request, context) -> Job:
        try:
            req = validate(request, self.limits)
        except InvalidRequest as e:
            metrics.REQUESTS.labels("invalid").inc()
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, e.message)
        ids = encode_prompt(self.tokenizer, req.prompt, req.chat() or None, raw=req.raw)
        problem = prompt_problem(len(ids), self.driver.cfg.context)  # the in-process engine's rule too
        if problem:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        params = SamplingParams(req.temperature, req.top_k, req.top_p, req.seed, req.coupling)
        stop = StopRule(req.max_tokens, self.eos_ids, req.stop, self.tokenizer)
        job = Job(req.request_id or uuid.uuid4().hex[:16], ids, params, stop)
        # gRPC's own signal: runs when the call ends for any reason (client cancel, deadline,
        # disconnect, or our own return), so an abandoned request stops within one driver step
        # even while its tokens are still flowing.
        context.add_callback(job.cancel)
        try:
            self.driver.jobs.put_nowait(job)
        except queue.Full:
            metrics.REQUESTS.labels("overloaded").inc()
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"server busy: {self.driver.cfg.queue_size} requests already waiting; retry later")
        metrics.QUEUE.set(self.driver.jobs.qsize())
        return job

    def _events(self, job: Job, context):
        """Driver events for this job until done or cancelled."""
        while True:
            try:
                event = job.events.get(timeout=EVENT_POLL_S)
            except queue.Empty:
                if job.cancelled.is_set() or not context.is_active():
                    job.cancel()
                    return
                continue
            if event[0] == "error":
                context.abort(getattr(grpc.StatusCode, event[1]), event[2])
            yield event
            if event[0] == "done":
                return


def _stats(stats: RequestStats | None) -> spd_pb2.Stats:
    """The message from the typed figures, field for field (a name missing on either side raises)."""
    return spd_pb2.Stats(**stats.as_dict()) if stats is not None else spd_pb2.Stats()

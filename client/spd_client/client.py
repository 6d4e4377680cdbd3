"""SPDClient: the Python SDK of the SPD generation service (gRPC spd.v1.SPD).

Every call has a deadline (`timeout` seconds, covering all its retries). Calls that fail with
UNAVAILABLE (server down or restarting) or RESOURCE_EXHAUSTED (its queue is full) are retried with
exponential backoff and jitter; every other error is raised at once as SPDError with the server's
status code and message.

Stream retries: the service is deterministic for a given request (greedy decoding, or sampling
whose random numbers are keyed by (seed, position)), so after UNAVAILABLE in the middle of a
stream the client re-issues the *same* request and skips the token ids and text it has already
yielded, checking that the replay agrees with them; if it does not, StreamDivergedError is raised
rather than yielding a changed token. Each token is therefore yielded exactly once.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass, field
from typing import Iterable, Iterator, TypedDict, Unpack

import grpc

from spd_client.v1 import spd_pb2, spd_pb2_grpc

log = logging.getLogger("spd_client")

RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE,  # server down or restarting
                       grpc.StatusCode.RESOURCE_EXHAUSTED})  # its queue is full: later may work


class Params(TypedDict, total=False):
    """Generation parameters of generate() / stream() (see spd.v1.GenerateRequest)."""
    raw: bool  # send the prompt as is, without the chat template
    max_tokens: int  # 1..server maximum; unset = the server's default
    temperature: float  # 0 = greedy
    top_k: int  # 0 = off
    top_p: float  # (0, 1]; unset = 1
    seed: int  # same request + seed => same output
    stop: Iterable[str]  # stop strings
    request_id: str  # client-chosen id for logs
    coupling: str  # sampled verification: "rejection" (default) | "gumbel"


@dataclass
class Result:
    text: str  # the completion
    token_ids: list[int]  # generated token ids
    finish_reason: str  # "stop" | "length" | "cancelled"
    stats: dict = field(default_factory=dict)  # spd.v1.Stats as a dict (N, K, alpha, timings, ...)


@dataclass
class Chunk:
    token_ids: list[int]  # ids new in this chunk
    text: str  # text delta
    finish_reason: str | None = None  # set on the final chunk only
    stats: dict | None = None  # set on the final chunk only


class SPDError(Exception):
    """A failed call: `code` is the grpc.StatusCode, `details` the server's message."""

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(f"{code.name}: {details}")
        self.code, self.details = code, details


class StreamDivergedError(SPDError):
    """A retried stream replayed different tokens than the ones already yielded."""

    def __init__(self, details: str):
        super().__init__(grpc.StatusCode.DATA_LOSS, details)


class SPDClient:
    """Client of one SPD orchestrator at `address` ("host:port")."""

    def __init__(self, address: str, timeout: float = 60.0, retries: int = 5, backoff: float = 0.2,
                 max_backoff: float = 5.0, tls: bool = False,
                 credentials: grpc.ChannelCredentials | None = None,
                 options: list[tuple[str, object]] | None = None, seed: int | None = None,
                 token: str | None = None):
        self.address = address
        self._metadata = [("authorization", f"Bearer {token}")] if token else None  # server's --token
        self.timeout = timeout  # default deadline of one call, retries included (seconds)
        self.retries = retries  # retries after UNAVAILABLE without progress (0 = none)
        self.backoff = backoff  # first retry delay (seconds), doubled per retry
        self.max_backoff = max_backoff  # cap of the retry delay (seconds)
        self._rng = random.Random(seed)  # jitter
        if credentials is None and tls:
            credentials = grpc.ssl_channel_credentials()
        self._channel = (grpc.secure_channel(address, credentials, options=options) if credentials
                         else grpc.insecure_channel(address, options=options))
        self._stub = spd_pb2_grpc.SPDStub(self._channel)

    # ------------------------------------------------------------------------------ public API

    def generate(self, prompt: str | None = None, messages: Iterable | None = None, *,
                 timeout: float | None = None, **params: Unpack[Params]) -> Result:
        """One whole completion (params: see Params)."""
        request = build_request(prompt, messages, **params)
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        failures = 0
        while True:
            try:
                response = self._stub.Generate(request, timeout=_remaining(deadline), metadata=self._metadata)
                return Result(response.text, list(response.token_ids), response.finish_reason,
                              stats_dict(response.stats))
            except grpc.RpcError as e:
                failures += 1
                self._retry_or_raise(e, failures, deadline)

    def stream(self, prompt: str | None = None, messages: Iterable | None = None, *,
               timeout: float | None = None, **params: Unpack[Params]) -> Iterator[Chunk]:
        """The completion as it is committed: Chunks of new token ids and text deltas.

        Closing the iterator early cancels the call on the server.
        """
        request = build_request(prompt, messages, **params)
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        replay = _Replay()
        failures = 0
        while True:
            progress_before = len(replay.ids)
            try:
                yield from self._stream_once(request, deadline, replay)
                return
            except grpc.RpcError as e:
                failures = 1 if len(replay.ids) > progress_before else failures + 1
                self._retry_or_raise(e, failures, deadline)
                log.info("spd_client: stream retry %d after %d tokens", failures, len(replay.ids))

    def info(self, timeout: float | None = None) -> dict:
        """What the server runs: model, n, context_length, limits, max_concurrency, schedule, draft."""
        try:
            reply = self._stub.GetInfo(spd_pb2.GetInfoRequest(), timeout=timeout or self.timeout, metadata=self._metadata)
        except grpc.RpcError as e:
            raise SPDError(e.code(), e.details() or str(e)) from None
        return stats_dict(reply)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> SPDClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------------------ internals

    def _stream_once(self, request, deadline: float, replay: _Replay) -> Iterator[Chunk]:
        replay.restart()
        call = self._stub.GenerateStream(request, timeout=_remaining(deadline), metadata=self._metadata)
        try:
            for message in call:
                chunk = replay.admit(message)
                if chunk is not None:
                    yield chunk
        finally:
            call.cancel()  # no-op when finished; stops the server when the consumer quits early

    def _retry_or_raise(self, error: grpc.RpcError, failures: int, deadline: float) -> None:
        code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
        details = (error.details() if hasattr(error, "details") else None) or str(error)
        if code not in RETRYABLE or failures > self.retries:
            raise SPDError(code, details) from None
        delay = min(self.max_backoff, self.backoff * 2 ** (failures - 1)) * self._rng.uniform(0.5, 1.0)
        if time.monotonic() + delay >= deadline:
            raise SPDError(grpc.StatusCode.DEADLINE_EXCEEDED, f"deadline reached while retrying: {details}") from None
        log.warning("spd_client: %s from %s (%s); retry %d/%d in %.2fs", code.name, self.address, details,
                    failures, self.retries, delay)
        time.sleep(delay)


class _Replay:
    """What a stream has yielded so far; turns a (possibly replayed) server stream into new chunks only."""

    def __init__(self):
        self.ids: list[int] = []  # token ids yielded to the caller
        self.text = ""  # text yielded to the caller
        self.seen_ids = 0  # ids received in the current attempt
        self.seen_text = ""  # text received in the current attempt

    def admit(self, message: spd_pb2.GenerateChunk) -> Chunk | None:
        """The part of `message` not yet yielded, or None when there is nothing new."""
        ids = list(message.token_ids)
        old_ids = self.ids[self.seen_ids:self.seen_ids + len(ids)]
        if ids[:len(old_ids)] != old_ids:
            at = next(i for i, (a, b) in enumerate(zip(ids, old_ids)) if a != b)
            raise StreamDivergedError(f"retried stream changed the token at position {self.seen_ids + at}: "
                                      f"{ids[at]} instead of {old_ids[at]}")
        self.seen_ids += len(ids)
        self.seen_text += message.text
        new_ids = ids[len(old_ids):]
        new_text = self._new_text()
        self.ids += new_ids
        self.text += new_text
        final = bool(message.finish_reason)
        if not (new_ids or new_text or final):
            return None
        return Chunk(new_ids, new_text, message.finish_reason or None,
                     stats_dict(message.stats) if final else None)

    def _new_text(self) -> str:
        shared = min(len(self.seen_text), len(self.text))
        if self.seen_text[:shared] != self.text[:shared]:
            raise StreamDivergedError(f"retried stream changed text at character {shared}")
        return self.seen_text[len(self.text):]

    def restart(self) -> None:
        self.seen_ids, self.seen_text = 0, ""


def build_request(prompt: str | None = None, messages: Iterable | None = None, *, raw: bool = False,
                  max_tokens: int | None = None, temperature: float = 0.0, top_k: int = 0,
                  top_p: float | None = None, seed: int = 0, stop: Iterable[str] = (),
                  request_id: str = "", coupling: str = "") -> spd_pb2.GenerateRequest:
    """A GenerateRequest; messages are {"role", "content"} dicts or (role, content) pairs."""
    request = spd_pb2.GenerateRequest(prompt=prompt or "", raw=raw, temperature=temperature, top_k=top_k,
                                      seed=seed, stop=list(stop), request_id=request_id, coupling=coupling)
    for m in messages or ():
        role, content = (m["role"], m["content"]) if isinstance(m, dict) else m
        request.messages.add(role=role, content=content)
    if max_tokens is not None:
        request.max_tokens = max_tokens
    if top_p is not None:
        request.top_p = top_p
    return request


def stats_dict(stats) -> dict:
    """Every field of a Stats (or Info) message by name (zeros included)."""
    out = {}
    for f in stats.DESCRIPTOR.fields:
        value = getattr(stats, f.name)
        out[f.name] = value if isinstance(value, (int, float, str)) else list(value)  # repeated -> list
    return out


def _remaining(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise SPDError(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline reached before the call")
    return left

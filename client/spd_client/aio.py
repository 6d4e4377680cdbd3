"""AsyncSPDClient: the SDK for asyncio programs (grpc.aio), with the sync client's request and
result types.

`generate` retries UNAVAILABLE and RESOURCE_EXHAUSTED with exponential backoff and jitter inside its deadline, like
SPDClient. `stream` retries them only until the first chunk has arrived (after that the
error is raised: an async consumer that has already forwarded text cannot take it back); closing
the async iterator, or cancelling the task that consumes it, cancels the call on the server.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import AsyncIterator, Iterable, Unpack

import grpc

from spd_client.client import RETRYABLE, Chunk, Params, Result, SPDError, build_request, stats_dict
from spd_client.v1 import spd_pb2, spd_pb2_grpc


class AsyncSPDClient:
    """Async client of one SPD orchestrator at `address` ("host:port")."""

    def __init__(self, address: str, timeout: float = 60.0, retries: int = 5, backoff: float = 0.2,
                 max_backoff: float = 5.0, tls: bool = False, credentials: grpc.ChannelCredentials | None = None,
                 token: str | None = None, options: list[tuple[str, object]] | None = None):
        self.address = address
        self.timeout = timeout  # default deadline of one call, retries included (seconds)
        self.retries = retries  # retries after UNAVAILABLE (0 = none)
        self.backoff, self.max_backoff = backoff, max_backoff  # first retry delay, its cap (seconds)
        self._metadata = (("authorization", f"Bearer {token}"),) if token else None
        if credentials is None and tls:
            credentials = grpc.ssl_channel_credentials()
        self._channel = (grpc.aio.secure_channel(address, credentials, options=options) if credentials
                         else grpc.aio.insecure_channel(address, options=options))
        self._stub = spd_pb2_grpc.SPDStub(self._channel)
        self._rng = random.Random()

    async def generate(self, prompt: str | None = None, messages: Iterable | None = None, *,
                       timeout: float | None = None, token: str | None = None, **params: Unpack[Params]) -> Result:
        """One whole completion; params as for SPDClient.generate; `token` overrides the client's."""
        request = build_request(prompt, messages, **params)
        metadata = self._auth(token)
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        failures = 0
        while True:
            try:
                r = await self._stub.Generate(request, timeout=_remaining(deadline), metadata=metadata)
                return Result(r.text, list(r.token_ids), r.finish_reason, stats_dict(r.stats))
            except grpc.aio.AioRpcError as e:
                failures += 1
                await self._retry_or_raise(e, failures, deadline)

    async def stream(self, prompt: str | None = None, messages: Iterable | None = None, *,
                     timeout: float | None = None, token: str | None = None,
                     **params: Unpack[Params]) -> AsyncIterator[Chunk]:
        """Chunks of new token ids and text as they are committed; `token` overrides the client's."""
        request = build_request(prompt, messages, **params)
        metadata = self._auth(token)
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        failures, started = 0, False
        while True:
            call = self._stub.GenerateStream(request, timeout=_remaining(deadline), metadata=metadata)
            try:
                async for m in call:
                    started = True
                    final = bool(m.finish_reason)
                    yield Chunk(list(m.token_ids), m.text, m.finish_reason or None, stats_dict(m.stats) if final else None)
                return
            except grpc.aio.AioRpcError as e:
                failures += 1
                if started:
                    raise SPDError(e.code(), e.details() or str(e)) from None
                await self._retry_or_raise(e, failures, deadline)
            finally:
                call.cancel()  # no-op when finished; stops the server when the consumer quits early

    async def info(self, timeout: float | None = None, token: str | None = None) -> dict:
        """What the server runs (see SPDClient.info)."""
        try:
            reply = await self._stub.GetInfo(spd_pb2.GetInfoRequest(), timeout=timeout or self.timeout,
                                             metadata=self._auth(token))
        except grpc.aio.AioRpcError as e:
            raise SPDError(e.code(), e.details() or str(e)) from None
        return stats_dict(reply)

    def _auth(self, token: str | None):
        return (("authorization", f"Bearer {token}"),) if token else self._metadata

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> AsyncSPDClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def _retry_or_raise(self, error: grpc.aio.AioRpcError, failures: int, deadline: float) -> None:
        code, details = error.code(), error.details() or str(error)
        if code not in RETRYABLE or failures > self.retries:
            raise SPDError(code, details) from None
        delay = min(self.max_backoff, self.backoff * 2 ** (failures - 1)) * self._rng.uniform(0.5, 1.0)
        if time.monotonic() + delay >= deadline:
            raise SPDError(grpc.StatusCode.DEADLINE_EXCEEDED, f"deadline reached while retrying: {details}") from None
        await asyncio.sleep(delay)


def _remaining(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise SPDError(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline reached before the call")
    return left

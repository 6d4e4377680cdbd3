"""The OpenAI-compatible HTTP API: a FastAPI gateway that forwards each call to the gRPC orchestrator.

Routes: POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /health (readiness:
the pipeline is whole), GET /live (liveness: this process answers).

A gateway rather than a second server inside the orchestrator: the orchestrator keeps one API to
validate, authenticate and cancel (gRPC), the gateway holds no state and restarts in a second, and
it can run next to the orchestrator (`spd up --http-port`) or anywhere that reaches it. The
client's `Authorization: Bearer` header is passed through, so the orchestrator's `--token` guards
both APIs. A client that disconnects cancels its gRPC call, and the orchestrator stops the request.

Responses carry SPD's own figures in an extra `spd` field (cycles, α, S0, accepts, rejects,
recoveries, ...) and llama.cpp-style `timings`. Errors use OpenAI's error JSON with the HTTP code
of the gRPC status: 400 invalid, 401 bad token, 404 unknown model, 429 queue full, 503 pipeline
unavailable, 504 deadline.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from typing import AsyncIterator

import grpc
from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse

from spd.http_api.schema import ChatCompletionRequest, CompletionRequest, OpenAIRequest, Unsupported
from spd.runtime.health import check
from spd_client.aio import AsyncSPDClient
from spd_client.client import SPDError

HTTP_OF = {grpc.StatusCode.INVALID_ARGUMENT: (400, "invalid_request_error"),
           grpc.StatusCode.UNAUTHENTICATED: (401, "authentication_error"),
           grpc.StatusCode.PERMISSION_DENIED: (403, "permission_error"),
           grpc.StatusCode.NOT_FOUND: (404, "not_found_error"),
           grpc.StatusCode.RESOURCE_EXHAUSTED: (429, "rate_limit_error"),
           grpc.StatusCode.UNAVAILABLE: (503, "server_error"),
           grpc.StatusCode.DEADLINE_EXCEEDED: (504, "timeout_error")}  # anything else: 500
SPD_FIELDS = ("n", "cycles", "alpha", "theoretical_speedup", "accepts", "rejects", "flushes", "recoveries",
              "drafts", "queue_ms", "batch")  # Stats fields shown in the extra `spd` object


def error(status: int, message: str, kind: str = "invalid_request_error", param: str | None = None,
          code: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": code}}, status)


def _from_grpc(e: SPDError) -> tuple[int, str]:
    return HTTP_OF.get(e.code, (500, "server_error"))


def make_app(grpc_address: str, model_name: str, timeout_s: float = 600.0) -> FastAPI:
    state: dict = {}

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        state["client"] = AsyncSPDClient(grpc_address, timeout=timeout_s, retries=0)  # retries: the caller's job
        yield
        await state["client"].close()

    app = FastAPI(title="SPD serve (OpenAI-compatible)", lifespan=lifespan)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):  # FastAPI's 422 -> OpenAI's 400
        first = exc.errors()[0] if exc.errors() else {}
        param = ".".join(str(x) for x in first.get("loc", [])[1:]) or None
        return error(400, f"{param or 'body'}: {first.get('msg', 'invalid request')}", param=param)

    @app.get("/live")
    async def live():
        return {"status": "ok"}

    @app.get("/health")
    async def health():
        ok = await run_in_threadpool(check, grpc_address, 2.0)
        return JSONResponse({"status": "ok" if ok else "unavailable"}, 200 if ok else 503)

    @app.get("/v1/models")
    async def models(request: Request):
        card = _model_card(model_name)
        with contextlib.suppress(SPDError):  # the orchestrator's GetInfo: n, context, limits, draft
            card["spd"] = await state["client"].info(timeout=5, token=_bearer(request))
        return {"object": "list", "data": [card]}

    @app.get("/v1/models/{name:path}")
    async def model(name: str):
        if name != model_name:
            return error(404, f"model '{name}' does not exist; this server serves '{model_name}'", code="model_not_found")
        return _model_card(model_name)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatCompletionRequest, request: Request):
        return await _complete(body, request, chat=True)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        return await _complete(body, request, chat=False)

    async def _complete(body: OpenAIRequest, request: Request, chat: bool):
        if body.model and body.model != model_name:
            return error(404, f"model '{body.model}' does not exist; this server serves '{model_name}'",
                         param="model", code="model_not_found")
        try:
            body.check()
            kw = {**body.inputs(), **body.params()}
        except Unsupported as e:
            return error(400, str(e), param=e.field)
        kw["token"] = _bearer(request)  # passed through: the orchestrator's --token decides
        meta = {"id": ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24], "created": int(time.time()),
                "model": model_name}
        client: AsyncSPDClient = state["client"]
        try:
            if body.stream:
                stream = _sse(client, kw, meta, chat, body.include_usage)
                first = await anext(stream)  # the first chunk decides the status: a bad request is a 4xx
                return StreamingResponse(_prepend(first, stream), media_type="text/event-stream",
                                         headers={"Cache-Control": "no-cache"})
            result = await client.generate(**kw)
        except SPDError as e:
            status, kind = _from_grpc(e)
            return error(status, e.details, kind)
        choice = ({"index": 0, "message": {"role": "assistant", "content": result.text}} if chat else
                  {"index": 0, "text": result.text, "logprobs": None})
        return {**meta, "object": "chat.completion" if chat else "text_completion",
                "choices": [{**choice, "finish_reason": _finish(result.finish_reason)}],
                "usage": _usage(result.stats), **_figures(result.stats)}

    return app


async def _sse(client: AsyncSPDClient, kw: dict, meta: dict, chat: bool, include_usage: bool) -> AsyncIterator[str]:
    """Server-sent events: one `data: {chunk}` per committed text delta, then `data: [DONE]`."""
    kind = "chat.completion.chunk" if chat else "text_completion"

    def event(choices: list, **extra) -> str:
        return f"data: {json.dumps({**meta, 'object': kind, 'choices': choices, **extra})}\n\n"

    def choice(text: str, finish: str | None, first: bool = False) -> dict:
        if chat:
            delta = {"role": "assistant", "content": text} if first else ({"content": text} if text else {})
            return {"index": 0, "delta": delta, "finish_reason": finish}
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}

    first = True
    try:
        async for chunk in client.stream(**kw):
            if chunk.finish_reason is None and not chunk.text and not first:
                continue
            finish = _finish(chunk.finish_reason) if chunk.finish_reason else None
            # the last content chunk carries SPD's figures; with include_usage a usage chunk follows
            yield event([choice(chunk.text, finish, first)], **(_figures(chunk.stats or {}) if finish else {}))
            first = False
            if finish and include_usage:
                yield event([], usage=_usage(chunk.stats or {}))
    except SPDError as e:
        if first:
            raise
        status, kind_ = _from_grpc(e)  # headers are sent: the error travels as an event
        yield f"data: {json.dumps({'error': {'message': e.details, 'type': kind_, 'code': status}})}\n\n"
    yield "data: [DONE]\n\n"


async def _prepend(first: str, rest: AsyncIterator[str]) -> AsyncIterator[str]:
    yield first
    async for item in rest:
        yield item


def _bearer(request: Request) -> str | None:
    auth = request.headers.get("authorization", "")
    return auth[7:].strip() if auth.lower().startswith("bearer ") else None


def _finish(reason: str) -> str:
    return reason if reason in ("stop", "length") else "stop"


def _usage(stats: dict) -> dict:
    prompt, completion = int(stats.get("prompt_tokens", 0)), int(stats.get("generated_tokens", 0))
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _figures(stats: dict) -> dict:
    """SPD's own figures and llama.cpp-style timings for one response."""
    decode_ms, n = float(stats.get("decode_ms", 0.0)), int(stats.get("generated_tokens", 0))
    return {"spd": {k: stats[k] for k in SPD_FIELDS if k in stats},
            "timings": {"prompt_n": int(stats.get("prompt_tokens", 0)), "prompt_ms": float(stats.get("prefill_ms", 0.0)),
                        "predicted_n": n, "predicted_ms": decode_ms,
                        "predicted_per_second": float(stats.get("tokens_per_s", 0.0))}}


def _model_card(name: str) -> dict:
    return {"id": name, "object": "model", "created": 0, "owned_by": "spd-serve"}

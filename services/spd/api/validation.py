"""Validation of spd.v1.GenerateRequest: pure, no I/O, so the servicer and the tests share it.

validate() returns a ValidRequest with every default filled in, or raises InvalidRequest whose
message says what is wrong (the servicer sends it as INVALID_ARGUMENT).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from spd_client.v1 import spd_pb2

ROLES = frozenset({"system", "user", "assistant"})  # accepted chat roles
MAX_TEMPERATURE = 100.0  # above this sampling is uniform noise; almost surely a client bug
MAX_STOP = 16  # stop strings per request
MAX_STOP_CHARS = 256  # characters per stop string
MAX_REQUEST_ID_CHARS = 128  # characters of a client-chosen request id


@dataclass(frozen=True)
class Limits:
    max_tokens: int = 4096  # largest max_tokens a client may ask for
    default_max_tokens: int = 256  # max_tokens when the request leaves it unset
    max_prompt_chars: int = 200_000  # prompt length, or all message contents together
    max_messages: int = 1024  # messages per conversation

    def __post_init__(self):
        if not 1 <= self.default_max_tokens <= self.max_tokens:
            raise ValueError(f"default max_tokens {self.default_max_tokens} must be in 1..{self.max_tokens} (the largest allowed)")


@dataclass(frozen=True)
class ValidRequest:
    prompt: str | None  # the prompt, or None when messages are given
    messages: tuple[tuple[str, str], ...]  # (role, content) pairs; empty when prompt is given
    raw: bool  # send prompt as is, without the chat template (prompt only)
    max_tokens: int  # 1..Limits.max_tokens
    temperature: float  # 0 = greedy
    top_k: int  # 0 = off
    top_p: float  # (0, 1]; 1 = off
    seed: int  # uint64
    stop: tuple[str, ...]  # stop strings
    request_id: str  # client-chosen id, "" if none
    coupling: str = "rejection"  # sampled verification: rejection | gumbel

    def chat(self) -> list[dict[str, str]]:
        """Messages in the form tokenizer.apply_chat_template takes."""
        return [{"role": role, "content": content} for role, content in self.messages]


class InvalidRequest(ValueError):
    """The request breaks a rule; str(e) / e.message is the explanation for the client."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


def validate(req: spd_pb2.GenerateRequest, limits: Limits = Limits()) -> ValidRequest:
    """Check every field of req against the rules and limits; raise InvalidRequest on the first violation."""
    prompt, messages = _check_input(req, limits)
    return ValidRequest(
        prompt=prompt, messages=messages, raw=req.raw,
        max_tokens=_check_max_tokens(req, limits),
        temperature=_check_temperature(req.temperature),
        top_k=_check_top_k(req.top_k),
        top_p=_check_top_p(req),
        seed=int(req.seed),
        stop=_check_stop(req.stop),
        request_id=_check_request_id(req.request_id),
        coupling=_check_coupling(req.coupling),
    )


def _check_coupling(coupling: str) -> str:
    if coupling in ("", "rejection", "gumbel"):
        return coupling or "rejection"
    raise InvalidRequest(f"coupling is {coupling[:40]!r}; it must be 'rejection' or 'gumbel' (unset = rejection)")


def _check_input(req, limits: Limits) -> tuple[str | None, tuple[tuple[str, str], ...]]:
    if bool(req.prompt) == bool(req.messages):
        raise InvalidRequest("exactly one of prompt and messages must be non-empty")
    if req.prompt:
        if len(req.prompt) > limits.max_prompt_chars:
            raise InvalidRequest(f"prompt is {len(req.prompt)} characters; the limit is {limits.max_prompt_chars}")
        return req.prompt, ()
    if req.raw:
        raise InvalidRequest("raw applies to prompt only, not to messages")
    return None, _check_messages(req.messages, limits)


def _check_messages(messages, limits: Limits) -> tuple[tuple[str, str], ...]:
    if len(messages) > limits.max_messages:
        raise InvalidRequest(f"{len(messages)} messages; the limit is {limits.max_messages}")
    for i, m in enumerate(messages):
        if m.role not in ROLES:
            raise InvalidRequest(f"messages[{i}].role is {m.role[:32]!r}; expected one of {sorted(ROLES)}")
        if not m.content:
            raise InvalidRequest(f"messages[{i}].content is empty")
    if messages[-1].role != "user":
        raise InvalidRequest(f"the last message must have role 'user', not {messages[-1].role!r}")
    total = sum(len(m.content) for m in messages)
    if total > limits.max_prompt_chars:
        raise InvalidRequest(f"messages total {total} characters; the limit is {limits.max_prompt_chars}")
    return tuple((m.role, m.content) for m in messages)


def _check_max_tokens(req, limits: Limits) -> int:
    if not req.HasField("max_tokens"):
        return limits.default_max_tokens
    if not 1 <= req.max_tokens <= limits.max_tokens:
        raise InvalidRequest(f"max_tokens is {req.max_tokens}; it must be in 1..{limits.max_tokens}")
    return req.max_tokens


def _check_temperature(t: float) -> float:
    if not (math.isfinite(t) and 0.0 <= t <= MAX_TEMPERATURE):
        raise InvalidRequest(f"temperature is {t}; it must be a finite number in [0, {MAX_TEMPERATURE:g}]")
    return float(t)


def _check_top_k(k: int) -> int:
    if k < 0:
        raise InvalidRequest(f"top_k is {k}; it must be >= 0 (0 = off)")
    return int(k)


def _check_top_p(req) -> float:
    if not req.HasField("top_p"):
        return 1.0
    p = req.top_p
    if not 0.0 < p <= 1.0:  # also false for NaN
        raise InvalidRequest(f"top_p is {p}; it must be in (0, 1] (unset = 1)")
    return float(p)


def _check_stop(stop) -> tuple[str, ...]:
    if len(stop) > MAX_STOP:
        raise InvalidRequest(f"{len(stop)} stop strings; the limit is {MAX_STOP}")
    for i, s in enumerate(stop):
        if not 1 <= len(s) <= MAX_STOP_CHARS:
            raise InvalidRequest(f"stop[{i}] has {len(s)} characters; it must have 1..{MAX_STOP_CHARS}")
    return tuple(stop)


def _check_request_id(rid: str) -> str:
    if len(rid) > MAX_REQUEST_ID_CHARS:
        raise InvalidRequest(f"request_id has {len(rid)} characters; the limit is {MAX_REQUEST_ID_CHARS}")
    if not rid.isprintable():
        raise InvalidRequest("request_id must contain printable characters only")
    return rid

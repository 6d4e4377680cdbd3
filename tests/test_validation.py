"""spd.api.validation: every rule of a GenerateRequest, and validate() never fails any other way."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spd.api.validation import InvalidRequest, Limits, ValidRequest, validate
from spd_client.v1 import spd_pb2

LIMITS = Limits(max_tokens=100, default_max_tokens=10, max_prompt_chars=50)


def req(**fields) -> spd_pb2.GenerateRequest:
    messages = fields.pop("messages", [])
    r = spd_pb2.GenerateRequest(**fields)
    for role, content in messages:
        r.messages.add(role=role, content=content)
    return r


def rejected(r, limits=LIMITS) -> str:
    with pytest.raises(InvalidRequest) as e:
        validate(r, limits)
    return e.value.message


def test_minimal_prompt_gets_every_default():
    v = validate(req(prompt="hi"), LIMITS)
    assert v == ValidRequest(prompt="hi", messages=(), raw=False, max_tokens=10, temperature=0.0, top_k=0,
                             top_p=1.0, seed=0, stop=(), request_id="")


def test_full_request_keeps_its_values():
    v = validate(req(messages=[("system", "be brief"), ("user", "hi")], max_tokens=100, temperature=0.7,
                     top_k=40, top_p=0.5, seed=2**64 - 1, stop=["\n\n", "END"], request_id="abc-1"), LIMITS)
    assert v.prompt is None and v.chat() == [{"role": "system", "content": "be brief"},
                                             {"role": "user", "content": "hi"}]
    assert (v.max_tokens, v.top_k, v.top_p, v.seed, v.stop, v.request_id) == (100, 40, 0.5, 2**64 - 1,
                                                                             ("\n\n", "END"), "abc-1")
    assert v.temperature == pytest.approx(0.7)


def test_default_limits():
    assert Limits() == Limits(max_tokens=4096, default_max_tokens=256, max_prompt_chars=200_000)
    assert validate(req(prompt="x")).max_tokens == 256


def test_a_configured_default_max_tokens_applies_when_unset_and_must_fit_the_limit():
    assert validate(req(prompt="x"), Limits(default_max_tokens=4)).max_tokens == 4
    for bad in (0, 4097):
        with pytest.raises(ValueError, match="must be in 1..4096"):
            Limits(default_max_tokens=bad)


@pytest.mark.parametrize("fields, says", [
    ({}, "exactly one of prompt and messages"),
    ({"prompt": "hi", "messages": [("user", "hi")]}, "exactly one of prompt and messages"),
    ({"prompt": "x" * 51}, "prompt is 51 characters"),
    ({"messages": [("user", "x" * 30), ("assistant", "y"), ("user", "x" * 30)]}, "messages total 61"),
    ({"messages": [("robot", "hi")]}, "messages[0].role"),
    ({"messages": [("user", "")]}, "messages[0].content is empty"),
    ({"messages": [("user", "hi"), ("assistant", "yo")]}, "last message must have role 'user'"),
    ({"messages": [("user", "hi")], "raw": True}, "raw applies to prompt only"),
    ({"prompt": "hi", "max_tokens": 0}, "max_tokens is 0"),
    ({"prompt": "hi", "max_tokens": -5}, "max_tokens is -5"),
    ({"prompt": "hi", "max_tokens": 101}, "max_tokens is 101"),
    ({"prompt": "hi", "temperature": -0.1}, "temperature"),
    ({"prompt": "hi", "temperature": math.nan}, "temperature"),
    ({"prompt": "hi", "temperature": math.inf}, "temperature"),
    ({"prompt": "hi", "temperature": 101.0}, "temperature"),
    ({"prompt": "hi", "top_k": -1}, "top_k is -1"),
    ({"prompt": "hi", "top_p": 0.0}, "top_p is 0.0"),
    ({"prompt": "hi", "top_p": 1.5}, "top_p is 1.5"),
    ({"prompt": "hi", "top_p": math.nan}, "top_p is nan"),
    ({"prompt": "hi", "stop": ["a"] * 17}, "17 stop strings"),
    ({"prompt": "hi", "stop": [""]}, "stop[0] has 0 characters"),
    ({"prompt": "hi", "stop": ["ok", "x" * 257]}, "stop[1] has 257 characters"),
    ({"prompt": "hi", "request_id": "r" * 129}, "request_id has 129 characters"),
    ({"prompt": "hi", "request_id": "a\nb"}, "printable"),
])
def test_each_rule_rejects_with_a_message_naming_the_problem(fields, says):
    assert says in rejected(req(**fields))


def test_boundaries_are_accepted():
    v = validate(req(prompt="x" * 50, max_tokens=1, temperature=100.0, top_p=1.0, stop=["s" * 256] * 16,
                     request_id="r" * 128), LIMITS)
    assert (v.max_tokens, v.temperature, v.top_p, len(v.stop)) == (1, 100.0, 1.0, 16)


def test_raw_prompt_is_allowed():
    assert validate(req(prompt="<|im_start|>user", raw=True), LIMITS).raw


# --------------------------------------------------------------------------------- property test

floats = st.floats(allow_nan=True, allow_infinity=True, width=32)
texts = st.text(max_size=70)
messages = st.lists(st.tuples(st.sampled_from(["user", "assistant", "system", "", "tool"]), texts), max_size=4)


@st.composite
def requests(draw) -> spd_pb2.GenerateRequest:
    r = req(prompt=draw(texts), messages=draw(messages), raw=draw(st.booleans()),
            temperature=draw(floats), top_k=draw(st.integers(-2**31, 2**31 - 1)), seed=draw(st.integers(0, 2**64 - 1)),
            stop=draw(st.lists(st.text(max_size=300), max_size=18)), request_id=draw(st.text(max_size=140)))
    if draw(st.booleans()):
        r.max_tokens = draw(st.integers(-2**31, 2**31 - 1))
    if draw(st.booleans()):
        r.top_p = draw(floats)
    return r


@settings(max_examples=1000, deadline=None, derandomize=True, database=None)
@given(requests())
def test_validate_returns_a_valid_request_or_raises_invalid_request(r):
    try:
        v = validate(r, LIMITS)
    except InvalidRequest as e:
        assert e.message
        return
    assert isinstance(v, ValidRequest)
    assert (v.prompt is None) != (not v.messages)
    assert 1 <= v.max_tokens <= LIMITS.max_tokens
    assert math.isfinite(v.temperature) and v.temperature >= 0 and v.top_k >= 0 and 0 < v.top_p <= 1

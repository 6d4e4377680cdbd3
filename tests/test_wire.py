"""spd.wire: tensors survive the trip bit for bit, and malformed frames only ever raise WireError."""

from __future__ import annotations

import msgpack
import pytest
import torch
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st

from spd import wire
from spd.wire import KINDS, Message, WireError, decode, encode, sparse

HEADER = {"rid": "r1", "epoch": 3, "pos": 17}


def roundtrip(kind="HIDDEN", header=HEADER, tensors=None, copy=False) -> Message:
    frames = encode(kind, header, tensors)
    return decode([bytes(memoryview(f)) for f in frames], copy=copy)  # as bytes, like a copying recv


def seeded(dtype, shape, seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype in (torch.int64, torch.int32):
        return torch.randint(-2**31, 2**31 - 1, shape, generator=g).to(dtype)
    return torch.randn(shape, generator=g).to(dtype)


@pytest.mark.parametrize("dtype", list(wire.DTYPES.values()))
@pytest.mark.parametrize("shape", [(), (0,), (3, 0, 2), (5,), (2, 3, 4)])
def test_every_dtype_and_shape_round_trips_bit_exact(dtype, shape):
    t = seeded(dtype, shape)
    got = roundtrip(tensors={"x": t}).tensors["x"]
    assert got.dtype == dtype and tuple(got.shape) == shape
    as_bits = (lambda x: x.view(torch.uint8)) if dtype == torch.bool else (lambda x: x)  # noqa: E731
    assert torch.equal(as_bits(got), as_bits(t))


def test_bfloat16_keeps_its_exact_bits():
    t = torch.tensor([1.0, -2.5, 3.140625, float("inf"), 1e-38], dtype=torch.bfloat16)
    got = roundtrip(tensors={"h": t}).tensors["h"]
    assert torch.equal(got.view(torch.int16), t.view(torch.int16))


def test_header_fields_and_several_tensors_survive():
    tensors = {"hidden": seeded(torch.float16, (4, 8)), "ids": torch.arange(4), "mask": torch.ones(4, dtype=torch.bool)}
    m = roundtrip("ANCHORS", {**HEADER, "layers": [0, 8], "note": "x"}, tensors)
    assert (m.kind, m.rid, m.epoch, m.pos) == ("ANCHORS", "r1", 3, 17)
    assert m.header == {**HEADER, "layers": [0, 8], "note": "x"}
    assert all(torch.equal(m.tensors[k], v) for k, v in tensors.items())


def test_non_contiguous_and_grad_tensors_are_sent_as_their_values():
    base = torch.randn(4, 6, generator=torch.Generator().manual_seed(1), requires_grad=True)
    t = base.t()[1:3]
    assert torch.equal(roundtrip(tensors={"t": t}).tensors["t"], t.detach())


def test_decoded_tensors_share_writable_frames_and_copy_on_request():
    frames = encode("HIDDEN", HEADER, {"x": torch.arange(4, dtype=torch.float32)})
    buf = bytearray(memoryview(frames[2]))
    shared = decode([frames[0], frames[1], buf]).tensors["x"]
    owned = decode([frames[0], frames[1], buf], copy=True).tensors["x"]
    buf[0:4] = torch.tensor([9.0]).numpy().tobytes()
    assert shared[0].item() == 9.0 and owned[0].item() == 0.0


def test_a_distribution_travels_sparse_and_comes_back_dense():
    p = torch.zeros(10)
    p[[2, 7]] = torch.tensor([0.25, 0.75])
    m = roundtrip("EXIT", HEADER, sparse(p))
    assert m.tensors["ids"].tolist() == [2, 7] and torch.equal(m.dense(10), p)
    assert roundtrip("EXIT", HEADER).dense(10) is None  # greedy: nothing sent


def test_every_kind_is_accepted_and_unknown_kinds_are_not():
    for kind in KINDS:
        assert roundtrip(kind).kind == kind
    frames = encode("DRAFT", HEADER)
    with pytest.raises(WireError, match="unknown message kind"):
        decode([b"BOGUS", frames[1]])
    with pytest.raises(WireError, match="unknown message kind"):
        encode("BOGUS", HEADER)


# ------------------------------------------------------------------------------ malformed input

def frames_with(header: dict, *tensor_frames: bytes, kind=b"HIDDEN") -> list:
    return [kind, msgpack.packb(header), *tensor_frames]


def entry(name="x", dtype="float32", shape=(2,), frame=2) -> dict:
    return {"name": name, "dtype": dtype, "shape": list(shape), "frame": frame}


@pytest.mark.parametrize("frames, says", [
    ([b"HIDDEN"], "frames"),
    (frames_with(HEADER)[:1] + [b"\xc1"], "bad msgpack"),
    (frames_with(HEADER)[:1] + [msgpack.packb([1, 2])], "must be a map"),
    (frames_with({"epoch": 1, "pos": 0}), "'rid'"),
    (frames_with({"rid": "r", "pos": 0}), "'epoch'"),
    (frames_with({"rid": "r", "epoch": 1}), "'pos'"),
    (frames_with({"rid": 5, "epoch": 1, "pos": 0}), "'rid'"),
    (frames_with({"rid": "r", "epoch": "1", "pos": 0}), "'epoch'"),
    (frames_with({"rid": "r", "epoch": True, "pos": 0}), "'epoch'"),
    (frames_with({"rid": "r", "epoch": 1, "pos": -1}), "negative"),
    (frames_with({**HEADER, "tensors": [entry()]}, b"\0" * 7), "needs 8 bytes, frame has 7"),
    (frames_with({**HEADER, "tensors": [entry()]}, b"\0" * 9), "needs 8 bytes, frame has 9"),
    (frames_with({**HEADER, "tensors": [entry(dtype="float64")]}, b"\0" * 16), "dtype 'float64' not allowed"),
    (frames_with({**HEADER, "tensors": [entry(dtype="object")]}, b"\0" * 8), "not allowed"),
    (frames_with({**HEADER, "tensors": [entry(shape=(-1,))]}, b"\0" * 8), "bad shape"),
    (frames_with({**HEADER, "tensors": [entry(shape=(1,) * 9)]}, b"\0" * 4), "bad shape"),
    (frames_with({**HEADER, "tensors": [entry(frame=1)]}, b"\0" * 8), "bad frame index"),
    (frames_with({**HEADER, "tensors": [entry(frame=3)]}, b"\0" * 8), "bad frame index"),
    (frames_with({**HEADER, "tensors": [entry(), entry("y")]}, b"\0" * 8, b"\0" * 8), "duplicate"),
    (frames_with({**HEADER, "tensors": []}, b"\0" * 8), "0 tensors listed but 1"),
    (frames_with({**HEADER, "tensors": "x"}), "must be a list"),
    (frames_with(HEADER, kind=b"\xff\xfe"), "not ASCII"),
    (frames_with(HEADER, kind=b"H" * 33), "kind frame 33 bytes"),
    ([b"DRAFT", msgpack.packb(HEADER), *([b""] * (wire.MAX_TENSORS + 1))], "frames, expected"),
    ([b"DRAFT", msgpack.packb(HEADER), object()], "not a buffer"),
])
def test_malformed_messages_raise_wire_error_saying_why(frames, says):
    with pytest.raises(WireError, match=says.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        decode(frames)


def test_oversized_header_is_rejected_before_unpacking(monkeypatch):
    big = msgpack.packb({**HEADER, "pad": "x" * 2000})
    monkeypatch.setattr(wire, "MAX_HEADER_BYTES", 1000)
    with pytest.raises(WireError, match="header .* bytes > 1000"):
        decode([b"DRAFT", big])
    with pytest.raises(WireError, match="header .* bytes > 1000"):
        encode("DRAFT", {**HEADER, "pad": "x" * 2000})


def test_oversized_message_is_rejected(monkeypatch):
    monkeypatch.setattr(wire, "MAX_MESSAGE_BYTES", 1024)
    with pytest.raises(WireError, match="message .* bytes > 1024"):
        encode("HIDDEN", HEADER, {"x": torch.zeros(512)})
    frames = frames_with({**HEADER, "tensors": [entry(shape=(512,))]}, b"\0" * 2048)
    with pytest.raises(WireError, match="message .* bytes > 1024"):
        decode(frames)


@pytest.mark.parametrize("header, tensors, says", [
    ({"epoch": 0, "pos": 0}, None, "'rid'"),
    ({**HEADER, "tensors": []}, None, "reserved"),
    ({**HEADER, "obj": object()}, None, "not msgpack-serialisable"),
    (HEADER, {"x": torch.zeros(2, dtype=torch.float64)}, "not allowed"),
    (HEADER, {"x": [1, 2]}, "torch.Tensor"),
])
def test_encode_refuses_bad_input(header, tensors, says):
    with pytest.raises(WireError, match=says):
        encode("HIDDEN", header, tensors)


def test_a_truncated_tensor_frame_is_rejected():
    frames = [bytes(memoryview(f)) for f in encode("HIDDEN", HEADER, {"x": torch.zeros(3, 4)})]
    frames[2] = frames[2][:-1]
    with pytest.raises(WireError, match="needs 48 bytes, frame has 47"):
        decode(frames)


@settings(max_examples=500, deadline=None, derandomize=True, database=None)
@given(st.lists(st.binary(max_size=64), max_size=6))
def test_arbitrary_byte_frames_only_ever_raise_wire_error(frames):
    try:
        m = decode(frames)
    except WireError:
        return
    assert isinstance(m, Message) and m.kind in KINDS


scalars = st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.text(max_size=8)
json_like = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                         | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=10)


@settings(max_examples=500, deadline=None, derandomize=True, database=None)
@given(st.sampled_from(sorted(KINDS) + ["NOPE"]),
       st.dictionaries(st.sampled_from(["rid", "epoch", "pos", "tensors", "x"]), json_like, max_size=5),
       st.lists(st.binary(max_size=32), max_size=3))
def test_structured_but_wrong_headers_only_ever_raise_wire_error(kind, header, tensor_frames):
    try:
        decode([kind.encode(), msgpack.packb(header), *tensor_frames])
    except WireError:
        pass


VALID = [bytes(memoryview(f)) for f in encode("HIDDEN", HEADER, {"a": torch.arange(6).reshape(2, 3),
                                                                 "b": torch.ones(2, dtype=torch.bfloat16)})]


@settings(max_examples=500, deadline=None, derandomize=True, database=None)
@given(st.integers(0, len(VALID) - 1), st.integers(0, 200), st.binary(min_size=0, max_size=4), st.booleans())
def test_corrupting_a_valid_message_only_ever_raises_wire_error(index, at, patch, truncate):
    frames = list(VALID)
    f = frames[index]
    at = min(at, len(f))
    frames[index] = f[:at] + patch if truncate else f[:at] + patch + f[at + len(patch):]
    try:
        m = decode(frames)
    except WireError:
        return
    assert m.kind in KINDS and all(isinstance(t, torch.Tensor) for t in m.tensors.values())


# ------------------------------------------------------------------------------------ real zmq

@pytest.fixture
def push_pull():
    ctx = zmq.Context()
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    for s in (pull, push):
        s.setsockopt(zmq.LINGER, 0)
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    push.connect(f"tcp://127.0.0.1:{port}")
    yield push, pull
    push.close()
    pull.close()
    ctx.term()


def test_zmq_push_pull_round_trip_over_loopback_tcp(push_pull):
    push, pull = push_pull
    big = seeded(torch.bfloat16, (64, 1024))  # 128 KiB: above pyzmq's zero-copy threshold
    small = torch.tensor([7, 8, 9], dtype=torch.int32)
    assert wire.send(push, "HIDDEN", HEADER, {"big": big, "small": small}, timeout_ms=2000)
    m = wire.recv(pull, timeout_ms=5000)
    assert m is not None and (m.kind, m.rid, m.epoch, m.pos) == ("HIDDEN", "r1", 3, 17)
    assert torch.equal(m.tensors["big"].view(torch.int16), big.view(torch.int16))
    assert torch.equal(m.tensors["small"], small)


def test_recv_times_out_with_none_and_garbage_raises_wire_error(push_pull):
    push, pull = push_pull
    assert wire.recv(pull, timeout_ms=50) is None
    push.send_multipart([b"garbage", b"\x00\x01"])
    with pytest.raises(WireError):
        wire.recv(pull, timeout_ms=5000)
    assert wire.send(push, "DRAFT", HEADER)
    assert wire.recv(pull, timeout_ms=5000).kind == "DRAFT"  # the socket still works after garbage


def test_send_gives_up_after_its_timeout_when_no_peer_is_connected():
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.bind("inproc://nobody")
    try:
        assert wire.send(push, "HEARTBEAT", HEADER, timeout_ms=20) is False
    finally:
        push.close()
        ctx.term()


def test_epochs_only_grow_follow_the_clock_and_far_future_ones_are_implausible():
    now = wire.next_epoch(0)
    assert wire.next_epoch(now) > now and wire.next_epoch(now + 10**9) == now + 10**9 + 1  # never back
    assert wire.plausible_epoch(now) and wire.plausible_epoch(wire.next_epoch(now))
    assert not wire.plausible_epoch(2 ** 53)  # the forged CANCEL that used to wedge a stage

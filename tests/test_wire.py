"""spd.wire: every kind round-trips as its typed message, tensors bit for bit, and malformed frames
(a missing, unknown or wrong-typed field included) only ever raise WireError."""

from __future__ import annotations

import dataclasses

import msgpack
import pytest
import torch
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st

from spd import wire
from spd.core.sampling import SamplingParams
from spd.runtime.topology import Topology
from spd.wire import KINDS, MESSAGES, Message, SparseDist, WireError, decode, encode

ROUTES = Topology(("tcp://s1:1", "tcp://s2:2"), "tcp://d:3", "tcp://o:4")
REQ = {"rid": "r1", "epoch": 3, "pos": 17, "slot": 2}  # what names the request


def seeded(dtype, shape, seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype in (torch.int64, torch.int32):
        return torch.randint(-2**31, 2**31 - 1, shape, generator=g).to(dtype)
    return torch.randn(shape, generator=g).to(dtype)


def dist() -> SparseDist:
    p = torch.zeros(10)
    p[[2, 7]] = torch.tensor([0.25, 0.75])
    return SparseDist.of(p)


EXAMPLES: list[Message] = [  # one of each kind, every optional field set
    wire.Hello(role="stage", index=1, incarnation="abc", pid=42, endpoint="tcp://s1:1", dropped={"stale": 2}),
    wire.Heartbeat(role="drafter", index=0, incarnation="def", pid=43, endpoint="tcp://d:3", dropped={}),
    wire.Prefill(**REQ, params=SamplingParams(temperature=0.7, top_k=5, seed=9), prompt_len=3, s0=1, draft_limit=40,
                 routes=ROUTES, ids=torch.tensor([5, 6, 7, 8])),
    wire.Hidden(**REQ, base=17, tokens=[5, 6], t_ms=1.5, stage_ms=[1.5], batch=[2], h=seeded(torch.bfloat16, (2, 8))),
    wire.Anchors(**REQ, base=17, tokens=[5, 6], t_ms=1.5, stage_ms=[1.5], batch=[1], stage=1, count=2,
                 anchors={0: seeded(torch.float32, (2, 8), 1), 12: seeded(torch.float32, (2, 8), 2)}),
    wire.Draft(**REQ, base=16, token=9, t_ms=0.25, fill=2, batch=3, q=dist()),
    wire.Exit(**REQ, base=16, tokens=[5], t_ms=2.0, stage_ms=[1.0, 2.0], batch=[1, 1], argmax=7, dist=dist()),
    wire.Reseed(**REQ, base=17, token=11),
    wire.Cancel(rid="r1", epoch=3, slot=2),
    wire.Assign(epoch=3, role="stage", index=2, routes=ROUTES),
    wire.Error(**REQ, role="stage", index=2, reason="KV length 7 != position 4"),
]
BY_KIND = {m.kind: m for m in EXAMPLES}


def as_bytes(frames) -> list[bytes]:
    return [bytes(memoryview(f)) for f in frames]  # like a copying recv


def roundtrip(message: Message, copy=False) -> Message:
    return decode(as_bytes(encode(message)), copy=copy)


def same(a, b) -> bool:
    """Field-by-field equality, tensors bit for bit (dtype and shape too)."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and \
            torch.equal(a.view(torch.uint8) if a.dtype == torch.bool else a, b.view(torch.uint8) if b.dtype == torch.bool else b)
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        return type(a) is type(b) and all(same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def header_of(message: Message) -> dict:
    return msgpack.unpackb(encode(message)[1])


def test_every_kind_has_one_message_class_and_round_trips_as_it():
    assert set(MESSAGES) == KINDS == set(BY_KIND) and len(KINDS) == 11
    for message in EXAMPLES:
        got = roundtrip(message)
        assert type(got) is type(message) and got.kind == message.kind
        assert same(got, message), message.kind


def test_the_header_holds_exactly_the_non_tensor_fields_and_the_tensor_table():
    for message in EXAMPLES:
        tensor_fields = {"h", "anchors", "dist", "q", "ids"}
        fields = {f.name for f in dataclasses.fields(message)} - tensor_fields
        assert set(header_of(message)) == fields | {"tensors"}, message.kind


def test_tensor_fields_travel_under_their_documented_names():
    names = {m.kind: [e["name"] for e in header_of(m)["tensors"]] for m in EXAMPLES}
    assert names["PREFILL"] == ["ids"] and names["HIDDEN"] == ["h"] and names["ANCHORS"] == ["anchors.0", "anchors.12"]
    assert names["EXIT"] == ["dist.ids", "dist.probs"] and names["DRAFT"] == ["q.ids", "q.probs"]
    assert names["RESEED"] == [] and names["HELLO"] == []


def test_optional_fields_have_defaults_and_none_sends_no_tensor():
    greedy = wire.Exit(rid="r", base=0, tokens=[1], argmax=3)
    assert greedy.dist is None and greedy.stage_ms == [] and greedy.epoch == 0 and greedy.slot == 0
    assert len(encode(greedy)) == 2 and roundtrip(greedy).dist is None
    prefill = wire.Prefill(rid="r", params=SamplingParams(), prompt_len=1, s0=0, draft_limit=2, ids=torch.tensor([1]))
    assert roundtrip(prefill).routes is None and roundtrip(wire.Draft(base=0, token=1)).q is None


@pytest.mark.parametrize("dtype", list(wire.DTYPES.values()))
@pytest.mark.parametrize("shape", [(), (0,), (3, 0, 2), (5,), (2, 3, 4)])
def test_every_dtype_and_shape_round_trips_bit_exact(dtype, shape):
    t = seeded(dtype, shape)
    got = roundtrip(wire.Hidden(**REQ, base=0, tokens=[1], h=t)).h
    assert same(got, t)


def test_bfloat16_keeps_its_exact_bits():
    t = torch.tensor([1.0, -2.5, 3.140625, float("inf"), 1e-38], dtype=torch.bfloat16)
    got = roundtrip(wire.Hidden(base=0, tokens=[1], h=t)).h
    assert torch.equal(got.view(torch.int16), t.view(torch.int16))


def test_non_contiguous_and_grad_tensors_are_sent_as_their_values():
    base = torch.randn(4, 6, generator=torch.Generator().manual_seed(1), requires_grad=True)
    t = base.t()[1:3]
    assert torch.equal(roundtrip(wire.Hidden(base=0, tokens=[1], h=t)).h, t.detach())


def test_decoded_tensors_share_writable_frames_and_copy_on_request():
    frames = encode(wire.Hidden(**REQ, base=0, tokens=[1], h=torch.arange(4, dtype=torch.float32)))
    buf = bytearray(memoryview(frames[2]))
    shared = decode([frames[0], frames[1], buf])
    owned = decode([frames[0], frames[1], buf], copy=True)
    assert isinstance(shared, wire.Hidden) and isinstance(owned, wire.Hidden)
    buf[0:4] = torch.tensor([9.0]).numpy().tobytes()
    assert shared.h[0].item() == 9.0 and owned.h[0].item() == 0.0


def test_a_distribution_travels_sparse_and_comes_back_dense():
    p = torch.zeros(10)
    p[[2, 7]] = torch.tensor([0.25, 0.75])
    d = SparseDist.of(p)
    assert d.ids.dtype == torch.int32 and d.ids.tolist() == [2, 7] and torch.equal(d.dense(10), p)
    got = roundtrip(wire.Exit(**REQ, base=0, tokens=[1], argmax=7, dist=d))
    assert isinstance(got, wire.Exit) and got.dist is not None and torch.equal(got.dist.dense(10), p)
    with pytest.raises(WireError, match="outside"):
        d.dense(5)  # an id past the vocabulary
    with pytest.raises(WireError, match="int32 ids"):
        SparseDist(torch.tensor([1]), torch.tensor([1.0]))
    with pytest.raises(WireError, match="two \\[K\\] tensors"):
        SparseDist(torch.tensor([1, 2], dtype=torch.int32), torch.tensor([1.0]))


def test_unknown_kinds_are_refused():
    frames = as_bytes(encode(BY_KIND["DRAFT"]))
    with pytest.raises(WireError, match="unknown message kind"):
        decode([b"BOGUS", frames[1]])
    with pytest.raises(WireError, match="not a wire message"):
        encode(Message(rid="r"))  # a base, not a kind
    with pytest.raises(WireError, match="not a wire message"):
        encode({"rid": "r"})  # type: ignore[arg-type]


# ------------------------------------------------------------------------------ malformed input

def frames_with(header: dict, *tensor_frames: bytes, kind=b"CANCEL") -> list:
    return [kind, msgpack.packb(header), *tensor_frames]


CANCEL = {"rid": "r1", "epoch": 3, "pos": 0, "slot": 0}  # a whole CANCEL header
HIDDEN = header_of(wire.Hidden(**REQ, base=0, tokens=[1], h=torch.zeros(2)))  # a whole HIDDEN header (h: 8 bytes)


def entry(name="h", dtype="float32", shape=(2,), frame=2) -> dict:
    return {"name": name, "dtype": dtype, "shape": list(shape), "frame": frame}


def hidden(*entries, frames=(b"\0" * 8,)) -> list:
    return frames_with({**HIDDEN, "tensors": list(entries)}, *frames, kind=b"HIDDEN")


@pytest.mark.parametrize("frames, says", [
    ([b"CANCEL"], "frames"),
    (frames_with(CANCEL)[:1] + [b"\xc1"], "bad msgpack"),
    (frames_with(CANCEL)[:1] + [msgpack.packb([1, 2])], "must be a map"),
    (frames_with({"epoch": 1, "pos": 0, "slot": 0}), "field 'rid' missing"),
    (frames_with({"rid": "r", "pos": 0, "slot": 0}), "field 'epoch' missing"),
    (frames_with({"rid": "r", "epoch": 1, "slot": 0}), "field 'pos' missing"),
    (frames_with({"rid": "r", "epoch": 1, "pos": 0}), "field 'slot' missing"),
    (frames_with({**CANCEL, "rid": 5}), "field 'rid': expected str, got int"),
    (frames_with({**CANCEL, "rid": "x" * 257}), "field 'rid': longer than 256"),
    (frames_with({**CANCEL, "epoch": "1"}), "field 'epoch': expected int, got str"),
    (frames_with({**CANCEL, "epoch": True}), "field 'epoch': expected int, got bool"),
    (frames_with({**CANCEL, "epoch": 1.0}), "field 'epoch': expected int, got float"),
    (frames_with({**CANCEL, "epoch": -1}), "field 'epoch': -1 outside"),
    (frames_with({**CANCEL, "pos": -1}), "field 'pos': -1 outside"),
    (frames_with({**CANCEL, "slot": 256}), "field 'slot': 256 outside"),
    (frames_with({**CANCEL, "slot": None}), "field 'slot': expected int, got NoneType"),
    (frames_with({**CANCEL, "extra": 1}), "unknown field 'extra'"),
    (frames_with({**header_of(BY_KIND["PREFILL"]), "tensors": []}, kind=b"PREFILL"), "tensor 'ids' missing"),
    (frames_with({**header_of(BY_KIND["PREFILL"]), "params": {"temperature": 0.0}}, kind=b"PREFILL"),
     "field 'params': SamplingParams field 'top_k' missing"),
    (frames_with({**header_of(BY_KIND["PREFILL"]), "routes": {**ROUTES.to_dict(), "stages": [1]}}, kind=b"PREFILL"),
     "field 'routes': Topology field 'stages': expected str"),
    (frames_with({**header_of(BY_KIND["HIDDEN"]), "tokens": [1, "2"]}, kind=b"HIDDEN"), "field 'tokens': expected int"),
    (frames_with({**header_of(BY_KIND["HIDDEN"]), "stage_ms": 1.0}, kind=b"HIDDEN"), "field 'stage_ms': expected an array"),
    (frames_with({**header_of(BY_KIND["HELLO"]), "dropped": {"stale": "x"}}, kind=b"HELLO"), "field 'dropped': expected int"),
    (hidden(entry(), entry("x", frame=3), frames=(b"\0" * 8,) * 2), "unexpected tensor 'x'"),
    (hidden(entry("h.0")), "unexpected tensor 'h.0'"),
    (frames_with({**HIDDEN, "tensors": []}, kind=b"HIDDEN"), "tensor 'h' missing"),
    (frames_with({**CANCEL, "tensors": [entry("h")]}, b"\0" * 8), "unexpected tensor 'h'"),
    (hidden(entry(), frames=(b"\0" * 7,)), "needs 8 bytes, frame has 7"),
    (hidden(entry(), frames=(b"\0" * 9,)), "needs 8 bytes, frame has 9"),
    (hidden(entry(dtype="float64"), frames=(b"\0" * 16,)), "dtype 'float64' not allowed"),
    (hidden(entry(dtype="object")), "not allowed"),
    (hidden(entry(shape=(-1,))), "bad shape"),
    (hidden(entry(shape=(1,) * 9), frames=(b"\0" * 4,)), "bad shape"),
    (hidden(entry(frame=1)), "bad frame index"),
    (hidden(entry(frame=3)), "bad frame index"),
    (hidden(entry(), entry("h"), frames=(b"\0" * 8,) * 2), "duplicate"),
    (hidden(frames=(b"\0" * 8,)), "0 tensors listed but 1"),
    (frames_with({**HIDDEN, "tensors": "x"}, kind=b"HIDDEN"), "must be a list"),
    (frames_with(CANCEL, kind=b"\xff\xfe"), "not ASCII"),
    (frames_with(CANCEL, kind=b"H" * 33), "kind frame 33 bytes"),
    ([b"CANCEL", msgpack.packb(CANCEL), *([b""] * (wire.MAX_TENSORS + 1))], "frames, expected"),
    ([b"CANCEL", msgpack.packb(CANCEL), object()], "not a buffer"),
])
def test_malformed_messages_raise_wire_error_saying_why(frames, says):
    with pytest.raises(WireError, match=says.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        decode(frames)


def _dist_frames(kind: str, field_: str, ids_dtype="int32", probs_len=2, names=("ids", "probs"), ids_len=2) -> list:
    header = header_of(BY_KIND[kind])
    table = [entry(f"{field_}.{names[0]}", ids_dtype, (ids_len,), 2), entry(f"{field_}.{names[1]}", "float32", (probs_len,), 3)]
    size = {"int32": 4, "int64": 8}[ids_dtype]
    return frames_with({**header, "tensors": table}, b"\0" * size * ids_len, b"\0" * 4 * probs_len, kind=kind.encode())


@pytest.mark.parametrize("frames, says", [
    (_dist_frames("EXIT", "dist", ids_dtype="int64"), "int32 ids"),
    (_dist_frames("EXIT", "dist", probs_len=3), "two \\[K\\] tensors"),
    (_dist_frames("DRAFT", "q", names=("ids", "p")), "expected q.ids and q.probs"),
    (frames_with({**header_of(BY_KIND["EXIT"]), "tensors": [entry("dist.ids", "int32", (1,))]}, b"\0" * 4, kind=b"EXIT"),
     "expected dist.ids and dist.probs"),
    (frames_with({**header_of(BY_KIND["ANCHORS"]), "tensors": [entry("anchors.01")]}, b"\0" * 8, kind=b"ANCHORS"),
     "must be a decimal int"),
    (frames_with({**header_of(BY_KIND["ANCHORS"]), "tensors": [entry("anchors.x")]}, b"\0" * 8, kind=b"ANCHORS"),
     "must be a decimal int"),
    (frames_with({**header_of(BY_KIND["ANCHORS"]), "tensors": [entry("anchors.\u0663")]}, b"\0" * 8, kind=b"ANCHORS"),
     "must be a decimal int"),
    (frames_with({**header_of(BY_KIND["ANCHORS"]), "tensors": [entry("anchors")]}, b"\0" * 8, kind=b"ANCHORS"),
     "unexpected tensor 'anchors'"),
])
def test_malformed_tensor_fields_raise_wire_error(frames, says):
    with pytest.raises(WireError, match=says):
        decode(frames)


FIELD_CASES = [(m.kind, name) for m in EXAMPLES for name in header_of(m) if name != "tensors"]


@pytest.mark.parametrize("kind, name", FIELD_CASES)
def test_every_header_field_of_every_kind_is_checked_for_presence_and_type(kind, name):
    """The checks are derived from the dataclass fields: each one is required and typed."""
    good = as_bytes(encode(BY_KIND[kind]))
    header = msgpack.unpackb(good[1])
    wrong = 5 if isinstance(header[name], str) else "x"  # no field of any other type takes a str
    missing = {k: v for k, v in header.items() if k != name}
    with pytest.raises(WireError, match=f"{kind} field '{name}' missing"):
        decode([good[0], msgpack.packb(missing), *good[2:]])
    with pytest.raises(WireError, match=f"{kind} field '{name}': "):
        decode([good[0], msgpack.packb({**header, name: wrong}), *good[2:]])


def test_float_fields_take_ints_and_give_floats():
    header = header_of(BY_KIND["DRAFT"])
    frames = as_bytes(encode(BY_KIND["DRAFT"]))
    got = decode([frames[0], msgpack.packb({**header, "t_ms": 3}), *frames[2:]])
    assert isinstance(got, wire.Draft) and got.t_ms == 3.0 and isinstance(got.t_ms, float)


def test_oversized_header_is_rejected_before_unpacking(monkeypatch):
    big = msgpack.packb({**CANCEL, "rid": "x" * 2000})
    monkeypatch.setattr(wire.codec, "MAX_HEADER_BYTES", 1000)  # where decode and encode read it
    with pytest.raises(WireError, match="header .* bytes > 1000"):
        decode([b"CANCEL", big])
    with pytest.raises(WireError, match="header .* bytes > 1000"):
        encode(wire.Error(role="stage", index=1, reason="x" * 2000))


def test_oversized_message_is_rejected(monkeypatch):
    monkeypatch.setattr(wire.codec, "MAX_MESSAGE_BYTES", 1024)
    with pytest.raises(WireError, match="message .* bytes > 1024"):
        encode(wire.Hidden(base=0, tokens=[1], h=torch.zeros(512)))
    frames = hidden(entry(shape=(512,)), frames=(b"\0" * 2048,))
    with pytest.raises(WireError, match="message .* bytes > 1024"):
        decode(frames)


@pytest.mark.parametrize("message, says", [
    (wire.Cancel(rid="r", epoch=-1), "field 'epoch': -1 outside"),
    (wire.Cancel(rid="r", slot=wire.MAX_SLOTS), "field 'slot'"),
    (wire.Cancel(rid="x" * 300), "field 'rid': longer than"),
    (wire.Reseed(base=0, token=True), "field 'token': expected int, got bool"),
    (wire.Reseed(base=0, token="7"), "field 'token': expected int, got str"),  # type: ignore[arg-type]
    (wire.Reseed(base=0, token=object()), "field 'token': expected int"),  # type: ignore[arg-type]
    (wire.Hidden(base=0, tokens=(1,), h=torch.zeros(1)), None),  # a tuple is an array: fine
    (wire.Hidden(base=0, tokens=[1], h=torch.zeros(2, dtype=torch.float64)), "not allowed"),
    (wire.Hidden(base=0, tokens=[1], h=[1, 2]), "must be a torch.Tensor"),  # type: ignore[arg-type]
    (wire.Hidden(base=0, tokens=[1], h=None), "tensor 'h' missing"),  # type: ignore[arg-type]
    (wire.Exit(base=0, tokens=[1], argmax=1, dist=torch.zeros(2)), "must be a SparseDist"),  # type: ignore[arg-type]
    (wire.Anchors(base=0, tokens=[1], stage=1, count=1, anchors={"a0": torch.zeros(1)}), "ints >= 0"),  # type: ignore[dict-item]
    (wire.Hello(role="stage", index=1, incarnation="i", pid=1, endpoint="e", dropped={1: 2}), "string keys"),  # type: ignore[dict-item]
])
def test_encode_refuses_what_decode_would(message, says):
    if says is None:
        encode(message)
        return
    with pytest.raises(WireError, match=says):
        encode(message)


def test_a_truncated_tensor_frame_is_rejected():
    frames = as_bytes(encode(wire.Hidden(**REQ, base=0, tokens=[1], h=torch.zeros(3, 4))))
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


scalars = st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats() | st.text(max_size=8)
json_like = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                         | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=10)
FIELD_NAMES = sorted({name for m in EXAMPLES for name in header_of(m)} | {"x"})


@settings(max_examples=500, deadline=None, derandomize=True, database=None)
@given(st.sampled_from(sorted(KINDS) + ["NOPE"]),
       st.dictionaries(st.sampled_from(FIELD_NAMES), json_like, max_size=8),
       st.lists(st.binary(max_size=32), max_size=3))
def test_structured_but_wrong_headers_only_ever_raise_wire_error(kind, header, tensor_frames):
    try:
        decode([kind.encode(), msgpack.packb(header), *tensor_frames])
    except WireError:
        pass


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(st.sampled_from(EXAMPLES), st.data())
def test_a_valid_header_with_one_field_replaced_only_ever_raises_wire_error(message, data):
    header = header_of(message)
    name = data.draw(st.sampled_from(sorted(header)))
    frames = as_bytes(encode(message))
    try:
        m = decode([frames[0], msgpack.packb({**header, name: data.draw(json_like)}), *frames[2:]])
    except WireError:
        return
    assert type(m) is type(message)


VALID = as_bytes(encode(wire.Anchors(**REQ, base=0, tokens=[1, 2], stage=1, count=2,
                                     anchors={0: torch.arange(6).reshape(2, 3), 3: torch.ones(2, dtype=torch.bfloat16)})))
VALID_EXIT = as_bytes(encode(BY_KIND["EXIT"]))


@settings(max_examples=500, deadline=None, derandomize=True, database=None)
@given(st.sampled_from([VALID, VALID_EXIT]), st.integers(0, 3), st.integers(0, 200), st.binary(min_size=0, max_size=4),
       st.booleans())
def test_corrupting_a_valid_message_only_ever_raises_wire_error(valid, index, at, patch, truncate):
    frames = list(valid)
    index = min(index, len(frames) - 1)
    f = frames[index]
    at = min(at, len(f))
    frames[index] = f[:at] + patch if truncate else f[:at] + patch + f[at + len(patch):]
    try:
        m = decode(frames)
    except WireError:
        return
    assert m.kind in KINDS
    if isinstance(m, wire.Anchors):
        assert all(isinstance(k, int) and isinstance(t, torch.Tensor) for k, t in m.anchors.items())


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
    sent = wire.Anchors(**REQ, base=0, tokens=[1], stage=2, count=1, anchors={0: big, 5: small})
    assert wire.send(push, sent, timeout_ms=2000)
    m = wire.recv(pull, timeout_ms=5000)
    assert isinstance(m, wire.Anchors) and (m.rid, m.epoch, m.pos, m.slot) == ("r1", 3, 17, 2)
    assert same(m, sent)


def test_recv_times_out_with_none_and_garbage_raises_wire_error(push_pull):
    push, pull = push_pull
    assert wire.recv(pull, timeout_ms=50) is None
    push.send_multipart([b"garbage", b"\x00\x01"])
    with pytest.raises(WireError):
        wire.recv(pull, timeout_ms=5000)
    assert wire.send(push, BY_KIND["DRAFT"])
    assert isinstance(wire.recv(pull, timeout_ms=5000), wire.Draft)  # the socket still works after garbage


def test_send_gives_up_after_its_timeout_when_no_peer_is_connected():
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.bind("inproc://nobody")
    try:
        assert wire.send(push, BY_KIND["HEARTBEAT"], timeout_ms=20) is False
    finally:
        push.close()
        ctx.term()


def test_epochs_only_grow_follow_the_clock_and_far_future_ones_are_implausible():
    now = wire.next_epoch(0)
    assert wire.next_epoch(now) > now and wire.next_epoch(now + 10**9) == now + 10**9 + 1  # never back
    assert wire.plausible_epoch(now) and wire.plausible_epoch(wire.next_epoch(now))
    assert not wire.plausible_epoch(2 ** 53)  # the forged CANCEL that used to wedge a stage

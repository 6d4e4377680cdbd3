"""The data-plane wire format between SPD processes (ZeroMQ multipart messages, never pickle).

Every message is one of the typed dataclasses below, one per kind (`MESSAGES`, tagged by `KIND`),
all built on `Message` (rid, epoch, pos, slot). `encode(message)` gives the frames, `decode(frames)`
the typed message again. The frames are language-neutral:

    frame 0   the kind tag, short ASCII bytes (one of KINDS), e.g. b"HIDDEN"
    frame 1   msgpack map: every header field of the kind's class by name (all of them, defaults
              too, and no others), plus "tensors": [{"name", "dtype", "shape", "frame"}, ...]
    frame 2.. raw tensor bytes (C order, little-endian), one frame per tensor, sent zero-copy

Header fields are msgpack strings, ints, floats (an int is accepted), bools, arrays, maps with
string keys, and maps for nested dataclasses (PREFILL's SamplingParams, the routes' Topology).
Tensor fields are listed in the tensor table by name: a torch.Tensor field `h` as "h"; a SparseDist
field `dist` as "dist.ids" (int32) and "dist.probs"; a dict[int, Tensor] field `anchors` as
"anchors.<key>" (the key in decimal). An absent optional tensor field (None) has no frame.

decode() trusts nothing: any malformed input (a missing, unknown or wrong-typed field, a value out
of its limits, a bad tensor table) raises WireError and only WireError, so a worker can drop it,
log it and count it; encode() refuses what decode() would. The checks are derived from the
dataclass fields (their type hints and `limits` metadata), so adding a field is one line. Decoded
tensors share the received frame's memory when it is writable and aligned (zmq frames from
recv_multipart(copy=False) are); read-only inputs (bytes) are copied. Dropping stale epochs is the
caller's job. A probability distribution travels sparse (`SparseDist`: its support's ids and
probabilities).

Sockets that carry large messages should also set zmq.MAXMSGSIZE so libzmq refuses oversized
frames before allocating them; the checks here run after receipt.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

import msgpack
import torch
import zmq

from spd.core.sampling import SamplingParams
from spd.runtime.topology import Topology

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
          "int64": torch.int64, "int32": torch.int32, "bool": torch.bool}  # wire name -> dtype
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}

MAX_KIND_BYTES = 32  # frame 0 length
MAX_HEADER_BYTES = 1 << 20  # frame 1 length (1 MiB): headers are small; tensors go in their own frames
MAX_TENSORS = 64  # tensor frames per message
MAX_NDIM = 8  # dimensions per tensor
MAX_RID_CHARS = 256  # request id length
MAX_MESSAGE_BYTES = 256 << 20  # all frames together (256 MiB: 16k prefill tokens x 4096 x fp32)
MAX_SLOTS = 256  # concurrent requests one pipeline can hold (field "slot")
MAX_KEY_DIGITS = 9  # a dict[int, Tensor] key on the wire: at most this many decimal digits
TENSORS_KEY = "tensors"  # header key reserved for the tensor table

EPOCH_AHEAD_US = 60_000_000  # how far past the receiver's clock an epoch may be (clock skew between hosts)

assert sys.byteorder == "little", "the SPD wire format is little-endian"


def next_epoch(previous: int) -> int:
    """The epoch after `previous`: the wall clock in microseconds, or previous + 1 if that is not later.

    Epochs therefore only grow, across orchestrator restarts too, and never run ahead of the clock
    (that would take more than one flush per microsecond), which lets a worker refuse an epoch from
    the far future (`plausible_epoch`): a single forged control frame with a huge epoch would
    otherwise make it drop every real message after it."""
    return max(previous + 1, time.time_ns() // 1000)


def plausible_epoch(epoch: int) -> bool:
    return epoch <= time.time_ns() // 1000 + EPOCH_AHEAD_US


class WireError(ValueError):
    """A message that cannot be encoded or decoded: drop it, log it, count it."""


def limits(*, lo: int | None = None, below: int | None = None, chars: int | None = None) -> dict[str, int | None]:
    """Field metadata for the derived checks: an int field >= lo and < below; a str field of at most
    `chars` characters. E.g. `epoch: int = field(default=0, metadata=limits(lo=0))`."""
    return {"lo": lo, "below": below, "chars": chars}


# ------------------------------------------------------------------------------------ messages

@dataclass(frozen=True, eq=False)
class SparseDist:
    """A probability distribution over the vocabulary, as its support: the one place a
    distribution is sparsified (`of`) and densified (`dense`)."""
    ids: torch.Tensor  # [K] int32: the token ids with probability > 0
    probs: torch.Tensor  # [K] float: their probabilities

    def __post_init__(self) -> None:
        ids, probs = self.ids, self.probs
        if not isinstance(ids, torch.Tensor) or not isinstance(probs, torch.Tensor):
            raise WireError("a SparseDist holds two tensors")
        if ids.dtype != torch.int32 or probs.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise WireError(f"a SparseDist is int32 ids and float probs, not {ids.dtype} and {probs.dtype}")
        if ids.dim() != 1 or probs.shape != ids.shape:
            raise WireError(f"a SparseDist is two [K] tensors, not {list(ids.shape)} and {list(probs.shape)}")

    @classmethod
    def of(cls, p: torch.Tensor) -> SparseDist:
        """The support of p [V]."""
        ids = torch.nonzero(p).flatten()
        return cls(ids.to(torch.int32), p[ids])

    def dense(self, vocab_size: int) -> torch.Tensor:
        """The distribution as [V] float32 probabilities (WireError if an id is outside [0, V))."""
        if self.ids.numel() and (int(self.ids.min()) < 0 or int(self.ids.max()) >= vocab_size):
            raise WireError(f"distribution ids outside [0, {vocab_size})")
        p = torch.zeros(vocab_size)
        p[self.ids.long()] = self.probs.float()
        return p


@dataclass(frozen=True, kw_only=True)
class Message:
    """What every message carries. Compare messages with tensors field by field (== on a tensor
    field is elementwise)."""
    KIND: ClassVar[str] = ""  # frame 0; "" for the bases that are not sent themselves
    rid: str = field(default="", metadata=limits(chars=MAX_RID_CHARS))  # request id ("" when none: HELLO, ASSIGN, ...)
    epoch: int = field(default=0, metadata=limits(lo=0))  # the slot's flush generation (Driver.broadcast stamps it)
    pos: int = field(default=0, metadata=limits(lo=0))  # the sequence position it is about (the first, for several)
    slot: int = field(default=0, metadata=limits(lo=0, below=MAX_SLOTS))  # which of the pipeline's concurrent requests

    @property
    def kind(self) -> str:
        return self.KIND


@dataclass(frozen=True, kw_only=True)
class Presence(Message):
    """Worker -> orchestrator: it is alive and listens at `endpoint` (HELLO first, then HEARTBEATs)."""
    role: str  # "stage" | "drafter" | "spare"
    index: int  # stage j (1..n); 0 for the drafter; the spare's id
    incarnation: str  # fresh at every process start: a new one in a role held before is a restart
    pid: int  # its process id
    endpoint: str  # its inbox, as it advertises it
    dropped: dict[str, int] = field(default_factory=dict)  # messages it dropped so far, by reason


@dataclass(frozen=True, kw_only=True)
class Hello(Presence):
    """A worker's first beat: it registers (under a new incarnation)."""
    KIND: ClassVar[str] = "HELLO"


@dataclass(frozen=True, kw_only=True)
class Heartbeat(Presence):
    """A worker's later beats, every HEARTBEAT_S, from a thread of its own."""
    KIND: ClassVar[str] = "HEARTBEAT"


@dataclass(frozen=True, kw_only=True)
class Control(Message):
    """Orchestrator -> every worker: opens a new epoch of the slot (older messages of it are void)."""


@dataclass(frozen=True, kw_only=True)
class Prefill(Control):
    """Start (or, after a fault, rebuild) a request in its slot; stage 1 runs `ids`."""
    KIND: ClassVar[str] = "PREFILL"
    base: int = field(default=0, metadata=limits(lo=0))  # first position of the fill (a prefill fills from 0)
    params: SamplingParams  # the request's decoding parameters
    prompt_len: int = field(metadata=limits(lo=0))  # ids[:prompt_len] run in prefill_chunks, the rest one at a time
    s0: int  # staircase offset of the schedule (pre 0, post 1)
    draft_limit: int  # drafts may take positions below this
    routes: Topology | None = None  # where every worker listens now (moved when a spare took over a role)
    ids: torch.Tensor  # [T] int64: the prompt, then (a re-prefill) the tokens committed after it


@dataclass(frozen=True, kw_only=True)
class Reseed(Control):
    """Position `pos` holds `token` (the target's): everything of the slot from `base` on is void;
    stage 1 runs the token."""
    KIND: ClassVar[str] = "RESEED"
    base: int = field(metadata=limits(lo=0))  # KV caches and drafter states are truncated to this length
    token: int  # the committed token at pos


@dataclass(frozen=True, kw_only=True)
class Cancel(Control):
    """The request is over (done, cancelled or failed): its slot is free."""
    KIND: ClassVar[str] = "CANCEL"


@dataclass(frozen=True, kw_only=True)
class StageStep(Message):
    """What a stage sends about one forward over `tokens` at positions pos .. pos + len(tokens) - 1."""
    base: int  # first position of the slot's current fill
    tokens: list[int]  # the forward's input tokens
    t_ms: float = 0.0  # this stage's forward time
    stage_ms: list[float] = field(default_factory=list)  # forward times of stages 1..j so far
    batch: list[int] = field(default_factory=list)  # rows stages 1..j ran it with


@dataclass(frozen=True, kw_only=True)
class Hidden(StageStep):
    """Stage j -> stage j+1: the hidden states of the forward."""
    KIND: ClassVar[str] = "HIDDEN"
    h: torch.Tensor  # [T, d] hidden states after stage j


@dataclass(frozen=True, kw_only=True)
class Anchors(StageStep):
    """Stage j -> drafter: the anchor states of the forward's positions, seen at depth j."""
    KIND: ClassVar[str] = "ANCHORS"
    stage: int  # j
    count: int  # positions pos .. pos + count - 1
    anchors: dict[int, torch.Tensor] = field(default_factory=dict)  # layer boundary -> [T, d] anchor state


@dataclass(frozen=True, kw_only=True)
class Exit(StageStep):
    """Stage n -> orchestrator: the exiting token's distribution, compactly. Here `pos` is the
    forward's last position: the distribution is the one for pos + 1."""
    KIND: ClassVar[str] = "EXIT"
    argmax: int  # the decided token (greedy: argmax; gumbel: argmax(log p + G)); rejection: only reported
    dist: SparseDist | None = None  # rejection sampling: the processed target distribution p


@dataclass(frozen=True, kw_only=True)
class Draft(Message):
    """Drafter -> stage 1 (which runs it) and -> orchestrator (which judges with it): `token` for pos."""
    KIND: ClassVar[str] = "DRAFT"
    base: int  # first position of the slot's current fill
    token: int  # the drafted token
    t_ms: float = 0.0  # how long the (batched) draft took
    fill: int = 0  # staircase length a: the positions with depth < n the PDM saw
    batch: int = 1  # drafts computed in the same batch
    q: SparseDist | None = None  # to the orchestrator, for rejection sampling: the draft distribution


@dataclass(frozen=True, kw_only=True)
class Assign(Message):
    """Orchestrator -> an idle spare: take over this role; `routes` has the spare in it."""
    KIND: ClassVar[str] = "ASSIGN"
    role: str  # "stage" | "drafter"
    index: int  # stage j (1..n); 0 for the drafter
    routes: Topology  # where every worker listens from now on


@dataclass(frozen=True, kw_only=True)
class Error(Message):
    """Worker -> orchestrator: a message broke the protocol (rid, epoch, slot, pos name it) or a
    compute failed (compute=True); the orchestrator recovers at once."""
    KIND: ClassVar[str] = "ERROR"
    role: str  # the reporting worker's role
    index: int  # and index
    reason: str  # what went wrong
    compute: bool = False  # it failed computing, not handling one message: the worker's state is suspect


MESSAGES: dict[str, type[Message]] = {cls.KIND: cls for cls in (
    Hello, Heartbeat, Prefill, Hidden, Anchors, Draft, Exit, Reseed, Cancel, Assign, Error)}  # kind -> class
KINDS = frozenset(MESSAGES)  # known message types; frame 0 must be one of them


# ------------------------------------------------------------------ checks derived from the fields

Check = Callable[[Any], Any]  # a wire value -> the field's value; WireError if it does not fit
Plain = Callable[[Any], Any] | None  # a field's value -> what msgpack packs (None: the value itself)


@dataclass(frozen=True)
class _Schema:
    header: tuple[tuple[str, Check, Plain], ...]  # each header field, in order: (name, check, plain)
    names: frozenset[str]  # the header fields' names
    tensors: dict[str, tuple[str, bool]]  # tensor field -> (form: tensor | dist | map, optional)


def _schema(cls: type) -> _Schema:
    hints = typing.get_type_hints(cls)
    header: list[tuple[str, Check, Plain]] = []
    tensors: dict[str, tuple[str, bool]] = {}
    for f in dataclasses.fields(cls):
        form = _tensor_form(hints[f.name])
        if form is not None:
            tensors[f.name] = form
        else:
            header.append((f.name, _check(hints[f.name], f.metadata), _plain(hints[f.name])))
    names = frozenset(name for name, _, _ in header)
    assert TENSORS_KEY not in names and not any("." in name for name in tensors), cls
    return _Schema(tuple(header), names, tensors)


def _optional(tp) -> tuple[Any, bool]:
    """(T, True) for T | None, else (tp, False)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(inner) == 1:
            return inner[0], True
        raise TypeError(f"wire: unions other than T | None are not supported: {tp!r}")
    return tp, False


def _tensor_form(tp) -> tuple[str, bool] | None:
    inner, optional = _optional(tp)
    if inner is torch.Tensor:
        return "tensor", optional
    if inner is SparseDist:
        return "dist", optional
    if typing.get_origin(inner) is dict and typing.get_args(inner) == (int, torch.Tensor):
        if optional:
            raise TypeError("wire: a dict[int, Tensor] field is never None (empty instead)")
        return "map", False
    return None


def _check(tp, meta) -> Check:
    """The check of a header field of type `tp` (with `limits` metadata `meta`)."""
    inner, optional = _optional(tp)
    if optional:
        check = _check(inner, meta)
        return lambda v: None if v is None else check(v)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is list or (origin is tuple and len(args) == 2 and args[1] is Ellipsis):
        item, as_tuple = _check(args[0], {}), origin is tuple

        def check_array(v):
            if not isinstance(v, (list, tuple)):  # msgpack gives lists; encode checks tuples too
                raise WireError(f"expected an array, got {_type(v)}")
            items = [item(x) for x in v]
            return tuple(items) if as_tuple else items
        return check_array
    if origin is dict and args[0] is str:
        value = _check(args[1], {})

        def check_map(v):
            if not isinstance(v, dict) or not all(isinstance(k, str) for k in v):
                raise WireError(f"expected a map with string keys, got {_type(v)}")
            return {k: value(x) for k, x in v.items()}
        return check_map
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        struct, what = _schema(tp), tp.__name__
        if struct.tensors:
            raise TypeError(f"wire: nested {what} may not hold tensors")

        def check_struct(v):
            values = _read(struct, v, what)
            try:
                return tp(**values)
            except (TypeError, ValueError) as e:  # a __post_init__ that refuses the values
                raise WireError(f"{what}: {e}") from None
        return check_struct
    if tp in (str, int, float, bool):
        return _scalar(tp, meta.get("lo"), meta.get("below"), meta.get("chars"))
    raise TypeError(f"wire: no check for a field of type {tp!r}")


def _scalar(tp: Any, lo: int | None, below: int | None, chars: int | None) -> Check:
    def check(v: Any) -> Any:
        if type(v) is not tp:
            if tp is float and _is_int(v):
                v = float(v)
            elif not isinstance(v, tp) or (tp is int and isinstance(v, bool)):  # a bool is no int
                raise WireError(f"expected {tp.__name__}, got {_type(v)}")
        if (lo is not None and v < lo) or (below is not None and v >= below):
            raise WireError(f"{v} outside [{lo if lo is not None else '-inf'}, {below if below is not None else 'inf'})")
        if chars is not None and len(v) > chars:
            raise WireError(f"longer than {chars} chars")
        return v
    return check


def _read(schema: _Schema, mapping, what: str) -> dict[str, Any]:
    """The checked values of every header field of `schema` in `mapping` (exactly those)."""
    if not isinstance(mapping, dict):
        raise WireError(f"{what} must be a map, not {_type(mapping)}")
    values = {}
    for name, check, _ in schema.header:
        if name not in mapping:
            raise WireError(f"{what} field {name!r} missing")
        try:
            values[name] = check(mapping[name])
        except WireError as e:
            raise WireError(f"{what} field {name!r}: {e}") from None
    if len(mapping) != len(values):
        unknown = next(k for k in mapping if k not in schema.names)
        raise WireError(f"{what}: unknown field {unknown!r}")
    return values


def _plain(tp) -> Plain:
    """How a value of type `tp` becomes what msgpack packs: only nested dataclasses need it (as
    maps); msgpack packs everything else itself (tuples as arrays)."""
    inner, optional = _optional(tp)
    origin, args = typing.get_origin(inner), typing.get_args(inner)
    if origin in (list, tuple, dict):
        item = _plain(args[-1])
        if item is None:
            return None
        if origin is dict:
            return lambda v: {k: item(x) for k, x in v.items()} if isinstance(v, dict) else v
        return lambda v: [item(x) for x in v] if isinstance(v, (list, tuple)) else v
    if isinstance(inner, type) and dataclasses.is_dataclass(inner):
        fields = [(f.name, _plain(hint)) for f in dataclasses.fields(inner)
                  for hint in [typing.get_type_hints(inner)[f.name]]]
        return lambda v: {name: plain(getattr(v, name)) if plain else getattr(v, name)
                          for name, plain in fields} if isinstance(v, inner) else v  # else: the check says why
    return None


_SCHEMAS: dict[type, _Schema] = {cls: _schema(cls) for cls in MESSAGES.values()}


# ---------------------------------------------------------------------------------------- encode

def encode(message: Message) -> list:
    """Frames for socket.send_multipart(frames, copy=False). Raises WireError on a bad message."""
    schema = _SCHEMAS.get(type(message))
    if schema is None:
        raise WireError(f"not a wire message: {type(message).__name__}")
    header = {name: plain(getattr(message, name)) if plain else getattr(message, name)
              for name, _, plain in schema.header}
    _read(schema, header, message.KIND)  # refuse what decode would refuse
    buffers: list = []  # raw tensor frames
    table: list[dict] = []
    for name, tensor in _tensor_items(schema, message):
        buf, entry = _tensor_frame(name, tensor, frame=2 + len(buffers))
        buffers.append(buf)
        table.append(entry)
    if len(buffers) > MAX_TENSORS:
        raise WireError(f"{len(buffers)} tensors > {MAX_TENSORS}")
    packed = _pack({**header, TENSORS_KEY: table})
    frames = [message.KIND.encode("ascii"), packed, *buffers]
    _check_total(frames)
    return frames


def _tensor_items(schema: _Schema, message: Message) -> list[tuple[str, Any]]:
    """(wire name, tensor) of each tensor the message's tensor fields hold."""
    items: list[tuple[str, Any]] = []
    for name, (form, optional) in schema.tensors.items():
        v = getattr(message, name)
        if v is None:
            if optional:
                continue
            raise WireError(f"{message.KIND} tensor {name!r} missing")
        if form == "tensor":
            items.append((name, v))
        elif form == "dist":
            if not isinstance(v, SparseDist):
                raise WireError(f"{message.KIND} field {name!r} must be a SparseDist, not {_type(v)}")
            items += [(f"{name}.ids", v.ids), (f"{name}.probs", v.probs)]
        else:
            if not isinstance(v, dict) or not all(_is_int(k) and 0 <= k < 10 ** MAX_KEY_DIGITS for k in v):
                raise WireError(f"{message.KIND} field {name!r} must map ints >= 0 to tensors")
            items += [(f"{name}.{k}", t) for k, t in v.items()]
    return items


def _tensor_frame(name, tensor, frame: int):
    if not isinstance(tensor, torch.Tensor):
        raise WireError(f"tensor {name!r} must be a torch.Tensor, not {_type(tensor)}")
    if tensor.dtype not in DTYPE_NAMES:
        raise WireError(f"tensor {name!r}: dtype {tensor.dtype} not allowed")
    t = tensor.detach().to("cpu").contiguous()
    raw = t.reshape(-1).view(torch.uint8).numpy()  # bytes view, no copy; keeps `t` alive
    entry = {"name": name, "dtype": DTYPE_NAMES[t.dtype], "shape": list(t.shape), "frame": frame}
    return raw, entry


def _pack(header: dict) -> bytes:
    try:
        packed = msgpack.packb(header, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as e:
        raise WireError(f"header not msgpack-serialisable: {e}") from e
    if len(packed) > MAX_HEADER_BYTES:
        raise WireError(f"header {len(packed)} bytes > {MAX_HEADER_BYTES}")
    return packed


# ---------------------------------------------------------------------------------------- decode

def decode(frames, copy: bool = False) -> Message:
    """The typed message in received frames (bytes, memoryviews or zmq.Frame); WireError if malformed.

    copy=True gives tensors that own their memory (safe to modify in place).
    """
    if not isinstance(frames, (list, tuple)):
        raise WireError(f"frames must be a list, not {type(frames).__name__}")
    if not 2 <= len(frames) <= 2 + MAX_TENSORS:
        raise WireError(f"{len(frames)} frames, expected 2..{2 + MAX_TENSORS}")
    views = [_view(f) for f in frames]
    _check_total(views)
    kind = _decode_kind(views[0])
    cls = MESSAGES[kind]
    schema = _SCHEMAS[cls]
    header = _unpack(views[1])
    table = header.pop(TENSORS_KEY, [])
    values = _read(schema, header, kind)
    values.update(_tensor_values(schema, _decode_tensors(table, views, copy), kind))
    return cls(**values)


def _view(frame) -> memoryview:
    if isinstance(frame, zmq.Frame):
        frame = frame.buffer
    try:
        view = memoryview(frame)
    except TypeError as e:
        raise WireError(f"frame of type {type(frame).__name__} is not a buffer") from e
    if not view.c_contiguous:
        raise WireError("frame buffer is not contiguous")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def _check_total(frames) -> None:
    total = sum(len(f) if isinstance(f, (bytes, memoryview)) else f.nbytes for f in frames)
    if total > MAX_MESSAGE_BYTES:
        raise WireError(f"message {total} bytes > {MAX_MESSAGE_BYTES}")


def _decode_kind(view: memoryview) -> str:
    if len(view) > MAX_KIND_BYTES:
        raise WireError(f"kind frame {len(view)} bytes > {MAX_KIND_BYTES}")
    try:
        kind = bytes(view).decode("ascii")
    except UnicodeDecodeError as e:
        raise WireError("kind frame is not ASCII") from e
    if kind not in KINDS:
        raise WireError(f"unknown message kind {kind!r}")
    return kind


def _unpack(view: memoryview) -> dict:
    if len(view) > MAX_HEADER_BYTES:
        raise WireError(f"header {len(view)} bytes > {MAX_HEADER_BYTES}")
    try:
        header = msgpack.unpackb(view, raw=False, strict_map_key=True, use_list=True)
    except Exception as e:  # msgpack raises many types (ExtraData, FormatError, StackError, ValueError, ...)
        raise WireError(f"bad msgpack header: {type(e).__name__}: {e}") from e
    if not isinstance(header, dict):
        raise WireError(f"header must be a map, not {type(header).__name__}")
    return header


def _decode_tensors(table, views: list[memoryview], copy: bool) -> dict[str, torch.Tensor]:
    if not isinstance(table, list):
        raise WireError(f"{TENSORS_KEY!r} must be a list")
    if len(table) != len(views) - 2:
        raise WireError(f"{len(table)} tensors listed but {len(views) - 2} tensor frames sent")
    tensors: dict[str, torch.Tensor] = {}
    used: set[int] = set()
    for entry in table:
        name, dtype, shape, index = _check_entry(entry, len(views))
        if name in tensors or index in used:
            raise WireError(f"tensor {name!r}: duplicate name or frame {index}")
        used.add(index)
        tensors[name] = _tensor(name, dtype, shape, views[index], copy)
    return tensors


def _tensor_values(schema: _Schema, tensors: dict[str, torch.Tensor], kind: str) -> dict[str, Any]:
    """The tensor fields' values from the received tensors, by wire name (see the module docstring)."""
    values: dict[str, Any] = {}
    parts: dict[str, dict[str, torch.Tensor]] = {}
    for name, t in tensors.items():
        fname, dot, key = name.partition(".")
        spec = schema.tensors.get(fname)
        if spec is None or (spec[0] == "tensor") == bool(dot):
            raise WireError(f"{kind}: unexpected tensor {name!r}")
        if dot:
            parts.setdefault(fname, {})[key] = t
        else:
            values[fname] = t
    for fname, (form, optional) in schema.tensors.items():
        got = parts.get(fname)
        if form == "tensor":
            if fname not in values and not optional:
                raise WireError(f"{kind} tensor {fname!r} missing")
        elif form == "dist":
            if got is None:
                if not optional:
                    raise WireError(f"{kind} tensors {fname}.ids, {fname}.probs missing")
            elif got.keys() != {"ids", "probs"}:
                raise WireError(f"{kind} tensor {fname!r}: expected {fname}.ids and {fname}.probs, got {sorted(got)}")
            else:
                values[fname] = SparseDist(got["ids"], got["probs"])
        else:
            values[fname] = {_map_key(kind, fname, key): t for key, t in (got or {}).items()}
    return values


def _map_key(kind: str, fname: str, key: str) -> int:
    if not (key.isascii() and key.isdigit() and len(key) <= MAX_KEY_DIGITS and str(int(key)) == key):
        raise WireError(f"{kind} tensor {fname}.{key}: the key must be a decimal int")
    return int(key)


def _check_entry(entry, n_frames: int):
    if not isinstance(entry, dict):
        raise WireError("tensor entry must be a map")
    name, dtype, shape, index = (entry.get(k) for k in ("name", "dtype", "shape", "frame"))
    if not isinstance(name, str):
        raise WireError("tensor name must be a str")
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise WireError(f"tensor {name!r}: dtype {dtype!r} not allowed")
    if not isinstance(shape, list) or len(shape) > MAX_NDIM or not all(_is_int(d) and d >= 0 for d in shape):
        raise WireError(f"tensor {name!r}: bad shape {shape!r}")
    if not isinstance(index, int) or not _is_int(index) or not 2 <= index < n_frames:
        raise WireError(f"tensor {name!r}: bad frame index {index!r}")
    return name, DTYPES[dtype], shape, index


def _tensor(name: str, dtype: torch.dtype, shape: list[int], view: memoryview, copy: bool) -> torch.Tensor:
    itemsize = torch.empty((), dtype=dtype).element_size()
    numel = math.prod(shape)
    if numel * itemsize != len(view):
        raise WireError(f"tensor {name!r}: shape {shape} {dtype} needs {numel * itemsize} bytes, frame has {len(view)}")
    if numel == 0:
        return torch.empty(shape, dtype=dtype)
    if view.readonly:
        view, copy = memoryview(bytearray(view)), False  # torch cannot share read-only memory safely
    t = torch.frombuffer(view, dtype=dtype, count=numel)
    if copy or t.data_ptr() % itemsize:
        t = t.clone()  # asked for, or misaligned for this dtype
    return t.reshape(shape)


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _type(v) -> str:
    return type(v).__name__


# ---------------------------------------------------------------------------------------- sockets

def send(socket: zmq.Socket, message: Message, timeout_ms: int = 1000) -> bool:
    """Encode and send one message zero-copy; False if the socket was not writable within timeout_ms."""
    frames = encode(message)
    if not socket.poll(timeout_ms, zmq.POLLOUT):
        return False
    try:
        socket.send_multipart(frames, copy=False, flags=zmq.NOBLOCK)
    except zmq.Again:
        return False
    return True


def recv(socket: zmq.Socket, timeout_ms: int) -> Message | None:
    """The next message, or None if none arrived within timeout_ms; WireError if it is malformed.

    For sockets without an envelope (PUSH/PULL, PAIR, DEALER<->DEALER, SUB); ROUTER callers strip
    the identity frames and call decode() themselves.
    """
    if not socket.poll(timeout_ms, zmq.POLLIN):
        return None
    frames = socket.recv_multipart(flags=zmq.NOBLOCK, copy=False)
    return decode(frames)

"""The data-plane wire format between SPD processes (ZeroMQ multipart messages, never pickle).

A message is a list of frames:

    frame 0   message-type tag, short ASCII bytes (one of KINDS), e.g. b"HIDDEN"
    frame 1   msgpack header: a dict that always carries rid (str), epoch (int >= 0), pos (int >= 0);
              encode() adds "tensors": [{"name", "dtype", "shape", "frame"}, ...]
    frame 2.. raw tensor bytes (C order, little-endian), one frame per tensor, sent zero-copy

decode() trusts nothing: any malformed input raises WireError (and only WireError), so a worker can
drop it, log it and count it. Decoded tensors share the received frame's memory when it is
writable and aligned (zmq frames from recv_multipart(copy=False) are); read-only inputs (bytes)
are copied. Dropping stale epochs is the caller's job. A probability distribution travels sparse
(`sparse` / `dense`: its support's ids and probabilities).

Sockets that carry large messages should also set zmq.MAXMSGSIZE so libzmq refuses oversized
frames before allocating them; the checks here run after receipt.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field

import msgpack
import torch
import zmq

KINDS = frozenset({"HELLO", "HEARTBEAT", "PREFILL", "HIDDEN", "ANCHORS", "DRAFT", "EXIT", "RESEED", "CANCEL",
                   "ASSIGN", "ERROR"})  # known message types; frame 0 must be one of them

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
          "int64": torch.int64, "int32": torch.int32, "bool": torch.bool}  # wire name -> dtype
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}

MAX_KIND_BYTES = 32  # frame 0 length
MAX_HEADER_BYTES = 1 << 20  # frame 1 length (1 MiB): headers are small; tensors go in their own frames
MAX_TENSORS = 64  # tensor frames per message
MAX_NDIM = 8  # dimensions per tensor
MAX_RID_CHARS = 256  # request id length
MAX_MESSAGE_BYTES = 256 << 20  # all frames together (256 MiB: 16k prefill tokens x 4096 x fp32)
MAX_SLOTS = 256  # concurrent requests one pipeline can hold (header "slot")
TENSORS_KEY = "tensors"  # header key reserved for the tensor table
REQUIRED = (("rid", str), ("epoch", int), ("pos", int))  # header fields every message carries

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


@dataclass
class Message:
    kind: str  # one of KINDS
    header: dict  # decoded msgpack header (the "tensors" table removed)
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)  # name -> CPU tensor

    @property
    def rid(self) -> str:
        return self.header["rid"]

    @property
    def epoch(self) -> int:
        return self.header["epoch"]

    @property
    def pos(self) -> int:
        return self.header["pos"]

    @property
    def slot(self) -> int:
        """Which of the pipeline's concurrent requests it belongs to (0 when only one runs)."""
        slot = self.header.get("slot", 0)
        if not isinstance(slot, int) or isinstance(slot, bool) or not 0 <= slot < MAX_SLOTS:
            raise WireError(f"slot must be an int in [0, {MAX_SLOTS}), got {slot!r}")
        return slot

    def dense(self, vocab_size: int) -> torch.Tensor | None:
        """The distribution the message carries (see `sparse`) as [V] probabilities, or None."""
        if "ids" not in self.tensors or "probs" not in self.tensors:
            return None
        p = torch.zeros(vocab_size)
        p[self.tensors["ids"].long()] = self.tensors["probs"].float()
        return p


def sparse(p: torch.Tensor) -> dict[str, torch.Tensor]:
    """A distribution p [V] as tensors to send: its support's ids (int32) and probabilities."""
    ids = torch.nonzero(p).flatten()
    return {"ids": ids.to(torch.int32), "probs": p[ids]}


# ---------------------------------------------------------------------------------------- encode

def encode(kind: str, header: dict, tensors: dict[str, torch.Tensor] | None = None) -> list:
    """Frames for socket.send_multipart(frames, copy=False). Raises WireError on bad input."""
    _check_kind(kind)
    if not isinstance(header, dict):
        raise WireError(f"header must be a dict, not {type(header).__name__}")
    if TENSORS_KEY in header:
        raise WireError(f"header key {TENSORS_KEY!r} is reserved")
    _check_required(header)
    buffers: list = []  # raw tensor frames
    table: list[dict] = []
    for name, tensor in (tensors or {}).items():
        buf, entry = _tensor_frame(name, tensor, frame=2 + len(buffers))
        buffers.append(buf)
        table.append(entry)
    if len(buffers) > MAX_TENSORS:
        raise WireError(f"{len(buffers)} tensors > {MAX_TENSORS}")
    packed = _pack({**header, TENSORS_KEY: table})
    frames = [kind.encode("ascii"), packed, *buffers]
    _check_total(frames)
    return frames


def _tensor_frame(name, tensor, frame: int):
    if not isinstance(name, str) or not isinstance(tensor, torch.Tensor):
        raise WireError(f"tensors must map str -> torch.Tensor (got {type(name).__name__})")
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
    """Rebuild a Message from received frames (bytes, memoryviews or zmq.Frame); WireError if malformed.

    copy=True gives tensors that own their memory (safe to modify in place).
    """
    if not isinstance(frames, (list, tuple)):
        raise WireError(f"frames must be a list, not {type(frames).__name__}")
    if not 2 <= len(frames) <= 2 + MAX_TENSORS:
        raise WireError(f"{len(frames)} frames, expected 2..{2 + MAX_TENSORS}")
    views = [_view(f) for f in frames]
    _check_total(views)
    kind = _decode_kind(views[0])
    header = _unpack(views[1])
    table = header.pop(TENSORS_KEY, [])
    tensors = _decode_tensors(table, views, copy)
    return Message(kind, header, tensors)


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
    _check_kind(kind)
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
    _check_required(header)
    return header


def _decode_tensors(table, views: list[memoryview], copy: bool) -> dict[str, torch.Tensor]:
    if not isinstance(table, list):
        raise WireError(f"{TENSORS_KEY!r} must be a list")
    if len(table) != len(views) - 2:
        raise WireError(f"{len(table)} tensors listed but {len(views) - 2} tensor frames sent")
    tensors, used = {}, set()
    for entry in table:
        name, dtype, shape, index = _check_entry(entry, len(views))
        if name in tensors or index in used:
            raise WireError(f"tensor {name!r}: duplicate name or frame {index}")
        used.add(index)
        tensors[name] = _tensor(name, dtype, shape, views[index], copy)
    return tensors


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


# ---------------------------------------------------------------------------------------- checks

def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check_kind(kind) -> None:
    if kind not in KINDS:
        raise WireError(f"unknown message kind {kind!r}")


def _check_required(header: dict) -> None:
    for key, typ in REQUIRED:
        value = header.get(key)
        if not isinstance(value, typ) or (typ is int and isinstance(value, bool)):
            raise WireError(f"header field {key!r} missing or not {typ.__name__}: {value!r}")
    if len(header["rid"]) > MAX_RID_CHARS:
        raise WireError(f"rid longer than {MAX_RID_CHARS} chars")
    if header["epoch"] < 0 or header["pos"] < 0:
        raise WireError(f"negative epoch or pos: {header['epoch']}, {header['pos']}")


# ---------------------------------------------------------------------------------------- sockets

def send(socket: zmq.Socket, kind: str, header: dict, tensors: dict[str, torch.Tensor] | None = None,
         timeout_ms: int = 1000) -> bool:
    """Encode and send one message zero-copy; False if the socket was not writable within timeout_ms."""
    frames = encode(kind, header, tensors)
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

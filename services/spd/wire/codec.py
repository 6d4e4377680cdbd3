"""encode / decode of typed messages to and from ZeroMQ frames, and send / recv; see spd.wire."""

from __future__ import annotations

import math
from typing import Any

import msgpack
import torch
import zmq

from spd.wire.messages import DTYPES, DTYPE_NAMES, KINDS, MAX_HEADER_BYTES, MAX_KEY_DIGITS, MAX_KIND_BYTES, MAX_MESSAGE_BYTES, MAX_NDIM, MAX_TENSORS, MESSAGES, Message, SparseDist, TENSORS_KEY, WireError
from spd.wire.schema import _is_int, _type, _SCHEMAS, _Schema, _read


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

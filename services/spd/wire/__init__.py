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

from spd.wire.codec import decode as decode, encode as encode, recv as recv, send as send
from spd.wire.messages import (  # the message types, limits, WireError, epochs
    DTYPES as DTYPES,
    DTYPE_NAMES as DTYPE_NAMES,
    MAX_KIND_BYTES as MAX_KIND_BYTES,
    MAX_HEADER_BYTES as MAX_HEADER_BYTES,
    MAX_TENSORS as MAX_TENSORS,
    MAX_NDIM as MAX_NDIM,
    MAX_RID_CHARS as MAX_RID_CHARS,
    MAX_MESSAGE_BYTES as MAX_MESSAGE_BYTES,
    MAX_SLOTS as MAX_SLOTS,
    MAX_KEY_DIGITS as MAX_KEY_DIGITS,
    TENSORS_KEY as TENSORS_KEY,
    EPOCH_AHEAD_US as EPOCH_AHEAD_US,
    next_epoch as next_epoch,
    plausible_epoch as plausible_epoch,
    WireError as WireError,
    limits as limits,
    SparseDist as SparseDist,
    Message as Message,
    Presence as Presence,
    Hello as Hello,
    Heartbeat as Heartbeat,
    Control as Control,
    Prefill as Prefill,
    Reseed as Reseed,
    Cancel as Cancel,
    StageStep as StageStep,
    Hidden as Hidden,
    Anchors as Anchors,
    Exit as Exit,
    Draft as Draft,
    Assign as Assign,
    Error as Error,
    MESSAGES as MESSAGES,
    KINDS as KINDS,
)

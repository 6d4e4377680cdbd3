"""The wire format's message types (one frozen dataclass per kind), limits and epochs; see spd.wire."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import ClassVar

import torch

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

from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GetInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Info(_message.Message):
    __slots__ = ("model", "n", "context_length", "max_tokens", "default_max_tokens", "queue_size", "max_concurrency", "schedule", "draft")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_LENGTH_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    DRAFT_FIELD_NUMBER: _ClassVar[int]
    model: str
    n: int
    context_length: int
    max_tokens: int
    default_max_tokens: int
    queue_size: int
    max_concurrency: int
    schedule: str
    draft: str
    def __init__(self, model: _Optional[str] = ..., n: _Optional[int] = ..., context_length: _Optional[int] = ..., max_tokens: _Optional[int] = ..., default_max_tokens: _Optional[int] = ..., queue_size: _Optional[int] = ..., max_concurrency: _Optional[int] = ..., schedule: _Optional[str] = ..., draft: _Optional[str] = ...) -> None: ...

class Message(_message.Message):
    __slots__ = ("role", "content")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("prompt", "messages", "raw", "max_tokens", "temperature", "top_k", "top_p", "seed", "stop", "request_id", "coupling")
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    RAW_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    COUPLING_FIELD_NUMBER: _ClassVar[int]
    prompt: str
    messages: _containers.RepeatedCompositeFieldContainer[Message]
    raw: bool
    max_tokens: int
    temperature: float
    top_k: int
    top_p: float
    seed: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    request_id: str
    coupling: str
    def __init__(self, prompt: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[Message, _Mapping]]] = ..., raw: bool = ..., max_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., top_k: _Optional[int] = ..., top_p: _Optional[float] = ..., seed: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., request_id: _Optional[str] = ..., coupling: _Optional[str] = ...) -> None: ...

class Stats(_message.Message):
    __slots__ = ("n", "generated_tokens", "cycles", "alpha", "theoretical_speedup", "accepts", "rejects", "flushes", "recoveries", "prefill_ms", "decode_ms", "ttft_ms", "draft_ms", "verify_ms", "tokens_per_s", "queue_ms", "drafts", "stage_ms", "cycle_ms_p50", "cycle_ms_p99", "prompt_tokens", "batch")
    N_FIELD_NUMBER: _ClassVar[int]
    GENERATED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CYCLES_FIELD_NUMBER: _ClassVar[int]
    ALPHA_FIELD_NUMBER: _ClassVar[int]
    THEORETICAL_SPEEDUP_FIELD_NUMBER: _ClassVar[int]
    ACCEPTS_FIELD_NUMBER: _ClassVar[int]
    REJECTS_FIELD_NUMBER: _ClassVar[int]
    FLUSHES_FIELD_NUMBER: _ClassVar[int]
    RECOVERIES_FIELD_NUMBER: _ClassVar[int]
    PREFILL_MS_FIELD_NUMBER: _ClassVar[int]
    DECODE_MS_FIELD_NUMBER: _ClassVar[int]
    TTFT_MS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_MS_FIELD_NUMBER: _ClassVar[int]
    VERIFY_MS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    QUEUE_MS_FIELD_NUMBER: _ClassVar[int]
    DRAFTS_FIELD_NUMBER: _ClassVar[int]
    STAGE_MS_FIELD_NUMBER: _ClassVar[int]
    CYCLE_MS_P50_FIELD_NUMBER: _ClassVar[int]
    CYCLE_MS_P99_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    n: int
    generated_tokens: int
    cycles: int
    alpha: float
    theoretical_speedup: float
    accepts: int
    rejects: int
    flushes: int
    recoveries: int
    prefill_ms: float
    decode_ms: float
    ttft_ms: float
    draft_ms: float
    verify_ms: float
    tokens_per_s: float
    queue_ms: float
    drafts: int
    stage_ms: _containers.RepeatedScalarFieldContainer[float]
    cycle_ms_p50: float
    cycle_ms_p99: float
    prompt_tokens: int
    batch: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, n: _Optional[int] = ..., generated_tokens: _Optional[int] = ..., cycles: _Optional[int] = ..., alpha: _Optional[float] = ..., theoretical_speedup: _Optional[float] = ..., accepts: _Optional[int] = ..., rejects: _Optional[int] = ..., flushes: _Optional[int] = ..., recoveries: _Optional[int] = ..., prefill_ms: _Optional[float] = ..., decode_ms: _Optional[float] = ..., ttft_ms: _Optional[float] = ..., draft_ms: _Optional[float] = ..., verify_ms: _Optional[float] = ..., tokens_per_s: _Optional[float] = ..., queue_ms: _Optional[float] = ..., drafts: _Optional[int] = ..., stage_ms: _Optional[_Iterable[float]] = ..., cycle_ms_p50: _Optional[float] = ..., cycle_ms_p99: _Optional[float] = ..., prompt_tokens: _Optional[int] = ..., batch: _Optional[_Iterable[float]] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("text", "token_ids", "finish_reason", "stats")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    finish_reason: str
    stats: Stats
    def __init__(self, text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., finish_reason: _Optional[str] = ..., stats: _Optional[_Union[Stats, _Mapping]] = ...) -> None: ...

class GenerateChunk(_message.Message):
    __slots__ = ("token_ids", "text", "finish_reason", "stats")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    text: str
    finish_reason: str
    stats: Stats
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., text: _Optional[str] = ..., finish_reason: _Optional[str] = ..., stats: _Optional[_Union[Stats, _Mapping]] = ...) -> None: ...

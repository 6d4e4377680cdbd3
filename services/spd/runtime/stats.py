"""A request's figures as the service reports them: the fields of spd.v1.Stats, one for one (the
servicer builds the message from them and fails loudly if the two ever differ)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from spd.core.results import alpha_of


@dataclass
class RequestStats:
    n: int  # pipeline stages
    prompt_tokens: int  # P: prompt tokens
    queue_ms: float = 0.0  # waiting for a slot
    generated_tokens: int = 0  # N: committed tokens, the prefill's first token included
    cycles: int = 0  # K: pipeline cycles after prefill
    alpha: float = 0.0  # α = N / K
    theoretical_speedup: float = 0.0  # S0 = n·α
    accepts: int = 0  # judgements that accepted the draft
    rejects: int = 0  # judgements that rejected it
    flushes: int = 0  # pipeline flushes after a rejected draft
    recoveries: int = 0  # re-prefills after a lost or failing worker
    drafts: int = 0  # drafts received
    prefill_ms: float = 0.0  # admission to the first token
    ttft_ms: float = 0.0  # queue_ms + prefill_ms
    decode_ms: float = 0.0  # first token to the last
    tokens_per_s: float = 0.0  # (N - 1) / decode time
    draft_ms: float = 0.0  # time inside the drafter, summed over drafts
    verify_ms: float = 0.0  # judging, summed
    stage_ms: list[float] = field(default_factory=list)  # mean forward time per stage for one exiting token
    batch: list[float] = field(default_factory=list)  # per stage, the mean batch its tokens ran in
    cycle_ms_p50: float = 0.0  # steady-state cycle time (accept after accept), median
    cycle_ms_p99: float = 0.0  # ... 99th percentile

    def __post_init__(self):
        self.stage_ms = self.stage_ms or [0.0] * self.n  # sums while running, means once finished
        self.batch = self.batch or [0.0] * self.n

    def finish(self, generated: int, cycles: int, exits: int) -> None:
        """Counts are final: set N, K, α, S0 and turn the per-stage sums into means over `exits`."""
        self.generated_tokens, self.cycles = generated, cycles
        self.alpha = alpha_of(generated, cycles) or 0.0
        self.theoretical_speedup = self.n * self.alpha
        self.stage_ms = [ms / max(1, exits) for ms in self.stage_ms]
        self.batch = [rows / max(1, exits) for rows in self.batch]

    def as_dict(self) -> dict:
        return asdict(self)

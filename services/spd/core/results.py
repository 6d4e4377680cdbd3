"""What a generation returns, shared by the AR decoder, the in-process engine and the services."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


def alpha_of(generated: int, cycles: int) -> float | None:
    """Step acceptance ratio α = N / K (None before any cycle ran)."""
    return generated / cycles if cycles else None


@dataclass
class Stats:
    n: int = 1  # pipeline stages (1 for AR)
    generated_tokens: int = 0  # N: committed tokens, the prefill's first token included
    cycles: int = 0  # K: pipeline cycles after prefill (AR: decode forwards)
    accepts: int = 0  # judgements that accepted the draft
    rejects: int = 0  # judgements that rejected it (each costs a flush)
    prefill_s: float = 0.0  # prompt forward, wall-clock seconds
    decode_s: float = 0.0  # everything after prefill, wall-clock seconds
    draft_s: float = 0.0  # time inside the drafter
    stage_s: list[float] = field(default_factory=list)  # time inside each stage
    verify_s: float = 0.0  # judging and committing

    @property
    def alpha(self) -> float | None:
        """Step acceptance ratio α = N / K (None before any cycle ran)."""
        return alpha_of(self.generated_tokens, self.cycles)

    @property
    def theoretical_speedup(self) -> float | None:
        """S0 = n·α: oracle speedup when a cycle costs 1/n of a full forward (design §5)."""
        return self.n * self.alpha if self.alpha is not None else None

    def as_dict(self) -> dict:
        d = asdict(self)
        d.update(alpha=self.alpha, theoretical_speedup=self.theoretical_speedup)
        return d


@dataclass
class Generation:
    token_ids: list[int]  # generated tokens only
    finish_reason: str  # "stop" (EOS / stop string) or "length"
    stats: Stats
    trace: list[dict] = field(default_factory=list)  # per-cycle records when tracing

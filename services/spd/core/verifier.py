"""The judgement step of design §4, shared by the in-process engine and the orchestrator.

The token leaving stage n at position `pos` carries the target distribution for pos+1. If a draft
is waiting for pos+1 it is judged (greedy: exact match; sampling: rejection sampling, see
sampling.verify); otherwise the target picks the token itself. Either way exactly one token is
committed. Anything but an accept voids everything in flight behind it: the caller flushes and
reseeds stage 1 with the committed token.

Lockstep cycle count K (design §4): a token reseeded into stage 1 (after prefill, a rejection or a
judgement without a draft) needs n cycles to leave stage n; after an accept the next token is one
cycle behind. So each commit after the first adds n if the previous commit reseeded, else 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from spd.core.sampling import STREAM_TARGET, SamplingParams, decided_token, keyed_generator, sampling_probs, sample, verify
from spd.core.stopping import StopRule


def commit_cycles(n: int, reseeded: bool) -> int:
    """Lockstep cycles a commit costs (design §4): n after a reseed (the token refills the whole
    pipeline before it exits), 1 when it follows an accepted draft (one token exits per cycle)."""
    return n if reseeded else 1


@dataclass
class Verdict:
    position: int  # position of the committed token
    token: int  # the committed token
    accepted: bool | None  # True/False for a judged draft, None when no draft was waiting
    draft: int | None  # the judged draft, if any
    finish: str | None  # "stop" / "length" when generation ends with this token

    @property
    def reseed(self) -> bool:
        """Does stage 1 restart from this token (flush everything behind it)?"""
        return not self.accepted


@dataclass
class Verifier:
    prompt: list[int]  # prompt token ids
    params: SamplingParams  # decoding parameters (identical on draft and target side)
    stop: StopRule  # EOS / stop strings / max tokens
    max_new: int  # generated tokens that fit (max tokens and the context limit)
    n: int  # pipeline stages, for the lockstep cycle count
    tokens: list[int] = field(default_factory=list)  # committed: prompt + generated
    drafts: dict[int, tuple[int, torch.Tensor | None]] = field(default_factory=dict)  # pos -> (token, q)
    accepts: int = 0
    rejects: int = 0
    cycles: int = 0  # lockstep K
    _reseeded: bool = True  # the last commit restarted stage 1 (prefill counts as one)

    def __post_init__(self):
        self.tokens = list(self.prompt)

    @property
    def generated(self) -> list[int]:
        return self.tokens[len(self.prompt):]

    def restart(self) -> None:
        """The pipeline is rebuilt from the committed tokens (a re-prefill after a fault): drafts in
        flight are void and the next judgement starts a fresh fill."""
        self.drafts = {}
        self._reseeded = True

    def offer(self, pos: int, token: int, q: torch.Tensor | None) -> None:
        """A draft for `pos` (q: its processed distribution over the target vocab when sampling)."""
        if pos >= len(self.tokens):
            self.drafts[pos] = (token, q)

    def wants_draft(self, pos: int, ctx: int) -> bool:
        """Would a drafter propose a token for `pos` (limits permitting)?"""
        return pos - len(self.prompt) < self.max_new and pos < ctx

    def judge(self, pos: int, logits: torch.Tensor | None = None, p: torch.Tensor | None = None,
              argmax: int | None = None) -> Verdict:
        """The token at `pos` left stage n with target logits [V], or in compact form: the processed
        p [V] (rejection sampling) or `argmax` = the target's decided token (greedy / gumbel)."""
        judged = pos + 1
        if judged != len(self.tokens):
            raise RuntimeError(f"judging position {judged} but {len(self.tokens)} tokens are committed")
        if argmax is None or (p is None and not self.params.decided):
            if logits is None:
                raise ValueError("judge needs the logits, or the decided token and (sampling) p")
            if argmax is None:  # the target's decided token (greedy / gumbel); stage n may send it ready
                argmax = decided_token(logits, self.params, judged)
            if p is None and not self.params.decided:
                p = sampling_probs(logits, self.params)
        if judged in self.drafts:
            draft, q = self.drafts.pop(judged)
            accepted, token = verify(p, argmax, draft, q, self.params, judged)
            self.accepts += accepted
            self.rejects += not accepted
        else:  # no draft waiting: the target picks, exactly as plain decoding would
            draft, accepted = None, None
            token = argmax if self.params.decided or p is None else \
                sample(p, keyed_generator(self.params.seed, judged, STREAM_TARGET))
        return self._commit(judged, token, accepted, draft)

    def first(self, logits: torch.Tensor | None = None, p: torch.Tensor | None = None,
              argmax: int | None = None) -> Verdict:
        """The prefill's last distribution gives the first generated token (no cycle counted)."""
        return self.judge(len(self.tokens) - 1, logits, p, argmax)

    def _commit(self, pos: int, token: int, accepted: bool | None, draft: int | None) -> Verdict:
        if self.generated:  # the first token comes from prefill, not from a cycle
            self.cycles += commit_cycles(self.n, self._reseeded)
        self.tokens.append(token)
        self._reseeded = not accepted
        if not accepted:
            self.drafts = {}
        reason = self.stop.finish_reason(self.generated)
        if reason is None and len(self.generated) >= self.max_new:
            reason = "length"
        return Verdict(pos, token, accepted, draft, reason)

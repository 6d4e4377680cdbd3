"""Inference-time state of the EAGLE draft: its KV cache over the verified prefix, chain drafting.

The cache holds `verified` positions computed from TARGET features (the committed prefix, minus the
newest committed token, whose target features do not exist yet) followed by the speculative
positions of the chain in progress; `rollback` drops the latter after every verification.
"""

from __future__ import annotations

import torch

from spd.core.masks import causal_mask
from spd.core.sampling import STREAM_DRAFT, SamplingParams, choose
from spd.eagle.model import EagleDraft


class EagleDrafter:
    def __init__(self, draft: EagleDraft):
        self.draft = draft
        self.cache = draft.new_cache()
        self.verified = 0  # draft positions [0, verified) were computed from target features

    def reset(self) -> None:
        self.cache.truncate(0)
        self.verified = 0

    def rollback(self) -> None:
        """Forget the speculative positions of the last chain."""
        self.cache.truncate(self.verified)

    @torch.inference_mode()
    def advance(self, states: torch.Tensor, next_tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append newly verified positions verified.. (states: [a, 3, d] target H[b]; next_tokens: [a],
        x_{i+1} for each). Returns the newest position's (own hidden [d], logits [V_s])."""
        a = states.shape[0]
        feature = self.draft.fuse_states(states.to(self.draft.d2t.device))  # [a, d]
        pos = torch.arange(self.verified, self.verified + a, device=feature.device)  # [a]
        h = self._run(feature, next_tokens, pos, causal_mask(a, self.verified, feature.device))
        self.verified += a
        return h[-1], self.draft.logits(h[-1])

    @torch.inference_mode()
    def speculate(self, h_prev: torch.Tensor, token: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One speculative position after the cache end: (own hidden of the previous position [d],
        token) -> (own hidden [d], logits [V_s])."""
        pos = torch.tensor([self.cache.length], device=h_prev.device)
        h = self._run(h_prev.unsqueeze(0), torch.tensor([token]), pos, None)
        return h[0], self.draft.logits(h[0])

    def _run(self, feature, tokens, pos, mask) -> torch.Tensor:
        h = self.draft.hidden(feature, tokens, pos, mask, self.cache)  # [T, d]
        self.cache.commit()
        return h

    def full_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """Draft logits [V_s] -> target-vocabulary logits [V] (-inf outside the draft vocabulary)."""
        full = torch.full((self.draft.config.target_vocab,), float("-inf"), dtype=torch.float32)
        full[self.draft.d2t.cpu()] = logits.float().cpu()
        return full

    def chain(self, states: torch.Tensor, next_tokens: torch.Tensor, k: int, params: SamplingParams,
              first_position: int) -> tuple[list[int], list[torch.Tensor | None]]:
        """Advance over the newly verified positions, then draft k tokens for positions
        first_position.. (k draft forwards). Returns (drafts, q per draft; None when greedy)."""
        drafts: list[int] = []
        qs: list[torch.Tensor | None] = []
        h, logits = self.advance(states, next_tokens)
        for j in range(k):
            if j:
                h, logits = self.speculate(h, drafts[-1])
            token, q = choose(self.full_logits(logits), params, first_position + j, STREAM_DRAFT)
            drafts.append(token)
            qs.append(q)
        return drafts, qs

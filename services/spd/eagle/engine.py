"""EAGLE-3-style speculative decoding in one process (design §9): chain drafting + block verification.

Each round: the draft catches up on the newly verified positions and drafts a chain d_1..d_k; the
target runs [last committed token, d_1..d_k] (k+1 tokens) in ONE forward; drafts are accepted
while they match the target's choice (greedy / Gumbel coupling) or pass rejection sampling; the
first mismatch commits the correction, a fully accepted chain commits the bonus token. Both KV
caches are truncated to the committed prefix. Greedy output equals `ar_generate` token for token;
sampled output has the target's distribution (spd.core.sampling).

Stats: cycles = rounds (target forwards after prefill), accepts = accepted drafts, rejects = rounds
ending in a rejection, stage_s[0] = target time, draft_s, verify_s; `tau(stats)` = decode tokens per
round.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from spd.core.results import Generation, Stats
from spd.core.sampling import SamplingParams, choose, verify
from spd.core.split import produces, uniform_split
from spd.core.stage import Stage
from spd.core.stopping import StopRule
from spd.core.target import (
    check_prompt,
    context_limit,
    load_pipeline,
    max_new_tokens,
    run_through,
)
from spd.eagle.drafter import EagleDrafter
from spd.eagle.model import EagleDraft


def tau(stats: Stats) -> float | None:
    """τ = decode-phase tokens (the prefill's token excluded) per draft–verify round."""
    return (stats.generated_tokens - 1) / stats.cycles if stats.cycles else None


def load_eagle(model_dir: Path, draft_dir: Path, device="cpu", dtype=torch.float32) -> tuple[list[Stage], EagleDraft]:
    """The target as one in-process stage reporting the draft's feature layers, and the trained draft."""
    from spd.models.loading import load_config

    draft = EagleDraft.load(draft_dir, device=device, dtype=dtype)
    config = load_config(model_dir)
    stages = load_pipeline(model_dir, config, uniform_split(config.num_hidden_layers, 1),
                           tuple(draft.config.feature_layers), device, dtype)
    draft.set_embedding(stages[0].embed.weight)
    return stages, draft


def ensure_anchors(stages: list[Stage], layers: list[int]) -> None:
    """Make the in-process stages also report H[b] for b in layers (the stage owning layer b adds it)."""
    for b in layers:
        if any(b in s.anchors for s in stages):
            continue
        owner = [s for s in stages if produces(s.layer_range, b)]
        if not owner:
            raise ValueError(f"no stage produces H[{b}]")
        owner[0].anchors = tuple(sorted({*owner[0].anchors, b}))


class EagleEngine:
    def __init__(self, stages: list[Stage], draft: EagleDraft, k: int):
        """stages: the target in process (any split; the feature layers are added to their anchors);
        draft: an EagleDraft (its embedding is taken from stages[0] if not set); k: chain length."""
        self.stages, self.draft, self.k = stages, draft, k
        self.drafter = EagleDrafter(draft)
        self.layers = list(draft.config.feature_layers)
        ensure_anchors(stages, self.layers)
        if draft.embed_weight.numel() == 0:
            draft.set_embedding(stages[0].embed.weight)

    @classmethod
    def from_dir(cls, stages: list[Stage], draft_dir: Path, k: int) -> EagleEngine:
        """An engine over existing target stages with the trained draft saved in draft_dir."""
        s0 = stages[0]
        return cls(stages, EagleDraft.load(draft_dir, device=s0.device, dtype=s0.embed.weight.dtype), k)

    def _target(self, x: list[int], start: int, stats: Stats):
        """Target forward of tokens x at start..: (logits [T, V], states [T, 3, d])."""
        t0 = time.perf_counter()
        found: dict[int, torch.Tensor] = {}
        out = run_through(self.stages, torch.tensor(x), start, lambda j, o: found.update(o.anchors))
        stats.stage_s[0] += time.perf_counter() - t0
        return out.logits, torch.stack([found[b] for b in self.layers], dim=1)

    def _draft_chain(self, states, next_tokens, k, params, first_position, stats: Stats):
        t0 = time.perf_counter()
        drafts, qs = self.drafter.chain(states, torch.tensor(next_tokens), k, params, first_position)
        stats.draft_s += time.perf_counter() - t0
        return drafts, qs

    @staticmethod
    def _judge(logits, drafts, qs, params: SamplingParams, first_position: int) -> tuple[list[int], bool]:
        """Judge the chain against target logits [k+1, V]. Returns (committed tokens, rejected?)."""
        committed = []
        for j, draft in enumerate(drafts):
            target_token, p = choose(logits[j], params, first_position + j)
            accepted, token = verify(p, target_token, draft, qs[j], params, first_position + j)
            committed.append(token)
            if not accepted:
                return committed, True
        committed.append(choose(logits[len(drafts)], params, first_position + len(drafts))[0])  # bonus
        return committed, False

    def generate(self, prompt_ids: list[int], params: SamplingParams, stop: StopRule) -> Generation:
        check_prompt(prompt_ids, self.stages)
        stats = Stats(n=1, stage_s=[0.0])
        for s in self.stages:
            s.truncate(0)
        self.drafter.reset()
        limit = StopRule(max_new_tokens(len(prompt_ids), stop, self.stages), stop.eos_ids, stop.stop, stop.tokenizer)
        ctx = context_limit(self.stages)
        t0 = time.perf_counter()
        logits, states = self._target(prompt_ids, 0, stats)
        stats.prefill_s = time.perf_counter() - t0
        generated = [choose(logits[-1], params, len(prompt_ids))[0]]
        tokens = list(prompt_ids) + generated
        pending, nxt = states, tokens[1:]  # verified positions the draft has not seen, their x_{i+1}
        while not limit.finish_reason(generated):
            L = len(tokens)  # committed length; the target's KV holds positions < L-1
            k = min(self.k, limit.max_tokens - len(generated) - 1, ctx - L)
            drafts, qs = self._draft_chain(pending, nxt, k, params, L, stats)
            logits, states = self._target([tokens[-1]] + drafts, L - 1, stats)
            stats.cycles += 1
            t1 = time.perf_counter()
            committed, rejected = self._judge(logits, drafts, qs, params, L)
            stats.rejects += int(rejected)
            for j, token in enumerate(committed):
                generated.append(token)
                tokens.append(token)
                stats.accepts += j < len(committed) - 1  # all but the correction / bonus token
                if limit.finish_reason(generated):
                    break
            for s in self.stages:
                s.truncate(len(tokens) - 1)
            self.drafter.rollback()
            pending, nxt = states[: len(committed)], committed
            stats.verify_s += time.perf_counter() - t1
        stats.generated_tokens = len(generated)
        stats.decode_s = time.perf_counter() - t0 - stats.prefill_s
        return Generation(generated, limit.finish_reason(generated) or "length", stats)

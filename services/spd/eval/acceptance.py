"""Exact greedy acceptance without running pipeline cycles.

Greedy SPD commits exactly the AR tokens, so the only unknown is each judgement's verdict, and
that depends only on the draft for the judged position. The draft for position j is made with the
newest token j−1 and the current fill base b (the last reseed), from the staircase
depth(i) = min(n, s0 + j−1−i) for i ≥ b, n before. Drafts conditioned on a token that is later
rejected are never judged, so they do not matter. Replaying only the drafter over the AR run —
whose anchor states, computed token by token, are bit-identical to the pipeline's — gives every
verdict, hence N, K, α, exactly as the live engine counts them:

    after prefill or a reject at j: b = j;   K += n for a commit after a reseed, else 1.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from spd.core.drafter import DrafterState
from spd.core.sampling import SamplingParams, choose
from spd.core.schedule import drafts, staircase_offset
from spd.core.stage import Stage
from spd.core.stopping import StopRule
from spd.core.target import max_new_tokens, run_through
from spd.core.verifier import commit_cycles


@dataclass
class Acceptance:
    generated_tokens: int  # N
    cycles: int  # K (lockstep)
    accepts: int
    rejects: int

    @property
    def alpha(self) -> float | None:
        return self.generated_tokens / self.cycles if self.cycles else None


def ar_with_anchors(stages: list[Stage], prompt: list[int], stop: StopRule,
                    params: SamplingParams = SamplingParams()) -> tuple[list[int], list[dict]]:
    """Greedy (or keyed-sampled) AR through the stages, keeping every position's anchor states {b: [d]}."""
    generated, anchors, _ = ar_trace(stages, prompt, stop, params)
    return generated, anchors


def ar_trace(stages: list[Stage], prompt: list[int], stop: StopRule, params: SamplingParams = SamplingParams(),
             keep_dists: bool = False, timing: dict | None = None
             ) -> tuple[list[int], list[dict], list[tuple[torch.Tensor, torch.Tensor]]]:
    """AR decoding that also returns anchor states per position and, with `keep_dists` (sampling only),
    the target's processed distribution of each generated token as its support (ids [s], probs [s]).
    `timing`, if given, receives prefill_s and decode_s (wall-clock)."""
    anchors: list[dict] = []
    dists: list[tuple[torch.Tensor, torch.Tensor]] = []

    def keep(start: int, count: int):
        def on_stage(j, out):
            for k in range(count):
                if start + k == len(anchors):
                    anchors.append({})
                anchors[start + k].update({b: h[k] for b, h in out.anchors.items()})
        return on_stage

    for stage in stages:
        stage.truncate(0)
    t0 = time.perf_counter()
    out = run_through(stages, torch.tensor(prompt), 0, keep(0, len(prompt)))
    t1 = time.perf_counter()
    limit = max_new_tokens(len(prompt), stop, stages)
    generated: list[int] = []
    while True:
        pos = len(prompt) + len(generated)
        assert out.logits is not None  # the last stage has the LM head
        token, probs = choose(out.logits[-1], params, pos)
        generated.append(token)
        if keep_dists and probs is not None:
            ids = probs.nonzero()[:, 0]  # support after temperature / top-k / top-p
            dists.append((ids, probs[ids]))
        if stop.finish_reason(generated) or len(generated) >= limit:
            if timing is not None:
                timing.update(prefill_s=t1 - t0, decode_s=time.perf_counter() - t1)
            return generated, anchors, dists
        out = run_through(stages, torch.tensor([token]), pos, keep(pos, 1))


def replay(drafter: DrafterState, prompt: list[int], generated: list[int], anchors: list[dict],
           schedule: str = "pre") -> Acceptance:
    """Verdicts of every judgement of a greedy SPD run that commits `generated` after `prompt`."""
    n, s0 = drafter.split.n, staircase_offset(schedule)
    tokens = list(prompt) + list(generated)
    P, T = len(prompt), len(tokens)
    drafter.reset()
    _commit(drafter, 0, tokens[:P + 1], anchors, n)
    base, reseeded, result = P, True, Acceptance(len(generated), 0, 0, 0)
    for j in range(P + 1, T):  # judge position j
        has_draft = drafts(schedule, n)
        accepted = has_draft and drafter.draft(SamplingParams(), drafter.staircase(base, s0)).token == tokens[j]
        result.cycles += commit_cycles(n, reseeded)
        if has_draft:
            result.accepts += accepted
            result.rejects += not accepted
        if not accepted:
            base = j
        reseeded = not accepted
        if j < T - 1:  # the last token is never forwarded
            _commit(drafter, j, tokens[j:j + 1], anchors, n)
    return result


def _commit(drafter: DrafterState, pos: int, tokens: list[int], anchors: list[dict], n: int) -> None:
    """Positions pos.. enter the drafter with all their anchors (depth n; staircases ask for less)."""
    drafter.enter(pos, torch.tensor(tokens))
    stacked = {b: torch.stack([anchors[pos + k][b] for k in range(len(tokens))]) for b in drafter.anchors}
    drafter.observe(pos, len(tokens), n, stacked)


@dataclass
class EagleAcceptance:
    generated_tokens: int  # N
    cycles: int  # draft–verify rounds after the prefill
    accepts: int  # drafts accepted

    @property
    def tau(self) -> float | None:
        """Decode tokens (the prefill's excluded) per round, as spd.eagle.engine.tau."""
        return (self.generated_tokens - 1) / self.cycles if self.cycles else None


def eagle_replay(drafter, layers: list[int], prompt: list[int], generated: list[int], anchors: list[dict],
                 k: int, max_tokens: int, context: int) -> EagleAcceptance:
    """The rounds of a greedy EAGLE-3 run (spd.eagle.engine.EagleEngine.generate) that commits
    `generated` after `prompt`, with the target's verdicts read off its own greedy text instead of
    a verification forward. A round drafts d_1..d_k at committed length L; the target accepts the
    longest prefix with d_j = x_{L+j-1}, then commits its own next token (correction or bonus):

        m = max{j : d_1..d_j all match},   commit x_L..x_{L+m},   accepts += m.

    The draft then catches up on the committed positions' target features (H[layers] at L-1 ..
    L-1+m), exactly what the live engine feeds it from the verification forward. `max_tokens`:
    the run's token cap (after the context clamp); `context`: the target's position limit."""
    def features(a: int, b: int) -> torch.Tensor:  # [b - a, len(layers), d]
        return torch.stack([torch.stack([anchors[i][layer] for layer in layers]) for i in range(a, b)])

    drafter.reset()
    P, G = len(prompt), len(generated)
    tokens = list(prompt) + generated[:1]
    pending, nxt = features(0, P), tokens[1:]
    out = EagleAcceptance(G, 0, 0)
    while len(tokens) - P < G:
        L, g = len(tokens), len(tokens) - P  # committed length; tokens generated so far
        chain, _ = drafter.chain(pending, torch.tensor(nxt), min(k, max_tokens - g - 1, context - L), SamplingParams(), L)
        m = 0
        while m < len(chain) and g + m < G and chain[m] == generated[g + m]:
            m += 1
        committed = generated[g:g + m + 1]  # (m tokens only where the run ends inside the chain)
        out.cycles += 1
        out.accepts += m
        drafter.rollback()
        pending, nxt = features(L - 1, L - 1 + len(committed)), committed
        tokens += committed
    return out

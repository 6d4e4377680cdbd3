"""Sampled (T > 0) acceptance of SPD / PPSD, estimated without running cycles.

Along a target-sampled sequence (the AR reference with the same processing and keyed seed), the
draft for position j made from the staircase with fill base b is accepted with probability

    β_j(b) = Σ_x q(x)·min(1, p(x)/q(x)) = Σ_x min(p_j(x), q_j^b(x))

(speculative sampling), p the target's processed distribution of token j, q the PDM's with the same
temperature / top-k / top-p. The cycle count depends on the verdicts only through the bases (a
reject at j reseeds: b = j), so E[K] is estimated by simulating the verdict chain with these
probabilities (`sims` chains per prompt). It is an estimate, not an exact count: after a rejection
the live engine commits a residual sample, so its sequence is not the AR sample the β were measured
on (each committed token is still target-distributed). `benchmarks`/`spd eval` check it against live
engine runs.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from spd.core.drafter import DrafterState
from spd.core.sampling import SamplingParams
from spd.core.schedule import staircase_offset
from spd.core.verifier import commit_cycles
from spd.eval.acceptance import _commit


@dataclass
class SampledAcceptance:
    generated_tokens: int  # N
    expected_cycles: float  # E[K] over the simulated verdict chains
    mean_beta: float  # mean per-judgement acceptance probability over the chains' judgements

    @property
    def alpha(self) -> float | None:
        return self.generated_tokens / self.expected_cycles if self.expected_cycles else None


def overlap(p: tuple[torch.Tensor, torch.Tensor], q: torch.Tensor) -> float:
    """Σ_x min(p(x), q(x)); p as its support (ids [s], probs [s]), q dense [V]."""
    ids, probs = p
    return float(torch.minimum(probs, q[ids]).sum())


def betas(drafter: DrafterState, prompt: list[int], generated: list[int], anchors: list[dict],
          dists: list[tuple[torch.Tensor, torch.Tensor]], params: SamplingParams,
          schedule: str = "pre") -> list[dict[int, float]]:
    """β[j - P - 1][b] for every judged position j and every distinct fill base b it can be drafted from."""
    n, s0 = drafter.split.n, staircase_offset(schedule)
    tokens = list(prompt) + list(generated)
    P, T = len(prompt), len(tokens)
    drafter.reset()
    _commit(drafter, 0, tokens[:P + 1], anchors, n)
    out = []
    for j in range(P + 1, T):  # the draft for j is made with newest token j-1
        row = {}
        for b in range(max(P, j - n), j):  # older bases give the same staircase as j - n
            drafter.cache.truncate(min(drafter.cache.length, b))  # recompute the staircase positions
            q = drafter.draft(params, drafter.staircase(b, s0)).q  # [V] processed draft distribution
            assert q is not None  # set whenever params sample (T > 0)
            row[b] = overlap(dists[j - P], q)
        out.append(row)
        if j < T - 1:
            _commit(drafter, j, tokens[j:j + 1], anchors, n)
    return out


def expected_cycles(beta: list[dict[int, float]], P: int, n: int, sims: int = 200, seed: int = 0) -> tuple[float, float]:
    """Mean K and mean β of `sims` simulated verdict chains (the replay's counting rule)."""
    rng = random.Random(seed)
    K_total, judged, beta_sum = 0, 0, 0.0
    for _ in range(sims):
        base, reseeded = P, True
        for i, row in enumerate(beta):
            j = P + 1 + i
            b = max(base, j - n, P)
            accepted = rng.random() < row[b]
            beta_sum, judged = beta_sum + row[b], judged + 1
            K_total += commit_cycles(n, reseeded)
            if not accepted:
                base = j
            reseeded = not accepted
    return K_total / sims, beta_sum / max(judged, 1)


def estimate(drafter: DrafterState, prompt: list[int], generated: list[int], anchors: list[dict],
             dists, params: SamplingParams, schedule: str = "pre", sims: int = 200, seed: int = 0) -> SampledAcceptance:
    if params.greedy or params.coupling != "rejection":
        raise ValueError("the sampled estimate is for rejection-sampled verification (temperature > 0)")
    beta = betas(drafter, prompt, generated, anchors, dists, params, schedule)
    K, mean_beta = expected_cycles(beta, len(prompt), drafter.split.n, sims, seed)
    return SampledAcceptance(len(generated), K, mean_beta)

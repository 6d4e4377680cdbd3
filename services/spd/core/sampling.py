"""Token selection and lossless verification, with randomness keyed by (seed, position).

Both sides of a judgement go through the same processing (temperature, then top-k, then top-p), so
`p` (target) and `q` (draft) are distributions over the same support rules.

Speculative rejection sampling (lossless): the draft x ~ q is accepted with probability
min(1, p(x)/q(x)); on rejection the correction is drawn from r = normalize(max(0, p - q)). Then
P(output = y) = q(y)·min(1, p(y)/q(y)) + (1 - Σ_x min(p, q)(x))·r(y)
             = min(p, q)(y) + (p(y) - min(p, q)(y)) = p(y),
so the output has exactly the target's distribution.

Gumbel coupling (`coupling="gumbel"`, an option): both sides share the noise G[pos] ~ Gumbel^V keyed
by (seed, position). The target's token is argmax(log p + G) — an exact sample of p (Gumbel-max
trick) — and the drafter proposes argmax(log q + G); the draft is accepted iff they are equal, and
the committed token is always the target's. So every committed token is a fixed function of
(p, seed, position): identical to plain AR sampling with the same seed, and identical after a
fault and recovery whatever the drafter did. The price is a lower acceptance than min(1, p/q).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

# Independent random streams per position: one number never serves two purposes.
STREAM_TARGET, STREAM_DRAFT, STREAM_ACCEPT, STREAM_RESIDUAL, STREAM_GUMBEL = 0, 1, 2, 3, 4
COUPLINGS = ("rejection", "gumbel")


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy (argmax); > 0 samples
    top_k: int = 0  # keep the k most likely tokens; 0 = off
    top_p: float = 1.0  # keep the smallest set with cumulative probability >= top_p; 1 = off
    seed: int = 0  # with the position, keys every random number
    coupling: str = "rejection"  # sampled verification: rejection (max acceptance) | gumbel (fault-proof)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def decided(self) -> bool:
        """Is the target's token a fixed function of (logits, seed, position)? Then judging a draft
        is an equality test (greedy, or Gumbel-coupled sampling)."""
        return self.greedy or self.coupling == "gumbel"


def keyed_generator(seed: int, position: int, stream: int) -> torch.Generator:
    """A generator that depends only on (seed, position, stream): replays are reproducible."""
    state = np.random.SeedSequence([seed & 0xFFFFFFFF, seed >> 32, position, stream]).generate_state(2, np.uint64)
    return torch.Generator().manual_seed(int(state[0] >> 1))


def sampling_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """logits: [V] -> probabilities [V] after temperature, top-k and top-p (float32, on CPU)."""
    logits = logits.float().cpu() / params.temperature
    if 0 < params.top_k < logits.numel():
        kth = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)
        before = torch.cumsum(sorted_p, 0) - sorted_p  # mass strictly before each token
        drop = order[before >= params.top_p]
        probs[drop] = 0.0
        probs /= probs.sum()
    return probs


def sample(probs: torch.Tensor, gen: torch.Generator) -> int:
    return int(torch.multinomial(probs, 1, generator=gen))


def gumbel_noise(seed: int, position: int, size: int) -> torch.Tensor:
    """G[position]: [size] standard Gumbel noise keyed by (seed, position)."""
    u = torch.rand(size, generator=keyed_generator(seed, position, STREAM_GUMBEL)).clamp_(1e-12, 1 - 1e-7)
    return -torch.log(-torch.log(u))


def coupled_sample(probs: torch.Tensor, seed: int, position: int) -> int:
    """argmax(log p + G[position]): an exact sample of p, shared by target and drafter."""
    return int(torch.argmax(torch.log(probs) + gumbel_noise(seed, position, probs.numel())))


def choose(logits: torch.Tensor, params: SamplingParams, position: int, stream: int = STREAM_TARGET) -> tuple[int, torch.Tensor | None]:
    """Pick the token for `position` from logits [V]: argmax, or a keyed sample. Returns (token, probs)."""
    if params.greedy:
        return int(torch.argmax(logits)), None
    probs = sampling_probs(logits, params)
    if params.coupling == "gumbel":
        return coupled_sample(probs, params.seed, position), probs
    return sample(probs, keyed_generator(params.seed, position, stream)), probs


def decided_token(logits: torch.Tensor, params: SamplingParams, position: int) -> int:
    """The token a draft for `position` is judged against by equality: the target's own choice when
    it is decided (greedy, Gumbel-coupled), else the argmax (only reported then; rejection sampling
    judges with the distribution)."""
    return choose(logits, params, position)[0] if params.decided else int(torch.argmax(logits))


def verify(p: torch.Tensor | None, target_token: int, draft: int, q: torch.Tensor | None,
           params: SamplingParams, position: int) -> tuple[bool, int]:
    """Judge the draft for `position`. Returns (accepted, committed token).

    greedy / gumbel: accept iff draft == the target's decided token (argmax, or argmax(log p + G));
    else commit that token.
    rejection sampling: accept with prob min(1, p(x)/q(x)); else commit a sample of
    normalize(max(0, p - q)).
    """
    if params.decided:
        return draft == target_token, target_token
    if p is None or q is None:
        raise ValueError("rejection sampling judges with both distributions, p and q")
    u = torch.rand((), generator=keyed_generator(params.seed, position, STREAM_ACCEPT))
    px, qx = float(p[draft]), float(q[draft])
    if qx > 0 and u < min(1.0, px / qx):
        return True, draft
    residual = torch.clamp(p - q, min=0.0)
    if residual.sum() <= 0:  # p == q exactly: cannot happen after a rejection, kept for safety
        residual = p
    return False, sample(residual / residual.sum(), keyed_generator(params.seed, position, STREAM_RESIDUAL))

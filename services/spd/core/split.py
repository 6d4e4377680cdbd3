"""Pipeline geometry: stage boundaries e[0..n], anchors B, and the depth rule of design §2.

Stage j (1-based) owns decoder layers (e[j-1], e[j]]; stage 1 also owns the embedding, stage n the
final norm and LM head. H[l] is the residual stream after l layers, so anchor b is produced by the
stage with e[j-1] < b <= e[j] (b = 0, the embedding, by stage 1).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PipelineSplit:
    boundaries: tuple[int, ...]  # e[0] = 0 < e[1] < ... < e[n] = L

    @property
    def n(self) -> int:
        return len(self.boundaries) - 1

    @property
    def num_layers(self) -> int:
        return self.boundaries[-1]

    def layers_of(self, stage: int) -> range:
        """Global layer indices (0-based modules) run by 1-based `stage`: H[e[j-1]] -> H[e[j]]."""
        return range(self.boundaries[stage - 1], self.boundaries[stage])

    def l_max(self, depth: int) -> int:
        """Deepest layer whose output exists for a token that completed `depth` stages."""
        return self.boundaries[min(depth, self.n)]

    def eligible(self, anchors: tuple[int, ...], depth: int) -> tuple[int, ...]:
        """E(k) = {b in B : b <= l_max(k)}: always a prefix of the sorted anchors."""
        return tuple(b for b in anchors if b <= self.l_max(depth))

    def anchors_of(self, anchors: tuple[int, ...], stage: int) -> tuple[int, ...]:
        """Anchors produced by `stage`."""
        return tuple(b for b in anchors if produces(self.layers_of(stage), b))


def produces(layers: range, b: int) -> bool:
    """Whether the stage running `layers` (global indices) produces anchor H[b]: the output of one
    of its layers, or the embedding (b = 0) when it runs layer 0."""
    return layers.start < b <= layers.stop or (b == 0 and layers.start == 0)


def check_width(n: int, num_layers: int) -> None:
    """A pipeline has 1..L stages (each owns at least one decoder layer)."""
    if not 1 <= n <= num_layers:
        raise ValueError(f"n must be in 1..{num_layers} (the model's decoder layers), got {n}")


def uniform_split(num_layers: int, n: int) -> PipelineSplit:
    """e[j] = round(j*L/n)."""
    check_width(n, num_layers)
    return PipelineSplit(tuple(round(j * num_layers / n) for j in range(n + 1)))


def explicit_split(boundaries: list[int], num_layers: int) -> PipelineSplit:
    b = tuple(boundaries)
    if b[0] != 0 or b[-1] != num_layers or any(x >= y for x, y in zip(b, b[1:])):
        raise ValueError(f"boundaries must rise strictly from 0 to {num_layers}, got {list(b)}")
    return PipelineSplit(b)


def balanced_split(num_layers: int, n: int, layer_cost: float, head_cost: float, embed_cost: float = 0.0) -> PipelineSplit:
    """Contiguous split minimising the slowest stage when stage 1 pays `embed_cost` and stage n `head_cost`.

    Exact dynamic programme over boundaries (L and n are small).
    """
    if not 1 <= n <= num_layers:
        raise ValueError(f"n must be in 1..{num_layers}, got {n}")
    INF = float("inf")

    def cost(j: int, lo: int, hi: int) -> float:  # stage j (1-based) owning layers [lo, hi)
        return (hi - lo) * layer_cost + (embed_cost if j == 1 else 0.0) + (head_cost if j == n else 0.0)

    # best[j][l]: minimal max stage cost placing layers [0, l) into stages 1..j; arg for backtracking.
    best = [[INF] * (num_layers + 1) for _ in range(n + 1)]
    arg = [[0] * (num_layers + 1) for _ in range(n + 1)]
    best[0][0] = 0.0
    for j in range(1, n + 1):
        for hi in range(j, num_layers + 1):
            for lo in range(j - 1, hi):
                c = max(best[j - 1][lo], cost(j, lo, hi))
                if c < best[j][hi]:
                    best[j][hi], arg[j][hi] = c, lo
    bounds, hi = [num_layers], num_layers
    for j in range(n, 0, -1):
        hi = arg[j][hi]
        bounds.append(hi)
    return PipelineSplit(tuple(reversed(bounds)))


def default_anchors(split: PipelineSplit) -> tuple[int, ...]:
    """[0, e1, e3, e6, L-1], clamped to L and deduplicated (e[j] past n clamps to L)."""
    L = split.num_layers
    picks = [0, L - 1] + [split.boundaries[min(j, split.n)] for j in (1, 3, 6)]
    return tuple(sorted({min(max(b, 0), L) for b in picks}))

"""The drafting schedule (design §4): when in a cycle the drafter proposes the next token.

pre  the draft is made from the staircase as it stands before the cycle's stage forwards: the
     newest in-flight position is at depth s0 = 0;
post it is made after them: the newest is at depth s0 = 1 (fresher anchors, one cycle later).
"""

from __future__ import annotations

SCHEDULES = ("pre", "post")


def check(schedule: str) -> str:
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be 'pre' or 'post', got {schedule!r}")
    return schedule


def staircase_offset(schedule: str) -> int:
    """s0: the depth of the newest in-flight position when the drafter proposes."""
    return SCHEDULES.index(check(schedule))


def drafts(schedule: str, n: int) -> bool:
    """Whether a pipeline of n stages drafts at all: post-step with one stage never does (the
    token leaves the only stage, and is judged, in the cycle it would be drafted after)."""
    return not (check(schedule) == "post" and n == 1)


def judged_fills(p: list[float]) -> list[float]:
    """Share of judged drafts made at fill level a = 1..n (n = len(p)) when a draft made at fill a is
    accepted with probability p[a-1] (design §4: a reject reseeds, and the next draft judged is the
    a = 1 draft; an accept moves one fill up, up to a = n). The stationary law of that chain:
    w_a ∝ p_1···p_(a-1) for a < n and w_n ∝ p_1···p_(n-1) / (1 - p_n)."""
    n, w, run = len(p), [], 1.0
    for a in range(1, n):
        w.append(run)
        run *= p[a - 1]
    w.append(run / max(1.0 - p[n - 1], 1e-9))
    total = sum(w)
    return [x / total for x in w]


def alpha_from_fills(p: list[float]) -> float:
    """Step acceptance α = N / K predicted from the acceptance p[a-1] of drafts made at each fill
    level a: a judgement costs one cycle, plus n - 1 refill cycles after a reject (design §4), so
    α = 1 / Σ_a w_a (p_a + (1 - p_a) n), w = judged_fills(p); = 1 / (p + (1 - p) n) when p is flat."""
    n = len(p)
    return 1.0 / sum(w * (q + (1 - q) * n) for w, q in zip(judged_fills(p), p))

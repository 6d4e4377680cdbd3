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

"""Stage boundaries, anchors and eligible sets (design §2)."""

import pytest

from spd.core.split import balanced_split, default_anchors, explicit_split, uniform_split


def test_uniform_split_rounds_j_times_l_over_n():
    assert uniform_split(30, 5).boundaries == (0, 6, 12, 18, 24, 30)
    assert uniform_split(32, 3).boundaries == (0, 11, 21, 32)
    assert uniform_split(6, 6).boundaries == tuple(range(7))


def test_split_rejects_more_stages_than_layers():
    with pytest.raises(ValueError):
        uniform_split(4, 5)
    with pytest.raises(ValueError):
        explicit_split([0, 3, 3, 6], 6)


def test_balanced_split_gives_the_head_stage_fewer_layers():
    split = balanced_split(30, 5, layer_cost=2.5, head_cost=14.0)
    sizes = [len(split.layers_of(j)) for j in range(1, 6)]
    assert sum(sizes) == 30 and sizes[-1] < sizes[0]
    costs = [s * 2.5 + (14.0 if j == 4 else 0) for j, s in enumerate(sizes)]
    assert max(costs) <= 6 * 2.5 + 14.0  # never worse than uniform


def test_default_anchors_align_with_stage_boundaries():
    split = uniform_split(30, 5)
    assert default_anchors(split) == (0, 6, 18, 29, 30)
    assert default_anchors(uniform_split(32, 8)) == (0, 4, 12, 24, 31)


def test_eligible_anchors_grow_with_depth_and_depth1_adds_one():
    split = uniform_split(30, 5)
    anchors = default_anchors(split)
    assert split.eligible(anchors, 0) == (0,)
    assert split.eligible(anchors, 1) == (0, 6)
    assert split.eligible(anchors, 5) == anchors
    assert split.anchors_of(anchors, 1) == (0, 6) and split.anchors_of(anchors, 5) == (29, 30)

"""Batched stage forwards: several requests' tokens in one forward, each row exactly as alone.

The guarantee (core/stage.py): a stage with `rows = R` runs every single-token forward at the fixed
shape of R rows, so a request's hidden states, anchors and logits are bit-identical whether it runs
alone or batched with up to R - 1 others, whatever those others are and at whatever positions.
The drafter's batched drafts keep the same guarantee (core/drafter.py).
"""

from __future__ import annotations

import pytest
import torch

from conftest import pipeline
from spd.core.drafter import DrafterState
from spd.core.pdm import random_pdm
from spd.core.sampling import SamplingParams
from spd.core.split import default_anchors
from spd.core.target import run_through


def _stages(model_dir, n: int, rows: int):
    _, _, stages = pipeline(model_dir, n)
    for s in stages:
        s.rows = rows
    return stages


def _decode_alone(stages, prompt: list[int], steps: int, slot: int = 0) -> list[torch.Tensor]:
    """Greedy decode one request through the chain; the last stage's logits at every step."""
    out = run_through_slot(stages, torch.tensor(prompt), 0, slot)
    logits, pos = [out.logits[-1]], len(prompt)
    for _ in range(steps):
        h = torch.tensor([int(torch.argmax(logits[-1]))])
        for s in stages:
            out = s(h, pos, slot)
            h = out.hidden
        logits.append(out.logits[-1])
        pos += 1
    return logits


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_a_request_batched_with_others_computes_exactly_what_it_computes_alone(tiny_dir, arch):
    model = tiny_dir(arch, vocab_size=256, num_layers=4, hidden_size=64)
    rng = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 256, (L,), generator=rng).tolist() for L in (5, 9, 3, 12)]
    steps = 6
    alone = [_decode_alone(_stages(model, 2, rows=4), p, steps) for p in prompts]

    stages = _stages(model, 2, rows=4)
    outs = {}
    for slot, p in enumerate(prompts):  # prompts prefill one by one, each as one chunk
        outs[slot] = run_through_slot(stages, torch.tensor(p), 0, slot)
    logits = {slot: [o.logits[-1]] for slot, o in outs.items()}
    pos = {slot: len(p) for slot, p in enumerate(prompts)}
    for step in range(steps):
        active = [s for s in range(len(prompts)) if step < steps - s]  # requests leave at different times
        xs = [(s, torch.tensor([int(torch.argmax(logits[s][-1]))]), pos[s]) for s in active]
        for stage in stages:
            rows = stage.forward_rows(xs)
            xs = [(s, r.hidden, p) for (s, _, p), r in zip(xs, rows)]
        for (s, _, _), r in zip(xs, rows):
            logits[s].append(r.logits[-1])
            pos[s] += 1
    for slot in range(len(prompts)):
        got = logits[slot]
        assert all(torch.equal(a, b) for a, b in zip(got, alone[slot])), f"request {slot} differs when batched"


def run_through_slot(stages, x, start, slot):
    h = x
    for s in stages:
        out = s(h, start, slot)
        h = out.hidden
    return out


def test_the_row_count_changes_the_bits_which_is_why_the_shape_is_fixed(tiny_dir):
    # The problem the fixed shape solves: the same request decoded at 1 row and at 4 rows differs.
    model = tiny_dir("llama", vocab_size=256, num_layers=4, hidden_size=64)
    one, four = (_decode_alone(_stages(model, 2, rows=r), [1, 2, 3, 4, 5], 4) for r in (1, 4))
    assert torch.equal(one[0], four[0])  # the prompt runs as one chunk either way
    assert not all(torch.equal(a, b) for a, b in zip(one[1:], four[1:]))


def test_rows_1_is_the_plain_forward(tiny_dir):
    model = tiny_dir("llama", vocab_size=256, num_layers=2, hidden_size=64)
    plain, batched = _stages(model, 1, rows=1), _stages(model, 1, rows=1)
    ids = torch.tensor([3, 4, 5])
    run_through(plain, ids, 0)
    run_through(batched, ids, 0)
    a = plain[0](torch.tensor([7]), 3)
    (b,) = batched[0].forward_rows([(0, torch.tensor([7]), 3)])
    assert torch.equal(a.logits, b.logits) and torch.equal(a.hidden, b.hidden)


def test_forward_rows_refuses_more_tokens_than_rows_and_repeated_slots(tiny_dir):
    model = tiny_dir("llama", vocab_size=256, num_layers=2, hidden_size=64)
    (stage,) = _stages(model, 1, rows=2)
    x = torch.tensor([1])
    with pytest.raises(ValueError):
        stage.forward_rows([(0, x, 0), (1, x, 0), (2, x, 0)])
    with pytest.raises(ValueError):
        stage.forward_rows([(0, x, 0), (0, x, 0)])


def _drafter(model, n: int, rows: int, seed: int, committed: int, fill: int):
    """A drafter state with `committed` positions at depth n and `fill` in flight on the staircase
    (newest at depth 0), its anchors random but fixed by `seed`."""
    config, split, stages = pipeline(model, n)
    pdm = random_pdm(config, default_anchors(split), num_layers=2, seed=1)
    state = DrafterState(pdm, stages[0].embed, split, rows)
    g = torch.Generator().manual_seed(seed)
    d = config.hidden_size

    def anchors(count):
        return {b: torch.randn(count, d, generator=g) for b in pdm.config.anchors}

    state.enter(0, torch.randint(0, config.vocab_size, (committed,), generator=g))
    state.observe(0, committed, n, anchors(committed))
    for o in range(fill):
        state.enter(committed + o, torch.randint(0, config.vocab_size, (1,), generator=g))
        for q in range(committed, committed + o):  # every older in-flight token goes one stage deeper
            state.observe(q, 1, state.depth[q] + 1, anchors(1))
    return state


def test_a_draft_batched_with_others_is_exactly_the_draft_alone(tiny_dir):
    model = tiny_dir("llama", vocab_size=256, num_layers=4, hidden_size=64)
    n, rows, params = 4, 4, SamplingParams(temperature=1.0, seed=3)
    shapes = [(7, 4), (12, 1), (3, 3)]  # (committed, fill): different lengths, fills and catch-ups

    def states():
        return [_drafter(model, n, rows, seed, c, a) for seed, (c, a) in enumerate(shapes)]

    alone = [DrafterState.draft_many([(s, params, None)])[0] for s in states()]
    together = DrafterState.draft_many([(s, params, None) for s in states()])
    backwards = DrafterState.draft_many([(s, params, None) for s in reversed(states())])[::-1]
    for a, b, c in zip(alone, together, backwards):
        assert a.token == b.token == c.token and a.fill == b.fill == c.fill
        assert torch.equal(a.q, b.q) and torch.equal(a.q, c.q)
    assert [d.fill for d in alone] == [a for _, a in shapes]

"""THE test of PDM training (design §7): the masked training forward (spd.train.aligned) gives the same
logits as the incremental inference staircase (spd.core.drafter.DrafterState) for every position,
every fill level 1..n, both schedules and L_s in {1, 2, 3}, with and without the predecessor input
(PDMConfig.prev).

Part A builds each staircase with DrafterState.enter/observe exactly as the engine feeds it (prefix
prefilled through all stages; then per cycle every in-flight token advances one stage and a new one
enters) and compares the logits of DrafterState.draft (captured from the PDM call it makes) with the
training forward at the same position. Part B runs the real SPDEngine with a DrafterState (KV-cached
depth-n prefix, rejections, refills) and checks every draft it made against the training forward.
"""

from __future__ import annotations

import pytest
import torch

from spd.core.drafter import DrafterState
from spd.core.engine import SPDEngine
from spd.core.pdm import random_pdm
from spd.core.sampling import SamplingParams
from spd.core.split import default_anchors, uniform_split
from spd.core.stopping import StopRule
from spd.core.target import load_pipeline, run_through
from spd.models.loading import load_config
from spd.train.aligned import aligned_batch_hidden, aligned_logits, copy_depths, layout, needed_rows
from spd.train.trainer import batch_loss, loss_rows, target_to_draft

ATOL = 2e-4


def _setup(model_dir, n, ls, seed=0, prev=False):
    config = load_config(model_dir)
    split = uniform_split(config.num_hidden_layers, n)
    anchors = default_anchors(split)
    stages = load_pipeline(model_dir, config, split, anchors)
    g = torch.Generator().manual_seed(seed)
    draft_ids = torch.randperm(config.vocab_size, generator=g)[: config.vocab_size // 2]
    pdm = random_pdm(config, list(anchors), ls, draft_ids=draft_ids, seed=seed, prev=prev)
    with torch.no_grad():  # larger weights than the default init: logits of order 1-10, differences show
        for p in pdm.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.15, generator=g)
    return config, split, stages, pdm


class _Capture:
    """Records the logits the PDM's head produces (the inference path's own output: the drafter runs
    `pdm.hidden` then the head on the newest row)."""

    def __init__(self, pdm):
        self.out = []
        pdm.head.register_forward_hook(lambda mod, inp, out: self.out.append(out.detach().reshape(-1, out.shape[-1])))


def _stage_outputs(stages, x):
    """Anchor states per stage for tokens x, computed once by the real stages."""
    per_stage = {}
    for s in stages:
        s.truncate(0)
    run_through(stages, x, 0, lambda j, out: per_stage.__setitem__(j, out.anchors))
    return per_stage


def _anchor_tensor(per_stage, anchors, T):
    full = {}
    for outs in per_stage.values():
        full.update(outs)
    return torch.stack([full[b][:T] for b in anchors], dim=1)  # [T, m, d]


def _advance(drafter, per_stage, pos, n):
    """Token at `pos` completes its next stage (as a stage worker reports it)."""
    j = drafter.depth[pos] + 1
    if j <= n:
        drafter.observe(pos, 1, j, {b: h[pos:pos + 1] for b, h in per_stage[j].items()})


@pytest.mark.parametrize("ls,prev", [(1, False), (2, False), (3, False), (1, True), (2, True)])
@pytest.mark.parametrize("n", [3, 4])
def test_training_forward_equals_inference_staircase(tiny_dir, ls, prev, n):
    model_dir = tiny_dir("llama", num_layers=6, hidden_size=64)
    config, split, stages, pdm = _setup(model_dir, n, ls, seed=ls * 10 + n, prev=prev)
    T = 14
    x = torch.randint(0, config.vocab_size, (T,), generator=torch.Generator().manual_seed(ls + n))
    per_stage = _stage_outputs(stages, x)
    anchors = _anchor_tensor(per_stage, pdm.config.anchors, T)
    cap = _Capture(pdm)
    drafter = DrafterState(pdm, stages[0].embed, split)
    checked = 0
    for s0, schedule in ((0, "pre"), (1, "post")):
        for a in range(1, n + 1):
            with torch.no_grad():
                train = aligned_logits(pdm, anchors, split, a, s0)  # [T, V_s]: newest position t
            for t in range(a, T):  # at least one committed position before the staircase
                drafter.reset()
                first = t - a + 1  # oldest in-flight position
                drafter.enter(0, x[:first])
                for j in range(1, n + 1):  # prefill: the prefix runs through every stage
                    drafter.observe(0, first, j, {b: h[:first] for b, h in per_stage[j].items()})
                for p in range(first, t + 1):  # one cycle per entering token
                    for q in range(first, p):
                        _advance(drafter, per_stage, q, n)
                    drafter.enter(p, x[p:p + 1])
                if s0 == 1:  # post-step: the cycle's stage forwards happen before the draft
                    for q in range(first, t + 1):
                        _advance(drafter, per_stage, q, n)
                expect = [n] * first + [min(s0 + o, n) for o in reversed(range(a))]
                assert drafter.depth == expect
                cap.out.clear()
                drafter.draft(SamplingParams())
                infer = cap.out[-1][-1]
                torch.testing.assert_close(infer, train[t], atol=ATOL, rtol=1e-4,
                                           msg=f"{schedule} n={n} ls={ls} prev={prev} a={a} t={t}")
                checked += 1
    assert checked == 2 * sum(T - a for a in range(1, n + 1))


@pytest.mark.parametrize("schedule", ["pre", "post"])
@pytest.mark.parametrize("ls,prev", [(1, False), (2, False), (3, False), (2, True)])
def test_engine_drafts_match_training_forward(tiny_dir, schedule, ls, prev):
    """The real engine (cached prefix, rejections, refills): each draft's logits equal the training
    forward over the anchor states it saw, at its fill level."""
    n, s0 = 3, 0 if schedule == "pre" else 1
    model_dir = tiny_dir("llama", num_layers=6, hidden_size=64)
    config, split, stages, pdm = _setup(model_dir, n, ls, seed=ls, prev=prev)
    drafter = DrafterState(pdm, stages[0].embed, split)
    seen = []

    def snapshot(mod, inp, out):  # the head's output during a draft: the newest position's logits
        T = drafter.length
        seen.append((drafter.states[:T].clone(), list(drafter.depth), out.detach().reshape(-1, out.shape[-1])[-1]))

    handle = pdm.head.register_forward_hook(snapshot)
    engine = SPDEngine(stages, drafter, schedule)
    prompt = torch.randint(0, config.vocab_size, (5,), generator=torch.Generator().manual_seed(ls)).tolist()
    engine.generate(prompt, SamplingParams(), StopRule(40, frozenset()))
    handle.remove()
    assert len(seen) > 30
    fills = set()
    for states, depth, infer in seen:
        T = len(depth)
        a = sum(k < n for k in depth)
        if s0 == 1 and depth[-1] == n:  # post-step with the oldest already at depth n
            a = 0
        assert depth == [n] * (T - a) + [s0 + o for o in reversed(range(a))], depth
        if a == 0:
            continue
        fills.add(a)
        with torch.no_grad():
            train = aligned_logits(pdm, states, split, a, s0, rows=torch.tensor([T - 1]))[0]
        torch.testing.assert_close(infer, train, atol=ATOL, rtol=1e-4)
    assert fills == set(range(1, n + 1 - s0)), fills


def test_layout_mask_small():
    """Spot-check the mask against the attention rule written out by hand (pre, n=3, a=2)."""
    n, a, s0, T = 3, 2, 0, 4
    assert copy_depths(n, a, s0) == [0, 1, 3]
    dep, pos, mask = layout(T, n, a, s0)
    row = {(int(d), int(p)): r for r, (d, p) in enumerate(zip(dep, pos))}
    # newest position t=3 at depth 0 sees: itself (depth 0), t=2 at depth 1, t<=1 at depth n
    keys = {(int(dep[k]), int(pos[k])) for k in mask[row[(0, 3)]].nonzero()[:, 0]}
    assert keys == {(0, 3), (1, 2), (3, 1), (3, 0)}
    # depth-1 copy of position 2 (offset 1): itself at depth 1, predecessors at depth n
    keys = {(int(dep[k]), int(pos[k])) for k in mask[row[(1, 2)]].nonzero()[:, 0]}
    assert keys == {(1, 2), (3, 1), (3, 0)}
    # depth-n rows see depth-n rows only, causally
    keys = {(int(dep[k]), int(pos[k])) for k in mask[row[(3, 2)]].nonzero()[:, 0]}
    assert keys == {(3, 2), (3, 1), (3, 0)}


@pytest.mark.parametrize("ls,prev", [(1, False), (2, False), (3, False), (1, True), (2, True)])
def test_packed_training_forward_equals_the_masked_forward(tiny_dir, ls, prev):
    """The training path (the rows the loss rows need, several sequences packed, each at its own fill
    level; attention written out as band diagonals + the depth-n copy) == the dense [R, R] mask at the
    loss rows, including loss rows that start late (a prompt) and have gaps."""
    config = load_config(tiny_dir("llama", num_layers=6))
    g = torch.Generator().manual_seed(ls)
    for n, s0 in [(3, 0), (3, 1), (1, 0), (1, 1), (6, 1), (6, 0)]:
        split = uniform_split(config.num_hidden_layers, n)
        anchors = default_anchors(split)
        pdm = random_pdm(config, anchors, ls, seed=n + s0, prev=prev)
        items, dense = [], []
        for T, a in [(17, n), (9, 1), (23, max(1, n - 1)), (1, n)]:
            x = torch.randn(T, len(anchors), config.hidden_size, generator=g)
            rows = (torch.rand(T, generator=g) < 0.7).nonzero()[:, 0]
            rows = rows[rows >= T // 3] if len(rows[rows >= T // 3]) else torch.tensor([T - 1])  # a prompt, gaps
            items.append((x, a, rows))
            dense.append(aligned_logits(pdm, x, split, a, s0, rows, dense=True))
        fast = pdm.logits(aligned_batch_hidden(pdm, items, split, s0))
        torch.testing.assert_close(fast, torch.cat(dense), atol=1e-5, rtol=1e-4)
        whole = aligned_logits(pdm, items[0][0], split, n, s0)  # every position, one sequence
        torch.testing.assert_close(whole, aligned_logits(pdm, items[0][0], split, n, s0, dense=True), atol=1e-5, rtol=1e-4)


def test_needed_rows_keep_only_the_loss_rows_diagonals():
    """Staircase copies only along the loss rows' diagonals (none over the prompt); depth n up to the
    last loss row."""
    dep, pos = needed_rows(torch.tensor([5, 6, 8]), n=3, a=2, s0=0)
    got = {(int(d), int(p)) for d, p in zip(dep, pos)}
    assert got == {(0, 5), (0, 6), (0, 8), (1, 4), (1, 5), (1, 7)} | {(3, j) for j in range(9)}
    assert len(got) == len(dep)


def _sequences(config, m: int, g: torch.Generator) -> list[dict]:
    """Synthetic cached sequences: anchors [T, m, d], the teacher's top-8 (ids, fp16 probabilities),
    loss on the response (the first third plays the prompt)."""
    seqs = []
    for T in (19, 7, 30, 12):
        top_p = torch.rand(T, 8, generator=g).sort(-1, descending=True).values
        seqs.append({"anchors": torch.randn(T, m, config.hidden_size, generator=g).half(),
                     "top_ids": torch.randint(0, config.vocab_size, (T, 8), generator=g).int(),
                     "top_p": (top_p / top_p.sum(-1, keepdim=True)).half(),
                     "loss": (torch.arange(T) >= T // 3).to(torch.uint8)})
    return seqs


@pytest.mark.parametrize("ls,prev", [(1, False), (2, False), (1, True)])
def test_batch_loss_equals_the_dense_reference_with_its_gradients(tiny_dir, ls, prev):
    """batch_loss (packed forward, chunked head + KL) == the dense reference one sequence at a time:
    loss, rows, hits and every gradient in fp32; under bf16 autocast both stay within bf16 rounding of
    the fp32 reference."""
    config = load_config(tiny_dir("llama", num_layers=6))
    g = torch.Generator().manual_seed(ls)
    n = 3
    split = uniform_split(config.num_hidden_layers, n)
    anchors = default_anchors(split)
    d2t = torch.randperm(config.vocab_size, generator=g)[: config.vocab_size // 2].sort().values
    t2d = target_to_draft(d2t, config.vocab_size)
    pdm = random_pdm(config, anchors, ls, draft_ids=d2t, seed=ls, prev=prev)
    seqs, fills = _sequences(config, len(anchors), g), [3, 1, 2, 3]
    cols = list(range(len(anchors)))

    def run(dense: bool, amp: bool):
        pdm.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            kl, rows, hits = batch_loss(pdm, seqs, split, fills, 0, t2d, cols, dense=dense)
        kl.backward()
        return kl.item(), rows, hits, {k: p.grad.clone() for k, p in pdm.named_parameters() if p.grad is not None}

    ref = run(dense=True, amp=False)
    assert ref[1] == sum(len(loss_rows(s, t2d)) for s in seqs) > 0
    fast = run(dense=False, amp=False)
    assert fast[1:3] == ref[1:3] and fast[0] == pytest.approx(ref[0], rel=1e-5)
    assert fast[3].keys() == ref[3].keys()
    for k, grad in ref[3].items():
        torch.testing.assert_close(fast[3][k], grad, atol=1e-6, rtol=1e-4, msg=k)
    for dense in (True, False):  # bf16: the same distance from fp32 for either path
        kl, rows, _, grads = run(dense=dense, amp=True)
        assert rows == ref[1] and kl == pytest.approx(ref[0], rel=2e-2)
        for k, grad in ref[3].items():
            assert (grads[k] - grad).norm() <= 5e-2 * grad.norm() + 1e-6, (dense, k)

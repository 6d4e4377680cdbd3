"""The EAGLE-3-style baseline (spd.eagle): greedy output equals AR, an oracle draft is always fully
accepted, the TTT training forward equals the inference chain step by step, training overfits a
sequence, sampling is reproducible and has the target's distribution."""

from __future__ import annotations

import pytest
import torch
from conftest import ar_tokens, pipeline
from spd.core.sampling import SamplingParams
from spd.core.stopping import StopRule
from spd.core.target import run_through
from spd.core.ar import ar_generate
from spd.eagle.drafter import EagleDrafter
from spd.eagle.engine import EagleEngine, tau
from spd.eagle.model import EagleDraft, random_eagle
from spd.eagle.train import ttt_hidden

torch.set_num_threads(1)
PROMPT = [5, 17, 33, 2, 9, 41]
LAYERS = (1, 3, 5)  # low / mid / high of a 6-layer tiny target


def _eagle(model_dir, seed=0, scale=None, vocab_frac=1):
    config, _, stages = pipeline(model_dir, 1, LAYERS)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randperm(config.vocab_size, generator=g)[: config.vocab_size // vocab_frac]
    draft = random_eagle(config, LAYERS, draft_ids=ids, embed_weight=stages[0].embed.weight, seed=seed)
    if scale:  # larger weights than the default init: logits of order 1-10, differences show
        with torch.no_grad():
            for p in draft.parameters():
                if p.dim() == 2:
                    p.normal_(0, scale, generator=g)
    return config, stages, draft


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("k", [1, 3, 7])
def test_greedy_eagle_equals_ar_with_a_random_draft(tiny_dir, arch, k):
    model_dir = tiny_dir(arch, num_layers=6)
    expected = ar_tokens(model_dir, PROMPT, 24)
    _, stages, draft = _eagle(model_dir)
    got = EagleEngine(stages, draft, k).generate(PROMPT, SamplingParams(), StopRule(24))
    assert got.token_ids == expected
    assert got.stats.generated_tokens == 24 and got.stats.cycles == 23 - got.stats.accepts


def test_greedy_eagle_stops_at_eos_and_the_context_limit_like_ar(tiny_dir):
    model_dir = tiny_dir("llama", num_layers=6, max_positions=24)
    _, stages, draft = _eagle(model_dir)
    full = ar_tokens(model_dir, PROMPT, 40)
    eos = frozenset({full[5]})
    for stop in (StopRule(40), StopRule(40, eos)):
        expected = ar_generate(stages, PROMPT, SamplingParams(), stop)
        got = EagleEngine(stages, draft, 7).generate(PROMPT, SamplingParams(), stop)
        assert (got.token_ids, got.finish_reason) == (expected.token_ids, expected.finish_reason)


def test_an_oracle_draft_is_always_fully_accepted_and_tau_is_k_plus_1(tiny_dir, monkeypatch):
    model_dir = tiny_dir("qwen3", num_layers=6)
    k, rounds = 3, 5
    N = 1 + rounds * (k + 1)
    expected = ar_tokens(model_dir, PROMPT, N)
    _, stages, draft = _eagle(model_dir)
    engine = EagleEngine(stages, draft, k)
    real = engine._draft_chain

    def oracle(states, next_tokens, kk, params, first_position, stats):
        real(states, next_tokens, kk, params, first_position, stats)  # keep the draft's cache in step
        start = first_position - len(PROMPT)
        return expected[start:start + kk], [None] * kk

    monkeypatch.setattr(engine, "_draft_chain", oracle)
    got = engine.generate(PROMPT, SamplingParams(), StopRule(N))
    assert got.token_ids == expected
    assert got.stats.cycles == rounds and got.stats.accepts == rounds * k and got.stats.rejects == 0
    assert tau(got.stats) == k + 1


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_ttt_training_forward_equals_the_inference_chain_at_every_step(tiny_dir, arch):
    """Step j of the training forward at position i == the j-th draft of an inference chain started
    at t = i-j+1 (verified prefix 0..t from target features, then the draft's own hidden states),
    with the cache grown incrementally and rolled back between chains as the engine does."""
    model_dir = tiny_dir(arch, num_layers=6)
    _, stages, draft = _eagle(model_dir, seed=1, scale=0.15, vocab_frac=2)
    T, steps = 14, 4
    tokens = torch.randint(1, 250, (T,), generator=torch.Generator().manual_seed(3))
    found = {}
    stages[0].truncate(0)
    run_through(stages, tokens, 0, lambda j, o: found.update(o.anchors))
    states = torch.stack([found[b] for b in LAYERS], dim=1)  # [T, 3, d]
    with torch.no_grad():
        train_logits = [draft.logits(h) for h in ttt_hidden(draft, states, tokens, steps)]  # each [T-1, V_s]
    drafter = EagleDrafter(draft)
    drafter.reset()
    compared = 0
    for t in range(T - 1):
        drafter.rollback()
        h, logits = drafter.advance(states[t:t + 1], tokens[t + 1:t + 2])
        for j in range(1, steps + 1):
            i = t + j - 1
            if i > T - 2:
                break
            if j > 1:
                h, logits = drafter.speculate(h, int(tokens[i + 1]))
            torch.testing.assert_close(logits, train_logits[j - 1][i], atol=2e-4, rtol=1e-4)
            compared += 1
    assert compared == sum(max(0, T - 1 - (j - 1)) for j in range(1, steps + 1))


def _teacher_sequence(config, stages, T: int, seed: int) -> dict:
    """A cache-style sequence (tokens, loss, the target's top-32, anchors at LAYERS) of T random tokens."""
    tokens = torch.randint(1, 250, (T,), generator=torch.Generator().manual_seed(seed))
    found = {}
    stages[0].truncate(0)
    out = run_through(stages, tokens, 0, lambda j, o: found.update(o.anchors))
    top_p, top_ids = torch.softmax(out.logits, -1).topk(32, dim=-1)
    loss = (torch.arange(T) >= T // 3).to(torch.uint8)  # the prompt third carries no loss
    return {"tokens": tokens, "loss": loss, "top_ids": top_ids.int(), "top_p": top_p.half(),
            "anchors": torch.stack([found[b] for b in LAYERS], dim=1).half()}


def test_batched_ttt_loss_equals_the_sum_of_the_sequences_alone(tiny_dir):
    """Right-padding sequences of different lengths into one batch changes neither the loss, nor
    the counts, nor the gradients."""
    from spd.eagle.train import batch_ttt_loss
    from spd.train.trainer import target_to_draft

    model_dir = tiny_dir("qwen3", num_layers=6)
    config, stages, draft = _eagle(model_dir, seed=2, scale=0.15, vocab_frac=2)
    seqs = [_teacher_sequence(config, stages, T, seed) for seed, T in enumerate((23, 40, 9))]
    t2d = target_to_draft(draft.d2t, config.vocab_size)

    def run(batches):
        draft.zero_grad()
        total, rows, hits = 0.0, 0, 0
        for batch in batches:
            kl, r, h = batch_ttt_loss(draft, batch, [0, 1, 2], t2d, 4)
            kl.backward()
            total, rows, hits = total + kl.item(), rows + r, hits + h
        return total, rows, hits, [p.grad.clone() for p in draft.parameters()]

    alone, together = run([[s] for s in seqs]), run([seqs])
    assert together[1:3] == alone[1:3] and together[1] > 0
    assert together[0] == pytest.approx(alone[0], rel=1e-5)
    for a, b in zip(alone[3], together[3]):  # float32 sums in another order: error scales with |grad|
        torch.testing.assert_close(b, a, atol=1e-5 * a.abs().max().item(), rtol=1e-4)


def test_ttt_loss_with_its_fused_head_and_windows_equals_the_kl_of_the_full_unroll(tiny_dir):
    """batch_ttt_loss (the chunked head + KL of spd.train.trainer.head_kl; steps >= 2 only over the
    window from the first loss row - (steps - 2) on) gives the loss, the step-1 hits and the gradients
    of the definition: teacher_kl of draft.logits over each step's loss rows of the unroll over every
    position."""
    from spd.eagle.train import batch_ttt_loss, loss_rows
    from spd.train.trainer import target_to_draft, teacher_kl

    model_dir = tiny_dir("qwen3", num_layers=6)
    config, stages, draft = _eagle(model_dir, seed=3, scale=0.15, vocab_frac=2)
    seq = _teacher_sequence(config, stages, 37, 4)
    t2d = target_to_draft(draft.d2t, config.vocab_size)
    rows = loss_rows(seq, t2d)
    ids = t2d[seq["top_ids"].long()]  # [T, k] draft ids, -1 outside

    def grads(kl):
        draft.zero_grad()
        kl.backward()
        return [p.grad.clone() for p in draft.parameters()]

    opt = torch.optim.AdamW(draft.parameters(), lr=3e-3)
    for _ in range(15):  # trained a little: some step-1 drafts agree, so the hits are compared too
        grads(batch_ttt_loss(draft, [seq], [0, 1, 2], t2d, 3)[0])
        opt.step()
    kl, n, hits = batch_ttt_loss(draft, [seq], [0, 1, 2], t2d, 3)
    fused = grads(kl)
    ref, ref_hits = torch.zeros(()), 0
    for j, h in enumerate(ttt_hidden(draft, seq["anchors"].float(), seq["tokens"].long(), 3), start=1):
        i = rows[rows >= j - 1]
        logits = draft.logits(h[i])  # [R_j, V_s]
        ref = ref + teacher_kl(logits, ids[i + 1], seq["top_p"][i + 1])
        ref_hits += int((logits.argmax(-1) == ids[i + 1, 0]).sum()) if j == 1 else 0
    assert n == len(rows) > 0 and hits == ref_hits > 0
    assert kl.item() == pytest.approx(ref.item(), rel=1e-5)
    for a, b in zip(grads(ref), fused):
        torch.testing.assert_close(b, a, atol=1e-5 * a.abs().max().item(), rtol=1e-4)


def test_ttt_training_overfits_one_sequence(tiny_dir):
    from spd.eagle.train import batch_ttt_loss
    from spd.train.trainer import target_to_draft

    model_dir = tiny_dir("llama", num_layers=6)
    config, stages, draft = _eagle(model_dir, vocab_frac=2)
    seq = {**_teacher_sequence(config, stages, 40, 5), "loss": torch.ones(40, dtype=torch.uint8)}
    t2d = target_to_draft(draft.d2t, config.vocab_size)
    draft.train()
    opt = torch.optim.AdamW(draft.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        kl, rows, _ = batch_ttt_loss(draft, [seq], [0, 1, 2], t2d, 3)
        (kl / rows).backward()
        opt.step()
        opt.zero_grad()
        losses.append(kl.item() / rows)
    assert losses[-1] < 0.5 * losses[0], losses


def test_draft_save_and_load_round_trip(tiny_dir, tmp_path):
    model_dir = tiny_dir("qwen3", num_layers=6)
    _, stages, draft = _eagle(model_dir, vocab_frac=2)
    draft.save(tmp_path / "draft")
    loaded = EagleDraft.load(tmp_path / "draft", stages[0].embed.weight)
    assert loaded.config == draft.config and torch.equal(loaded.d2t, draft.d2t)
    assert "embed_weight" not in loaded.state_dict()
    ref = EagleEngine(stages, draft.half().float(), 3).generate(PROMPT, SamplingParams(), StopRule(16))
    got = EagleEngine(stages, loaded, 3).generate(PROMPT, SamplingParams(), StopRule(16))
    assert got.token_ids == ref.token_ids and got.stats.accepts == ref.stats.accepts


def test_the_same_seed_reproduces_the_same_sampled_output(tiny_dir):
    model_dir = tiny_dir("qwen3", num_layers=6, init_std=0.15)
    _, stages, draft = _eagle(model_dir)
    engine = EagleEngine(stages, draft, 3)
    params = SamplingParams(temperature=1.0, top_p=0.95, seed=1234)
    first = engine.generate(PROMPT, params, StopRule(20)).token_ids
    assert engine.generate(PROMPT, params, StopRule(20)).token_ids == first
    others = {tuple(engine.generate(PROMPT, SamplingParams(1.0, 0, 0.95, s), StopRule(20)).token_ids) for s in range(4)}
    assert len(others) > 1


@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0), SamplingParams(temperature=0.8, top_k=4, top_p=0.9)])
def test_sampled_eagle_matches_the_target_distribution(tiny_dir, params):
    """Chi-square against the exactly enumerated 3-token continuations (as test_engine_sampling)."""
    from scipy.stats import chisquare
    from test_engine_sampling import PROMPT as P3
    from test_engine_sampling import STEPS, V, _exact_distribution

    model_dir = tiny_dir("llama", vocab_size=V, num_layers=6, init_std=0.15)
    exact = _exact_distribution(model_dir, params)
    _, stages, draft = _eagle(model_dir, seed=3, scale=0.3)
    engine, R, counts, rejects = EagleEngine(stages, draft, 2), 1500, {}, 0
    for seed in range(R):
        g = engine.generate(P3, SamplingParams(params.temperature, params.top_k, params.top_p, seed), StopRule(STEPS))
        counts[tuple(g.token_ids)] = counts.get(tuple(g.token_ids), 0) + 1
        rejects += g.stats.rejects
    assert set(counts) <= set(exact) and rejects > R // 10
    big = [s for s, pr in exact.items() if pr * R >= 5]
    observed = [counts.get(s, 0) for s in big] + [R - sum(counts.get(s, 0) for s in big)]
    expected = [exact[s] * R for s in big] + [R * (1 - sum(exact[s] for s in big))]
    if expected[-1] < 1e-9:
        observed, expected = observed[:-1], expected[:-1]
    expected = [e * R / sum(expected) for e in expected]
    assert chisquare(observed, expected).pvalue > 1e-3


@pytest.mark.slow
def test_greedy_eagle_on_smollm2_is_token_identical_to_ar(default_model_dir):
    from spd.core.stopping import eos_ids_of
    from spd.models.loading import load_tokenizer
    from spd.text import encode_prompt

    config, _, stages = pipeline(default_model_dir, 1, (5, 15, 29))
    tok = load_tokenizer(default_model_dir)
    ids = encode_prompt(tok, "What is the capital of France?")
    stop = StopRule(24, eos_ids_of(tok, config))
    expected = ar_generate(stages, ids, SamplingParams(), stop).token_ids
    draft = random_eagle(config, (5, 15, 29), draft_ids=torch.arange(4096), embed_weight=stages[0].embed.weight,
                         lm_head_weight=stages[-1].lm_head.weight)
    got = EagleEngine(stages, draft, 3).generate(ids, SamplingParams(), stop)
    assert got.token_ids == expected


def test_eagle_training_run_learns_exports_a_loadable_draft_and_resumes(tiny_dir, tmp_path, monkeypatch):
    import json

    from spd.eagle.engine import load_eagle
    from spd.eagle.train import EagleTrainConfig, train
    from spd.train.teacher import forward_teacher

    monkeypatch.setenv("SPD_CACHE", str(tmp_path / "cache"))
    model_dir = tiny_dir("llama", num_layers=6, hidden_size=64, vocab_size=128)
    g = torch.Generator().manual_seed(0)
    seqs = [(torch.randint(3, 120, (40,), generator=g).tolist(), [False] * 10 + [True] * 30) for _ in range(4)]
    forward_teacher(model_dir, seqs, tmp_path / "teacher", batch=2, dtype=torch.float32, ns=(3, 4, 5, 6))
    cfg = EagleTrainConfig(model=str(model_dir), feature_layers=list(LAYERS), ttt=3, data=str(tmp_path / "teacher"),
                           heldout=str(tmp_path / "teacher"), vocab=96, lr=3e-3, warmup=1, batch_tokens=120,
                           epochs=25, eval_seqs=4, eval_every_s=1e9, ckpt_every_s=1e9, out=str(tmp_path / "run"),
                           progress=False)
    train(cfg)
    hist = [json.loads(line) for line in (tmp_path / "run" / "history.jsonl").read_text().splitlines()]
    assert all(last < 0.5 * first for first, last in zip(hist[0]["heldout_loss"], hist[-1]["heldout_loss"])), hist
    stages, draft = load_eagle(model_dir, tmp_path / "run" / "draft")
    assert draft.config.ttt_steps == 3 and draft.config.trained_tokens == hist[-1]["seen"] > 0
    expected = ar_generate(stages, PROMPT, SamplingParams(), StopRule(12)).token_ids
    assert EagleEngine(stages, draft, 3).generate(PROMPT, SamplingParams(), StopRule(12)).token_ids == expected
    train(EagleTrainConfig(**{**cfg.__dict__, "resume": True, "epochs": 26}))
    hist2 = [json.loads(line) for line in (tmp_path / "run" / "history.jsonl").read_text().splitlines()]
    assert hist2[-1]["seen"] == hist[-1]["seen"] * 26 // 25  # one more epoch, not redone


def test_the_engine_adds_its_feature_layers_to_stages_built_without_them(tiny_dir, tmp_path):
    model_dir = tiny_dir("llama", num_layers=6)
    _, _, draft = _eagle(model_dir)
    draft.save(tmp_path / "d")
    _, _, bare = pipeline(model_dir, 2, anchors=[0])
    expected = ar_generate(bare, PROMPT, SamplingParams(), StopRule(12)).token_ids
    engine = EagleEngine.from_dir(bare, tmp_path / "d", 3)
    assert {b for s in bare for b in s.anchors} == {0, *LAYERS}
    assert engine.generate(PROMPT, SamplingParams(), StopRule(12)).token_ids == expected

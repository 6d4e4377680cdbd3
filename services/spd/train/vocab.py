"""Reduced draft vocabulary: the V_s most frequent assistant tokens of the training data."""

from __future__ import annotations

import logging

import torch

from spd.models.loading import cache_dir
from spd.train.teacher import TeacherCache

log = logging.getLogger(__name__)


def cache_counts(cache: TeacherCache, vocab_size: int, max_shards: int | None = None) -> torch.Tensor:
    """Counts of the assistant tokens (the next token at every loss position) in a teacher cache.

    For self-generated data the teacher's argmax is the generated token (greedy)."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    if hasattr(cache, "id_sequences"):  # self-generated ids: the generated tokens (greedy: the teacher's argmax)
        for shard in cache.shards()[:max_shards]:
            for tokens, start in cache.id_sequences(shard):
                counts += torch.bincount(torch.tensor(tokens[start + 1:], dtype=torch.long), minlength=vocab_size)
        return counts
    for shard in cache.shards()[:max_shards]:
        for s in cache.sequences(shard):
            m = s["loss"].bool()
            counts += torch.bincount(s["top_ids"][m, 0].long(), minlength=vocab_size)
    return counts


def sharegpt_counts(tokenizer, vocab_size: int, model_name: str, max_convs: int = 4000) -> torch.Tensor:
    """Counts of ShareGPT assistant-turn tokens (train split), cached on disk."""
    path = cache_dir() / "teacher" / model_name / f"sharegpt_assistant_counts_{max_convs}.pt"
    if path.exists():
        return torch.load(path)
    from spd.train.data import load_sharegpt, split_conversations

    train, _ = split_conversations(load_sharegpt())
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for c in train[:max_convs]:
        for m in c.messages:
            if m["role"] == "assistant":
                ids = tokenizer.encode(m["content"], add_special_tokens=False)
                if ids:
                    counts += torch.bincount(torch.tensor(ids), minlength=vocab_size)[:vocab_size]
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(counts, path)
    return counts


def build_vocab(counts: torch.Tensor, size: int, always: tuple[int, ...] = ()) -> torch.Tensor:
    """Draft id -> target id, most frequent first; `always` (e.g. EOS) are forced in."""
    order = torch.argsort(counts, descending=True, stable=True)
    ids = [int(i) for i in always]
    seen = set(ids)
    for i in order.tolist():
        if len(ids) >= size:
            break
        if i not in seen:
            ids.append(i)
            seen.add(i)
    return torch.tensor(ids, dtype=torch.long)


def coverage(counts: torch.Tensor, draft_ids: torch.Tensor) -> float:
    """Fraction of the counted token mass inside the draft vocabulary."""
    total = counts.sum().item()
    return float(counts[draft_ids].sum().item() / total) if total else float("nan")


def choose_vocab(size: int, model_dir, config, cache, held=None) -> tuple[torch.Tensor, dict]:
    """The draft vocabulary for a training run, (d2t [V_s] draft id -> target id, coverage info): the
    target's own generated text first, ShareGPT assistant text (weighted 1/4) for the tail; EOS always in."""
    from spd.models.loading import load_tokenizer

    V = config.vocab_size
    own = cache_counts(cache, V)
    try:
        tok = load_tokenizer(model_dir)
        share = sharegpt_counts(tok, V, model_dir.name)
        eos: tuple[int, ...] = (tok.eos_token_id,) if tok.eos_token_id is not None else ()
    except Exception as e:  # tiny id-only models: no tokenizer
        log.info("vocab: no ShareGPT counts (%s)", e)
        share, eos = torch.zeros(V, dtype=torch.long), ()
    score = own.double() / max(own.sum().item(), 1) + 0.25 * share.double() / max(share.sum().item(), 1)
    d2t = build_vocab(score, min(size, V), eos)
    info = {"V_s": len(d2t), "coverage_train_selfgen": coverage(own, d2t),
            "coverage_sharegpt": coverage(share, d2t) if share.sum() else None, "selfgen_tokens_counted": int(own.sum())}
    if held is not None:
        info["coverage_heldout_selfgen"] = coverage(cache_counts(held, V), d2t)
    return d2t, info

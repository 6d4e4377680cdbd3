"""The AR reference decoder: plain autoregressive decoding through the in-process stages.

Our own KV-cache loop (not `generate()`), one token per forward, so SPD and AR run exactly the same
per-token arithmetic; every losslessness test compares SPD's output with this.
"""

from __future__ import annotations

import time
from typing import Iterator

import torch

from spd.core.results import Generation, Stats
from spd.core.sampling import SamplingParams, choose
from spd.core.stage import Stage
from spd.core.stopping import StopRule
from spd.core.target import check_prompt, max_new_tokens, prefill, run_through


def ar_stream(stages: list[Stage], prompt_ids: list[int], params: SamplingParams, stop: StopRule,
              stats: Stats | None = None) -> Iterator[int]:
    """Greedy or sampled AR decoding; yields each generated token; fills `stats`."""
    check_prompt(prompt_ids, stages)
    stats = stats if stats is not None else Stats()
    stats.stage_s = [0.0] * len(stages)
    for s in stages:
        s.truncate(0)
    limit = StopRule(max_new_tokens(len(prompt_ids), stop, stages), stop.eos_ids, stop.stop, stop.tokenizer)
    t0 = time.perf_counter()
    out = prefill(stages, torch.tensor(prompt_ids))
    stats.prefill_s = time.perf_counter() - t0
    generated: list[int] = []
    pos = len(prompt_ids)
    while True:
        token, _ = choose(out.last_logits, params, pos)
        generated.append(token)
        stats.generated_tokens = len(generated)
        yield token
        if limit.finish_reason(generated):
            break
        out = run_through(stages, torch.tensor([token]), pos)
        stats.cycles += 1
        pos += 1
    stats.decode_s = time.perf_counter() - t0 - stats.prefill_s


def ar_generate(stages: list[Stage], prompt_ids: list[int], params: SamplingParams, stop: StopRule) -> Generation:
    stats = Stats(n=1)
    tokens = list(ar_stream(stages, prompt_ids, params, stop, stats))
    return Generation(tokens, stop.finish_reason(tokens) or "length", stats)

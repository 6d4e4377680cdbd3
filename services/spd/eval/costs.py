"""Per-component costs on this machine, for the draft-cost-adjusted and projected wall-clock columns.

Measured in one process at a fixed thread count: the AR decode time per token (the reference), each
stage's one-token forward for a uniform split of width n, one draft (a PDM staircase at full fill;
an EAGLE-3 chain step). The runtime's fixed overhead per cycle (ZeroMQ hops, drafter round trip,
scheduling) comes from `spd bench runtime_overhead` (benchmarks/results/runtime_overhead.json,
measured at n = 2, 4, 8 with zero-compute stages), interpolated in n — clamped outside that range.

Projection (labelled "projected" wherever printed): a pipeline cycle costs
  pre-step:          max(stage, draft) + overhead(n)
  post-step / PPSD:  stage + draft + overhead(n)
with stage = max(slowest measured stage, AR token time / n): the n stages together are one AR
token, so no stage can be faster than their mean. SPD decodes α tokens per cycle, so tok/s = α / cycle
and the projected speedup α·AR / cycle can never exceed S0 = n·α, whatever a noisy timing says.
The AR token time is the median of several short runs interleaved with the stage timings, so one
load spike cannot set it.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from spd.core.drafter import DrafterState
from spd.core.sampling import SamplingParams
from spd.core.schedule import staircase_offset
from spd.core.split import uniform_split
from spd.core.stage import Stage
from spd.core.stopping import StopRule
from spd.core.target import load_pipeline
from spd.core.ar import ar_generate
from spd.eval.acceptance import _commit

OVERHEAD_FILE = Path("benchmarks/results/runtime_overhead.json")


def _median_ms(fn, reps: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def ar_token_ms(stages: list[Stage], prompt: list[int], tokens: int = 48) -> float:
    """Decode-phase milliseconds per token of our AR loop (greedy, prefill excluded)."""
    g = ar_generate(stages, prompt, SamplingParams(), StopRule(tokens))
    return 1e3 * g.stats.decode_s / max(g.stats.cycles, 1)


def stage_ms(model_dir: Path, config, n: int, context: list[int], reps: int = 15) -> list[float]:
    """One-token forward of each stage of a uniform n-way split, at position len(context)."""
    stages = load_pipeline(model_dir, config, uniform_split(config.num_hidden_layers, n), ())
    h = torch.tensor(context)
    inputs = []
    for s in stages:  # prefill the context; remember one single-token input per stage
        inputs.append(h[-1:] if s.is_first else h[-1:].clone())
        h = s(h, 0).hidden
    P = len(context) - 1
    out = []
    for s, x in zip(stages, inputs):
        def step(s=s, x=x):
            s.truncate(P)
            s(x, P)
        out.append(_median_ms(step, reps))
    return out


def draft_ms(drafter: DrafterState, tokens: list[int], anchors: list[dict], schedule: str, reps: int = 15) -> float:
    """One PDM draft with a full staircase (fill n) over a committed prefix of len(tokens) - n."""
    n, s0 = drafter.split.n, staircase_offset(schedule)
    drafter.reset()
    _commit(drafter, 0, tokens, anchors, n)
    base = max(len(tokens) - n, 0)

    def step():
        drafter.cache.truncate(min(drafter.cache.length, base))
        drafter.draft(SamplingParams(), drafter.staircase(base, s0))
    return _median_ms(step, reps)


def overhead_ms(n: int, path: Path = OVERHEAD_FILE) -> float | None:
    """Runtime overhead per cycle (p50), interpolated from the zero-compute measurement."""
    if not path.exists():
        return None
    rows = sorted(json.loads(path.read_text())["zero_compute"], key=lambda r: r["n"])
    return float(np.interp(n, [r["n"] for r in rows], [r["cycle_p50_us"] / 1e3 for r in rows]))


def projected_cycle_ms(slowest_stage: float, draft: float, overhead: float, schedule: str,
                       ar_ms: float, n: int) -> float:
    stage = max(slowest_stage, ar_ms / n)
    if schedule == "pre":
        return max(stage, draft) + overhead
    return stage + draft + overhead

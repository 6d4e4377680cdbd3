"""The target model as an in-process chain of stages: loading, prefill, pushing tokens through, and
the context-length rules. (The AR reference decoder built on it is spd.core.ar.)

Prompts run in chunks of at most PREFILL_CHUNK tokens (`prefill_chunks`: the one rule, used by
`prefill` here and by the stage processes), so a long prompt joining a running pipeline shares the
stages with the other requests' decode steps between its chunks, and every path computes the
same chunks, hence the same numbers.
"""

from __future__ import annotations

from pathlib import Path

import torch

from spd.core.split import PipelineSplit
from spd.core.stage import Stage, StageOutput, load_stage
from spd.core.stopping import StopRule


def load_pipeline(model_dir: Path, config, split: PipelineSplit, anchors: tuple[int, ...],
                  device="cpu", dtype=torch.float32) -> list[Stage]:
    return [load_stage(model_dir, config, split.layers_of(j), anchors, device, dtype) for j in range(1, split.n + 1)]


PREFILL_CHUNK = 256  # most prompt tokens one prefill forward runs


def prefill_chunks(length: int) -> list[tuple[int, int]]:
    """The (start, end) chunks a prompt of `length` tokens runs in, in order."""
    return [(s, min(s + PREFILL_CHUNK, length)) for s in range(0, length, PREFILL_CHUNK)]


def prefill(stages: list[Stage], ids: torch.Tensor, on_stage=None, slot: int = 0) -> StageOutput:
    """Run a prompt ids [P] (positions 0..P-1) through every stage, chunk by chunk; `on_stage(j, out,
    start)` sees each chunk's output. Returns the last chunk's output."""
    for start, end in prefill_chunks(len(ids)):
        out = run_through(stages, ids[start:end], start, on_stage and (lambda j, o: on_stage(j, o, start)), slot)
    return out


def run_through(stages: list[Stage], x: torch.Tensor, start: int, on_stage=None, slot: int = 0) -> StageOutput:
    """Push tokens x [T] at positions start.. through every stage (KV slot `slot`); `on_stage(j, out)`
    sees each output."""
    h = x
    for j, stage in enumerate(stages, start=1):
        out = stage(h, start, slot)
        if on_stage:
            on_stage(j, out)
        h = out.hidden
    return out


def context_limit(stages: list[Stage]) -> int:
    return stages[0].config.max_position_embeddings


def prompt_problem(length: int, context: int) -> str | None:
    """Why a prompt of `length` tokens cannot run in a `context`-token model (None: it can). A prompt
    that fills the context still yields one token: the last generated token needs no forward."""
    if length == 0:
        return "prompt is empty (it encodes to zero tokens)"
    if length > context:
        return f"prompt is {length} tokens; the model's context is {context}"
    return None


def check_prompt(prompt_ids: list[int], stages: list[Stage]) -> None:
    problem = prompt_problem(len(prompt_ids), context_limit(stages))
    if problem:
        raise ValueError(problem)


def max_new_tokens(prompt_len: int, stop: StopRule, stages: list[Stage]) -> int:
    """Tokens that fit: the last generated token never needs a forward, so ctx - P + 1."""
    return min(stop.max_tokens, context_limit(stages) - prompt_len + 1)

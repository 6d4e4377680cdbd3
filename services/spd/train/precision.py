"""The dtype of batched teacher and trainer work on a device: bf16 where the hardware multiplies bf16
natively, fp32 elsewhere.

Measured at 2 threads, [128, 576] x [576, 1536] (a decode step's MLP matmul at 128 rows):
  CPU with AMX (flags amx_bf16, avx512_bf16): bf16 ~4x fp32 for batched work
  CPU with AVX2 only (AMD EPYC): bf16 16 GFLOP/s, fp32 132: bf16 is emulated, 8x slower
Batch-1 serving is fp32 everywhere (bf16 is no faster at batch 1); this rule is for the teacher
(generation, prefill features) and the trainer's autocast.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")  # /proc/cpuinfo flags of native bf16 matrix instructions


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (Linux; empty where /proc/cpuinfo is not there)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    return frozenset(next((ln.split(":", 1)[1].split() for ln in text.splitlines() if ln.startswith("flags")), []))


def has_amx() -> bool:
    """Whether the CPU has AMX bf16 tiles (Intel Xeon): there bf16 SDPA beats fp32 matmuls for the
    teacher's decode attention (spd.train.batch_decode.attention_for)."""
    return "amx_bf16" in cpu_flags()


def batched_dtype(device: str | torch.device = "cpu") -> torch.dtype:
    """bf16 on a GPU that has it and on a CPU with bf16 units; fp32 elsewhere."""
    kind = torch.device(device).type
    if kind == "cpu":
        return torch.bfloat16 if cpu_flags() & set(BF16_CPU_FLAGS) else torch.float32
    if kind == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
    return torch.float32


def resolve_dtype(name: str, device: str | torch.device = "cpu") -> torch.dtype:
    """A dtype setting (the trainer's --amp, the teachers' --dtype): "auto" (the device's batched
    dtype) or a torch dtype's name."""
    return batched_dtype(device) if name == "auto" else getattr(torch, name)

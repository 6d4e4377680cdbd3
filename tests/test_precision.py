"""Batched teacher and trainer work runs in bf16 only where the hardware multiplies bf16 natively."""

from pathlib import Path

import pytest
import torch

from spd.train import precision


@pytest.mark.parametrize("flags, expected", [
    ({"avx2", "fma", "amx_bf16", "amx_tile", "avx512_bf16"}, torch.bfloat16),  # AMX
    ({"avx2", "avx512f", "avx512_bf16"}, torch.bfloat16),  # AVX512-BF16 without AMX
    ({"avx2", "fma", "avx512f", "avx512bw"}, torch.float32),  # AVX-512 without bf16 instructions
    ({"avx2", "fma"}, torch.float32),  # AVX2 only: bf16 emulated, ~8x slower than fp32
    (set(), torch.float32),  # flags unknown (no /proc/cpuinfo)
])
def test_a_cpu_uses_bf16_only_with_bf16_units(monkeypatch, flags, expected):
    monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset(flags))
    assert precision.batched_dtype("cpu") == expected
    assert precision.resolve_dtype("auto", "cpu") == expected


def test_an_explicit_autocast_setting_is_kept(monkeypatch):
    monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset({"avx2"}))
    assert precision.resolve_dtype("bfloat16", "cpu") == torch.bfloat16
    assert precision.resolve_dtype("float32", "cpu") == torch.float32


@pytest.mark.skipif(not Path("/proc/cpuinfo").exists(), reason="CPU flags are read from Linux's /proc/cpuinfo")
def test_this_machines_flags_are_read():
    flags = precision.cpu_flags()
    assert {"sse2"} <= flags or {"fp", "asimd"} <= flags  # every x86-64 CPU has sse2; every arm64 one asimd

"""The kernels' counter-based dropout lanes (lanes.h) computed with torch ops: the unfused forms
draw exactly what the kernels draw. Entry ``i`` of a call under ``key`` is kept when its lane,
16-bit lane ``i mod 4`` of splitmix64's output for counter ``i // 4`` (Steele, Lea & Flood
2014), is at least :func:`keep_threshold`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

# splitmix64's constants as signed 64-bit integers (int64 products wrap as uint64 ones).
_GOLDEN, _MIX1, _MIX2 = (c - 2**64 for c in (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB))


def _shift_right(z: Tensor, bits: int) -> Tensor:
    """Logical (unsigned) right shift of int64 ``z``: torch's ``>>`` is arithmetic."""
    return (z >> bits) & ((1 << (64 - bits)) - 1)


def _draws(counters: Tensor, key: int) -> Tensor:
    """splitmix64's output for int64 ``counters`` under ``key``, as int64."""
    if torch.compiler.is_compiling():
        # Inductor carries integer arithmetic on indices as exact sympy expressions, and splitmix's
        # products of a strided index overflow its int64 code; it does not carry an XOR, after which
        # the counters are plain values again (the same numbers).
        counters = counters ^ 0
    z = (counters + 1) * _GOLDEN + key
    z = (z ^ _shift_right(z, 30)) * _MIX1
    z = (z ^ _shift_right(z, 27)) * _MIX2
    return z ^ _shift_right(z, 31)


def lanes(shape: tuple[int, ...], device: torch.device, key: int) -> Tensor:
    """``shape`` int16 lanes of entries ``0 … n-1`` (row-major) under ``key``."""
    n = math.prod(shape)
    draws = _draws(torch.arange((n + 3) // 4, dtype=torch.int64, device=device), key)
    return draws.view(torch.int16)[:n].view(shape)  # lane k of a draw: its bits 16k..16k+15


def strided_lanes(
    shape: tuple[int, int, int], strides: tuple[int, int, int], device: torch.device, key: int
) -> Tensor:
    """``[r, rows, m]`` int16 lanes of entry ``[b, i, j]`` = lane ``base + b·matrix_stride +
    i·row_stride + j`` (``strides = (base, matrix_stride, row_stride)``): a block of a larger
    tensor's lanes, e.g. a chunk of attention queries, without computing the rest."""
    r, rows, m = shape
    base, matrix_stride, row_stride = strides
    starts = (
        base
        + torch.arange(r, dtype=torch.int64, device=device)[:, None] * matrix_stride
        + torch.arange(rows, dtype=torch.int64, device=device) * row_stride
    )  # [r, rows]
    # Each row's draws from the one holding its first lane; the row starts `skip` lanes in.
    counters = (starts // 4)[..., None] + torch.arange((m + 3) // 4 + 1, dtype=torch.int64, device=device)
    row_lanes = _draws(counters, key).view(torch.int16)  # [r, rows, 4 · draws]
    return row_lanes.gather(-1, (starts % 4)[..., None] + torch.arange(m, device=device))


def keep_threshold(keep: float) -> int:
    """A lane is kept when it is at least this: probability ``keep`` to within 2⁻¹⁷."""
    return 32768 - round(keep * 65536)

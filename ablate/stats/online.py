"""Online false discovery rate over a stream of tests: LORD++ (Ramdas, Yang, Wainwright & Jordan
2017, "Online control of the false discovery rate with decaying memory", NeurIPS; the LORD rule of
Javanmard & Montanari 2018 with its wealth returned at every discovery).

Test ``t`` (1-based) is run at level

    α_t = γ_t·W₀ + (α − W₀)·γ_{t−τ₁} + α·Σ_{j≥2} γ_{t−τ_j}

where τ_j are the times of the earlier discoveries and γ is a non-increasing sequence summing to
1. It keeps the false discovery rate of the whole stream at α, at every time, when the null
p-values are independent of each other and of the non-null ones (the paper's Theorem 1). The cost:
α_t is a small share of α — the first test runs at γ₁·W₀ — and it grows only with discoveries.

No maintained Python library implements online FDR rules, so the rule is the few lines below.
"""

from __future__ import annotations

import functools
import math

import numpy as np

# γ_j ∝ log(max(j, 2)) / (j · e^{√log j}): the sequence the LORD++ paper's experiments use (after
# Javanmard & Montanari 2018), normalised to sum 1 over its (fast-decaying) infinite tail.
_GAMMA_TERMS = 1_000_000


# A loop that states its horizon H (the most candidates it will test) may spend the sequence's
# whole mass on them: γ_j renormalised over j ≤ H and 0 beyond, still non-increasing and summing to
# 1, so the guarantee holds; past H a test gets level only from the wealth its discoveries returned.
@functools.lru_cache(maxsize=8)
def _gamma(horizon: int | None) -> np.ndarray:
    j = np.arange(1, (horizon or _GAMMA_TERMS) + 1, dtype=float)
    shape = np.log(np.maximum(j, 2.0)) / (j * np.exp(np.sqrt(np.log(j))))
    return shape / shape.sum()


def gamma(j: int, horizon: int | None = None) -> float:
    """γ_j, j ≥ 1 (0 past the horizon, or past the tabulated million tests)."""
    table = _gamma(horizon)
    return float(table[j - 1]) if 1 <= j <= len(table) else 0.0


def lord_level(
    test: int, discoveries: list[int], alpha: float, wealth: float | None = None, horizon: int | None = None
) -> float:
    """α_t of test number ``test`` (1-based, counting tests only) given the test numbers of the
    earlier ``discoveries``; ``wealth`` W₀ ≤ α defaults to α/2 (the paper's choice)."""
    w0 = alpha / 2.0 if wealth is None else wealth
    if not 0.0 < w0 <= alpha:
        raise ValueError(f"initial wealth must be in (0, alpha], got {w0}")
    level = gamma(test, horizon) * w0
    for i, tau in enumerate(sorted(d for d in discoveries if d < test)):
        level += (alpha - w0 if i == 0 else alpha) * gamma(test - tau, horizon)
    return level


# Levels are floored to a grid of 16 steps per decade (at most 13 % lower, so never above the
# rule's α_t): the sequential design's boundaries are cached per level, and a continuum of levels
# would compute them anew for every candidate.
_STEPS_PER_DECADE = 16


def floored(level: float) -> float:
    """``level`` rounded down to the grid the boundaries are cached on."""
    if not level > 0.0:
        return 0.0
    step = math.floor(math.log10(level) * _STEPS_PER_DECADE + 1e-9)
    return 10.0 ** (step / _STEPS_PER_DECADE)

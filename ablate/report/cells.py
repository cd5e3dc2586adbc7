"""Numbers as the report's table cells and running text: 4 decimals, signed deltas, 'n/a' with
the reason (too few seeds, no units) instead of a made-up number."""

from __future__ import annotations

import math

import numpy as np

from ..stats import MIN_SEEDS_TEST

NA = "n/a"


def isnan(x) -> bool:
    return x is None or (isinstance(x, float) and np.isnan(x))


def too_few_seeds(k: int) -> str:
    return f"{NA} ({k} seed{'' if k == 1 else 's'})"


def number(x: float, signed: bool = False) -> str:
    if isnan(x):
        return NA
    if np.isinf(x):
        return "+∞" if x > 0 else "−∞"
    body = f"{x:+.4f}" if signed else f"{x:.4f}"
    return body if abs(x) < 100 else (f"{x:+,.1f}" if signed else f"{x:,.1f}")


def p_value(p: float) -> str:
    return NA if isnan(p) else ("<0.001" if p < 0.001 else f"{p:.3f}")


def p_is(p: float) -> str:
    """'p = 0.012' / 'p < 0.001' for running text."""
    text = p_value(p)
    return f"p {text[0]} {text[1:]}" if text.startswith("<") else f"p = {text}"


def mean_sd(row) -> str:
    if row.n_seeds == 0:
        return too_few_seeds(0)
    if isnan(row.sd):
        return f"{number(row.mean)} (1 seed)"
    return f"{number(row.mean)} ± {number(row.sd)}"


def delta_ci(row, min_seeds: int) -> str:
    """Δ [CI]; the CI 'n/a (k seeds)' below the ``min_seeds`` its method needs."""
    if row.n_paired < min_seeds or isnan(row.ci_low):
        ci = too_few_seeds(row.n_paired)
    else:
        ci = f"{number(row.ci_low, True)}, {number(row.ci_high, True)}"
    return f"{number(row.delta, True)} [{ci}]"


def p_seeds(row) -> str:
    return too_few_seeds(row.n_paired) if row.n_paired < MIN_SEEDS_TEST else p_value(row.p_seeds_adj)


def p_units(row) -> str:
    return f"{NA} (no units)" if row.n_units == 0 else p_value(row.p_units_adj)


def cohen_d(d: float) -> str:
    if isnan(d):
        return NA
    return ("+∞" if d > 0 else "−∞") if np.isinf(d) else f"{d:+.2f}"


def mark(row, higher: bool) -> str:
    """▲ significantly better, ▼ significantly worse than the baseline, else nothing."""
    if not row.significant:
        return ""
    return "▲" if (row.delta > 0) == higher else "▼"


def rate(x: float, n: int) -> str:
    """A simulated rate with its binomial 95% margin."""
    if isnan(x):
        return NA
    return f"{x:.1%} (± {1.96 * math.sqrt(max(x * (1 - x), 1 / n) / n):.1%}, n = {n})"

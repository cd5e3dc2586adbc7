"""Numbers as the report's table cells and running text: 4 decimals, signed deltas, 'n/a' with
the reason (too few seeds, no units) instead of a made-up number."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ablate.stats import MIN_SEEDS_TEST, Verdict

NA = "n/a"


def isnan(x) -> bool:
    """None, NaN, or pandas' NA (an integer column's missing value)."""
    return x is None or x is pd.NA or (isinstance(x, float) and np.isnan(x))


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


def _equivalence_read(row) -> bool:
    """An equivalent verdict reads its TOST interval (absent in comparisons.csv of older versions)."""
    return row.verdict is Verdict.EQUIVALENT and not isnan(row.eq_low)


def interval(row) -> str:
    """Δ [decision interval]: the interval the verdict reads (an equivalent verdict: its TOST
    interval, else the paired t interval at the decision level); 'n/a (k seeds)', '—' (the verdict
    cell says why: a duplicate, or a sequential comparison waiting for its look) or 'not tested'
    where there is none."""
    if _equivalence_read(row):
        ci = f"{number(row.eq_low, True)}, {number(row.eq_high, True)}"
    elif row.verdict:
        ci = f"{number(row.ci_low, True)}, {number(row.ci_high, True)}"
    elif row.n_paired < MIN_SEEDS_TEST:
        ci = too_few_seeds(row.n_paired)
    else:
        ci = "—" if row.note else "not tested"
    return f"{effect(row)} [{ci}]"


def effect(row, signed=number) -> str:
    """Δ as the report prints it: after a sequential stop the median-unbiased Δ, the naive mean
    beside it; else the mean difference."""
    if isnan(getattr(row, "delta_adjusted", float("nan"))):
        return signed(row.delta, True)
    return f"{signed(row.delta_adjusted, True)} (naive {signed(row.delta, True)})"


def confidence(row) -> str:
    """The shown interval's own confidence ('98.3%'): 1 − its level, or 1 − 2·the equivalence level
    for a TOST interval. Each interval's alone: together they hold no simultaneous coverage."""
    if _equivalence_read(row):
        return f"{1.0 - 2.0 * row.eq_level:.1%}"
    return NA if isnan(row.level) else f"{1.0 - row.level:.1%}"


def mdd(row, base_mean: float) -> str:
    """The minimum detectable difference in the metric's units, and as a share of the baseline."""
    if isnan(row.mdd):
        return NA
    if not base_mean or isnan(base_mean):
        return number(row.mdd)
    share = row.mdd / abs(base_mean)
    return f"{number(row.mdd)} ({share:.0%})" if share >= 0.1 else f"{number(row.mdd)} ({share:.1%})"


def p_decision(row) -> str:
    """The p-value the verdict agrees with: corrected over the family (< α ⟺ the interval excludes
    0), or in a sequential study the raw p against its look's level."""
    if not row.verdict:
        return too_few_seeds(row.n_paired) if row.n_paired < MIN_SEEDS_TEST else NA
    if isnan(row.p_seeds_adj):
        return f"{p_value(row.p_seeds)} (level {row.level:.2g})"
    return p_value(row.p_seeds_adj)


def mark(row, higher: bool) -> str:
    """▲ better, ▼ worse than the baseline (the verdict), else nothing."""
    if not row.significant:
        return ""
    return "▲" if (row.delta > 0) == higher else "▼"


def verdict(row, higher: bool) -> str:
    """The verdict cell: 'better ▲', 'equivalent', 'inconclusive', 'n/a (2 seeds)', or why a
    comparison with enough seeds has no verdict (its note: a sequential comparison inconclusive at
    one look and waiting for the next one's seeds says so, not "not tested")."""
    if not row.verdict:
        if row.n_paired < MIN_SEEDS_TEST:
            return too_few_seeds(row.n_paired)
        return row.note or "not tested"
    if row.significant:
        return f"{row.verdict} {mark(row, higher)}" + (" (negligible)" if row.negligible else "")
    return str(row.verdict)


def against(x: float, n: int, bound: float) -> str:
    """Whether a simulated rate ``x`` of ``n`` draws is consistent with a true rate ≤ ``bound``: the
    one-sided exact binomial test (a rate a little above the bound in a few hundred draws is
    noise, and reads as such)."""
    if isnan(x) or n < 1:
        return NA
    from scipy.stats import binomtest

    p = binomtest(round(x * n), n, bound, alternative="greater").pvalue
    verdict = "above" if p < 0.05 else "consistent with ≤"
    return f"{verdict} {bound:.0%} (one-sided binomial test p = {p:.2g})"


def rate(x: float, n: int) -> str:
    """A simulated rate with its binomial 95% margin."""
    if isnan(x):
        return NA
    return f"{x:.1%} (± {1.96 * math.sqrt(max(x * (1 - x), 1 / n) / n):.1%}, n = {n})"

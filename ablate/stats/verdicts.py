"""Verdicts: each comparison with the baseline is *better*, *worse*, *equivalent* or *inconclusive*,
decided by one interval.

Per comparison, with ``k`` paired seeds and differences ``d_s`` (variant − base):

- its **decision level** ``a`` comes from the correction over the family (:func:`decision_levels`):
  the t-test at level ``a`` rejects exactly when the correction (Holm, Benjamini–Hochberg) does;
- its **interval** is the paired t interval ``mean(d) ± t_{1−a/2, k−1} · sd(d)/√k``;
- the interval excludes 0 → *better* or *worse* (by the metric's direction); it lies inside the
  practical margin ``(−m, +m)`` → *equivalent* (two one-sided tests at level ``a/2`` each);
  both (a real difference smaller than the margin) → *better* / *worse*, flagged ``negligible``;
  neither → *inconclusive*, with the seeds that would likely decide it;
- its **minimum detectable difference** is the |Δ| the t-test at level ``a`` detects with 80 %
  power at ``k`` seeds and the observed ``sd(d)`` (noncentral t).

A sequential study (``seeds: {initial, max, step}``) calls :func:`decide` at each look with the
level that look may spend (:mod:`.sequential`).
"""

from __future__ import annotations

import enum
import functools
import math
from dataclasses import dataclass

import numpy as np
from scipy import optimize, special

from .corrections import CORRECTIONS

POWER = 0.8  # of the minimum detectable difference and of "seeds that would decide it"
MIN_SEEDS_VERDICT = 3  # paired seeds a verdict needs (as the seed tests)
_MOST_SEEDS = 10_000  # "seeds that would decide it" beyond this: never, in practice


class Verdict(enum.StrEnum):
    BETTER = "better"
    WORSE = "worse"
    EQUIVALENT = "equivalent"
    INCONCLUSIVE = "inconclusive"


@dataclass(frozen=True)
class Decision:
    """One comparison's verdict and the numbers behind it (all in the metric's units)."""

    verdict: Verdict
    n: int  # paired seeds
    delta: float  # mean difference, variant − base
    level: float  # the decision level a (family correction applied)
    ci_low: float  # the (1 − a) paired t interval the verdict reads
    ci_high: float
    p: float  # the paired t-test's two-sided p-value (uncorrected)
    margin: float
    mdd: float  # minimum detectable |Δ| at 80 % power, this n and level
    negligible: bool = False  # a real difference, inside the margin
    seeds_to_decide: int | None = None  # inconclusive: seeds at which 80 % of studies would decide


def decision_levels(p: np.ndarray, alpha: float, correction: str) -> np.ndarray:
    """Per comparison, the level ``a`` at which its own test decides as the corrected family does.

    Holm (step-down at α/m, α/(m−1), …): the i-th smallest p-value's level is α/(m−i+1) up to
    the first p-value that fails its level; that one and every later one get the failed level,
    which each of them exceeds. Benjamini–Hochberg (step-up): with R rejections every comparison
    gets R·α/m (the false-coverage-rate level of Benjamini & Yekutieli 2005), α/m when R = 0.
    NaN p-values (too few seeds) get NaN."""
    return CORRECTIONS[correction].levels(np.asarray(p, dtype=float), alpha)


# scipy.special's distribution functions directly: the same numbers as scipy.stats' t, nct and
# norm without their argument checks, which took most of the report's calibration time.
_t_quantile = special.stdtrit  # (df, p)


def _t_interval(d: np.ndarray, level: float) -> tuple[float, float, float]:
    """(low, high, p) of the paired t-test on ``d`` at ``level``."""
    n, mean, sd = len(d), float(np.mean(d)), float(np.std(d, ddof=1))
    if sd == 0.0:  # every seed moved by the same amount: the interval is that amount
        return mean, mean, (1.0 if mean == 0.0 else 0.0)
    half = _t_quantile(n - 1, 1.0 - level / 2.0) * sd / math.sqrt(n)
    p = 2.0 * special.stdtr(n - 1, -abs(mean) / (sd / math.sqrt(n)))
    return float(mean - half), float(mean + half), float(p)


def _power_difference(n: int, delta: float, sd: float, level: float) -> float:
    """P(the two-sided paired t-test at ``level`` rejects) when the true difference is ``delta``:
    noncentral t with n − 1 degrees of freedom and noncentrality Δ √n / sd. (statsmodels'
    ``TTestPower`` returns NaN here for 3 seeds at α/3 with d ≈ 5, and solves to a wrong d.)"""
    crit = _t_quantile(n - 1, 1.0 - level / 2.0)
    nc = abs(delta) / sd * math.sqrt(n)
    with np.errstate(all="ignore"):
        # the far tail is negligible where the noncentral t's cdf gives up (NaN)
        upper = 1.0 - special.nctdtr(n - 1, nc, crit)
        return float(upper + np.nan_to_num(special.nctdtr(n - 1, nc, -crit)))


@functools.lru_cache(maxsize=4096)
def _detectable_effect(n: int, level: float, power: float) -> float:
    """Δ / sd(d) at which the paired t-test has ``power`` (cached: the report's calibration asks for
    the same few (seeds, level) pairs thousands of times)."""
    high = 1.0
    while _power_difference(n, high, 1.0, level) < power:  # power rises with Δ / sd
        high *= 2.0
    short = lambda e: _power_difference(n, e, 1.0, level) - power  # noqa: E731
    return float(optimize.brentq(short, 0.0, high, xtol=1e-10))


def minimum_detectable(n: int, sd: float, level: float, power: float = POWER) -> float:
    """|Δ| that a two-sided paired t-test at ``level`` detects with ``power`` at ``n`` seeds."""
    if n < 2 or not math.isfinite(sd) or not math.isfinite(level):
        return float("nan")
    if sd == 0.0:
        return 0.0
    return _detectable_effect(n, float(level), power) * sd


# sd(d) of a sample of k seeds is sd · √(χ²_{k−1} / (k − 1)): the chance to decide averages over
# this many equally likely quantiles of it (midpoints), enough for 3 decimals.
_SD_QUANTILES = (np.arange(256) + 0.5) / 256


@functools.lru_cache(maxsize=4096)
def _half_widths(n: int, level: float) -> np.ndarray:
    """The interval's half-width per unit sd(d) at each quantile of the sample sd."""
    s = np.sqrt(special.chdtri(n - 1, 1.0 - _SD_QUANTILES) / (n - 1))
    return _t_quantile(n - 1, 1.0 - level / 2.0) * s / math.sqrt(n)


def _power_decide(n: int, delta: float, sd: float, level: float, margin: float) -> float:
    """P(the (1 − level) t interval of ``n`` normal differences, true mean ``delta`` and sd ``sd``,
    excludes 0 or lies inside ±margin). Given the sample sd s the interval is m ± h with
    h = t · s / √n and m ~ N(delta, sd² / n) independent of s; it decides unless
    max(0, margin − h) ≤ |m| ≤ h."""
    se = sd / math.sqrt(n)
    half = sd * _half_widths(n, float(level))
    low = np.maximum(0.0, margin - half)

    def mass(a, b):  # P(a ≤ m ≤ b)
        return special.ndtr((b - delta) / se) - special.ndtr((a - delta) / se)

    undecided = np.where(low < half, mass(low, half) + mass(-half, -low), 0.0)
    return float(1.0 - undecided.mean())


def seeds_to_decide(n: int, delta: float, sd: float, level: float, margin: float) -> int | None:
    """The fewest seeds (≥ n) at which, if the observed Δ and sd(d) were the truth, 80 % of studies
    would decide: their interval excludes 0 or fits inside ±margin. None: beyond 10,000."""
    if sd == 0.0 or not math.isfinite(sd):
        return None

    def decides(k: int) -> bool:
        return _power_decide(k, delta, sd, level, margin) >= POWER

    low, high = max(n, 2), max(n, 2)
    while not decides(high):  # bracket, then bisect: the chance grows with the seeds
        if high >= _MOST_SEEDS:
            return None
        low, high = high, min(high * 2, _MOST_SEEDS)
    while low < high:
        mid = (low + high) // 2
        low, high = (mid + 1, high) if not decides(mid) else (low, mid)
    return high


def decide(d: np.ndarray, level: float, margin: float, higher_is_better: bool = True) -> Decision:
    """The verdict on paired differences ``d`` (variant − base) at decision level ``level``."""
    d = np.asarray(d, dtype=float)
    d = d[np.isfinite(d)]
    n = len(d)
    if n < MIN_SEEDS_VERDICT or not math.isfinite(level):
        nan = float("nan")
        delta = float(np.mean(d)) if n else nan
        return Decision(Verdict.INCONCLUSIVE, n, delta, level, nan, nan, nan, margin, nan)
    delta, sd = float(np.mean(d)), float(np.std(d, ddof=1))
    return decide_estimate(delta, sd / math.sqrt(n), n - 1, level, margin, higher_is_better, seeds=n)


def decide_estimate(
    delta: float,
    se: float,
    df: int,
    level: float,
    margin: float,
    higher_is_better: bool = True,
    seeds: int | None = None,
) -> Decision:
    """The verdict on an estimate ``delta`` with standard error ``se`` on ``df`` degrees of freedom
    (a linear model's contrast, say), read as :func:`decide` reads the paired t interval, which is
    the case se = sd(d)/√k, df = k − 1. The minimum detectable difference is the t-test's on ``df``;
    "seeds that would decide" treats the estimate as a paired comparison over ``seeds``
    replications (default df + 1) with sd(d) = se·√seeds."""
    n = df + 1 if seeds is None else seeds
    if se == 0.0:  # every replication moved by the same amount: the interval is that amount
        low = high = delta
        p = 1.0 if delta == 0.0 else 0.0
    else:
        half = _t_quantile(df, 1.0 - level / 2.0) * se
        low, high = delta - half, delta + half
        p = 2.0 * special.stdtr(df, -abs(delta) / se)
    low, high, p = float(low), float(high), float(p)
    mdd = minimum_detectable(df + 1, se * math.sqrt(df + 1), level)
    differs = bool(low > 0.0 or high < 0.0)
    inside = bool(-margin < low and high < margin)
    if differs:
        better = (delta > 0.0) == higher_is_better
        verdict = Verdict.BETTER if better else Verdict.WORSE
        return Decision(verdict, n, delta, level, low, high, p, margin, mdd, negligible=inside)
    if inside:
        return Decision(Verdict.EQUIVALENT, n, delta, level, low, high, p, margin, mdd)
    needed = seeds_to_decide(n, delta, se * math.sqrt(n), level, margin)
    return Decision(Verdict.INCONCLUSIVE, n, delta, level, low, high, p, margin, mdd, seeds_to_decide=needed)


def decide_family(
    diffs: dict[str, np.ndarray],
    alpha: float,
    correction: str,
    margins: dict[str, float],
    higher_is_better: bool = True,
) -> dict[str, Decision]:
    """Verdicts for a family of comparisons (name → paired differences), corrected together.
    Comparisons with fewer than 3 paired seeds are not tested and do not count in the family."""
    names = list(diffs)
    p = np.full(len(names), np.nan)
    for i, name in enumerate(names):
        d = np.asarray(diffs[name], dtype=float)
        d = d[np.isfinite(d)]
        if len(d) >= MIN_SEEDS_VERDICT:
            p[i] = _t_interval(d, alpha)[2]
    levels = decision_levels(p, alpha, correction)
    return {
        name: decide(diffs[name], levels[i], margins[name], higher_is_better) for i, name in enumerate(names)
    }

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
  power at ``k`` seeds and the observed ``sd(d)`` (statsmodels' noncentral-t power).

A sequential study (``seeds: {initial, max, step}``) calls :func:`decide` at each look with the
level that look may spend (:mod:`.sequential`).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import numpy as np
from scipy import stats
from statsmodels.stats.power import TTestPower

from .corrections import CORRECTIONS

POWER = 0.8  # of the minimum detectable difference and of "seeds that would decide it"
MIN_SEEDS_VERDICT = 3  # paired seeds a verdict needs (as the seed tests)
_MOST_SEEDS = 10_000  # "seeds that would decide it" beyond this: never, in practice


class Verdict(str, enum.Enum):
    BETTER = "better"
    WORSE = "worse"
    EQUIVALENT = "equivalent"
    INCONCLUSIVE = "inconclusive"

    def __str__(self) -> str:
        return self.value


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


def _t_interval(d: np.ndarray, level: float) -> tuple[float, float, float]:
    """(low, high, p) of the paired t-test on ``d`` at ``level``."""
    n, mean, sd = len(d), float(np.mean(d)), float(np.std(d, ddof=1))
    if sd == 0.0:  # every seed moved by the same amount: the interval is that amount
        return mean, mean, (1.0 if mean == 0.0 else 0.0)
    half = stats.t.ppf(1.0 - level / 2.0, n - 1) * sd / math.sqrt(n)
    p = 2.0 * stats.t.sf(abs(mean) / (sd / math.sqrt(n)), n - 1)
    return float(mean - half), float(mean + half), float(p)


def minimum_detectable(n: int, sd: float, level: float, power: float = POWER) -> float:
    """|Δ| that a two-sided paired t-test at ``level`` detects with ``power`` at ``n`` seeds."""
    if n < 2 or not math.isfinite(sd):
        return float("nan")
    if sd == 0.0:
        return 0.0
    effect = TTestPower().solve_power(nobs=n, alpha=level, power=power, alternative="two-sided")
    return float(effect * sd)


def _power_difference(n: int, delta: float, sd: float, level: float) -> float:
    return float(
        TTestPower().power(effect_size=abs(delta) / sd, nobs=n, alpha=level, alternative="two-sided")
    )


def _power_equivalence(n: int, delta: float, sd: float, level: float, margin: float) -> float:
    """P(the (1 − level) interval lies inside ±margin) when the true difference is ``delta``,
    with sd(d) taken as known (the interval's width still uses t_{n−1})."""
    se = sd / math.sqrt(n)
    half = stats.t.ppf(1.0 - level / 2.0, n - 1) * se
    upper = stats.norm.cdf((margin - half - delta) / se)
    lower = stats.norm.cdf((-margin + half - delta) / se)
    return float(max(upper - lower, 0.0))


def seeds_to_decide(n: int, delta: float, sd: float, level: float, margin: float) -> int | None:
    """The fewest seeds (≥ n) at which, if the observed Δ and sd(d) were the truth, 80 % of studies
    would decide: exclude 0 (Δ ≠ 0) or fit inside ±margin (|Δ| < margin). None: beyond 10,000."""
    if sd == 0.0 or not math.isfinite(sd):
        return None

    def decides(k: int) -> bool:
        hits = _power_difference(k, delta, sd, level) if delta != 0.0 else 0.0
        if abs(delta) < margin:
            hits = max(hits, _power_equivalence(k, delta, sd, level, margin))
        return hits >= POWER

    low, high = max(n, 2), max(n, 2)
    while not decides(high):  # bracket, then bisect: both powers grow with the seeds
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
    low, high, p = _t_interval(d, level)
    delta, sd = float(np.mean(d)), float(np.std(d, ddof=1))
    mdd = minimum_detectable(n, sd, level)
    differs = bool(low > 0.0 or high < 0.0)
    inside = bool(-margin < low and high < margin)
    if differs:
        better = (delta > 0.0) == higher_is_better
        verdict = Verdict.BETTER if better else Verdict.WORSE
        return Decision(verdict, n, delta, level, low, high, p, margin, mdd, negligible=inside)
    if inside:
        return Decision(Verdict.EQUIVALENT, n, delta, level, low, high, p, margin, mdd)
    needed = seeds_to_decide(n, delta, sd, level, margin)
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

"""Verdicts: each comparison with the baseline is *better*, *worse*, *equivalent* or *inconclusive*,
decided by two tests with their own error guarantees.

Per comparison, with ``k`` paired seeds and differences ``d_s`` (variant − base):

- **better / worse**: its decision level ``a`` comes from the correction over the family
  (:func:`decision_levels`): the t-test at level ``a`` rejects exactly when the correction (Holm,
  Benjamini–Hochberg) does; its interval is the paired t interval
  ``mean(d) ± t_{1−a/2, k−1} · sd(d)/√k``, and excluding 0 means better or worse (by the metric's
  direction). The family's false better / worse rate is at most α.
- **equivalent**: two one-sided t-tests (TOST) against ``±margin``, each at the equivalence level
  ``e``: the ``1 − 2e`` interval ``mean(d) ± t_{1−e, k−1} · sd(d)/√k`` lies inside
  ``(−margin, +margin)``. The two tests need no split of ``e`` between them (an intersection–union
  test, Berger 1982). ``e`` comes from the same correction over the family's TOST p-values (the
  larger of the two one-sided p's), so the family's false equivalence rate is at most α on its own,
  apart from the better / worse family; or ``e = α`` per comparison where the study says
  ``report: {equivalence: per-comparison}`` (:data:`EQUIVALENCE`).
- both (a real difference smaller than the margin) → *better* / *worse*, flagged ``negligible``;
  neither → *inconclusive*;
- its **minimum detectable difference** is the |Δ| the t-test at level ``a`` detects with 80 %
  power at ``k`` seeds and the observed ``sd(d)`` (noncentral t). How many seeds a study needs is a
  question asked before it runs (:mod:`.power`, ``ablate plan``), not read from the observed Δ:
  that post-hoc figure is off by more than 2× at 3–5 seeds in a large share of cases.

A sequential study (``seeds: {initial, max, step}``) calls :func:`decide_family` at each look with
the nominal levels of its group-sequential boundaries (:mod:`.sequential`).
"""

from __future__ import annotations

import enum
import functools
import math
from dataclasses import dataclass

import numpy as np
from scipy import optimize, special

from ablate.stats.corrections import CORRECTIONS, EQUIVALENCE, Nominal
from ablate.stats.crossed import Estimate

POWER = 0.8  # of the minimum detectable difference and of the seeds a plan asks for (:mod:`.power`)
MIN_SEEDS_VERDICT = 3  # paired seeds a verdict needs (as the seed tests)


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
    # the equivalence test (TOST): its level e (per side), its 1 − 2e interval, its p (the larger
    # of the two one-sided p's, uncorrected)
    eq_level: float = float("nan")
    eq_low: float = float("nan")
    eq_high: float = float("nan")
    p_equivalence: float = float("nan")
    # a sequential stop: the median-unbiased Δ by the sample-mean ordering (:mod:`.boundaries`); NaN
    # with fixed seeds, where ``delta`` is unbiased
    delta_adjusted: float = float("nan")
    # its 1 − share interval by the same ordering: the effect's interval after stopping
    adjusted_low: float = float("nan")
    adjusted_high: float = float("nan")


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


def difference_power(n: int, delta: float, sd, level: float):
    """P(the two-sided paired t-test at ``level`` rejects) when the true difference is ``delta``:
    noncentral t with n − 1 degrees of freedom and noncentrality Δ √n / sd (``sd`` an array:
    one power per sd, as an array). (statsmodels' ``TTestPower`` returns NaN here for 3 seeds at
    α/3 with d ≈ 5, and solves to a wrong d.)"""
    crit = _t_quantile(n - 1, 1.0 - level / 2.0)
    nc = abs(delta) / np.asarray(sd, dtype=float) * math.sqrt(n)
    with np.errstate(all="ignore"):
        # the far tail is negligible where the noncentral t's cdf gives up (NaN); so is the near
        # one, far from the centre: a sequential first look's level of 1e-15 puts crit at 3e7
        below = special.nctdtr(n - 1, nc, crit)
        upper = 1.0 - np.where(np.isnan(below), np.where(nc > crit, 0.0, 1.0), below)
        power = upper + np.nan_to_num(special.nctdtr(n - 1, nc, -crit))
    return float(power) if np.ndim(power) == 0 else power


@functools.lru_cache(maxsize=4096)
def _detectable_effect(n: int, level: float, power: float) -> float:
    """Δ / sd(d) at which the paired t-test has ``power`` (cached: the report's calibration asks for
    the same few (seeds, level) pairs thousands of times)."""
    high = 1.0
    while difference_power(n, high, 1.0, level) < power:  # power rises with Δ / sd
        high *= 2.0
    short = lambda e: difference_power(n, e, 1.0, level) - power  # noqa: E731
    return float(optimize.brentq(short, 0.0, high, xtol=1e-10))


def minimum_detectable(n: int, sd: float, level: float, power: float = POWER) -> float:
    """|Δ| that a two-sided paired t-test at ``level`` detects with ``power`` at ``n`` seeds."""
    if n < 2 or not math.isfinite(sd) or not math.isfinite(level):
        return float("nan")
    if sd == 0.0:
        return 0.0
    return _detectable_effect(n, float(level), power) * sd


def tost_p(delta: float, se: float, df: int, margin: float) -> float:
    """The TOST p-value of an estimate ``delta`` (standard error ``se``, ``df`` degrees of freedom)
    against ±margin: the larger of the one-sided t-tests' p of H0 Δ ≤ −margin and H0 Δ ≥ +margin.
    It is < e exactly when the 1 − 2e interval lies inside (−margin, +margin)."""
    if not (math.isfinite(delta) and math.isfinite(se) and math.isfinite(margin)):
        return float("nan")
    if se == 0.0:
        return 0.0 if abs(delta) < margin else 1.0
    above_low = special.stdtr(df, -(delta + margin) / se)  # P(T ≥ (Δ + m) / se) under Δ = −m
    below_high = special.stdtr(df, -(margin - delta) / se)  # P(T ≥ (m − Δ) / se) under Δ = +m
    return float(max(above_low, below_high))


def _estimate(d: np.ndarray | Estimate) -> tuple[float, float, float] | None:
    """(mean, se, df) of the finite paired differences ``d`` (or of an :class:`.crossed.Estimate`
    as it is); None with fewer than 3."""
    if isinstance(d, Estimate):
        return d.delta, d.se, d.df
    d = np.asarray(d, dtype=float)
    d = d[np.isfinite(d)]
    if len(d) < MIN_SEEDS_VERDICT:
        return None
    return float(np.mean(d)), float(np.std(d, ddof=1)) / math.sqrt(len(d)), len(d) - 1


def decide(
    d: np.ndarray,
    level: float,
    margin: float,
    higher_is_better: bool = True,
    eq_level: float | None = None,
    detectable: bool = True,
) -> Decision:
    """The verdict on paired differences ``d`` (variant − base) at decision level ``level`` and
    equivalence level ``eq_level`` (default ``level``: TOST at the same level). ``detectable=False``
    leaves the minimum detectable difference NaN (at a stream's tiny levels it costs seconds)."""
    d = np.asarray(d, dtype=float)
    d = d[np.isfinite(d)]
    n = len(d)
    if n < MIN_SEEDS_VERDICT or not math.isfinite(level):
        nan = float("nan")
        delta = float(np.mean(d)) if n else nan
        return Decision(Verdict.INCONCLUSIVE, n, delta, level, nan, nan, nan, margin, nan)
    delta, sd = float(np.mean(d)), float(np.std(d, ddof=1))
    return decide_estimate(
        delta,
        sd / math.sqrt(n),
        n - 1,
        level,
        margin,
        higher_is_better,
        seeds=n,
        eq_level=eq_level,
        detectable=detectable,
    )


def decide_estimate(
    delta: float,
    se: float,
    df: int,
    level: float,
    margin: float,
    higher_is_better: bool = True,
    seeds: int | None = None,
    eq_level: float | None = None,
    floor: tuple[float, float] | None = None,
    detectable: bool = True,
) -> Decision:
    """The verdict on an estimate ``delta`` with standard error ``se`` on ``df`` degrees of freedom
    (a linear model's contrast, say), read as :func:`decide` reads the paired t intervals, which is
    the case se = sd(d)/√k, df = k − 1. The minimum detectable difference is the t-test's on ``df``;
    ``seeds`` is the replications the estimate is over (default df + 1). ``floor``: the (se, df) of
    a second test read with it (the seeds-only one beside a crossed estimate): each interval the
    wider of the two at its level, each p the larger (:mod:`.crossed`)."""
    n = df + 1 if seeds is None else seeds
    eq_level = level if eq_level is None or not math.isfinite(eq_level) else eq_level
    tests = [(se, df), *([floor] if floor is not None else [])]
    if se == 0.0:  # every replication moved by the same amount: the intervals are that amount
        low = high = eq_low = eq_high = delta
        p = 1.0 if delta == 0.0 else 0.0
    else:
        half = max(_t_quantile(f, 1.0 - level / 2.0) * e for e, f in tests)
        low, high = delta - half, delta + half
        eq_half = max(_t_quantile(f, 1.0 - eq_level) * e for e, f in tests)
        eq_low, eq_high = delta - eq_half, delta + eq_half
        p = max(2.0 * special.stdtr(f, -abs(delta) / e) for e, f in tests)
    low, high, p = float(low), float(high), float(p)
    tost = {
        "eq_level": float(eq_level),
        "eq_low": float(eq_low),
        "eq_high": float(eq_high),
        "p_equivalence": max(tost_p(delta, e, f, margin) for e, f in tests),
    }
    mdd = minimum_detectable(df + 1, se * math.sqrt(df + 1), level) if detectable else float("nan")
    differs = bool(low > 0.0 or high < 0.0)
    inside = bool(-margin < eq_low and eq_high < margin)
    if differs:
        better = (delta > 0.0) == higher_is_better
        verdict = Verdict.BETTER if better else Verdict.WORSE
        return Decision(verdict, n, delta, level, low, high, p, margin, mdd, negligible=inside, **tost)
    if inside:
        return Decision(Verdict.EQUIVALENT, n, delta, level, low, high, p, margin, mdd, **tost)
    return Decision(Verdict.INCONCLUSIVE, n, delta, level, low, high, p, margin, mdd, **tost)


def equivalence_levels(
    p_tost: np.ndarray,
    alpha: float,
    correction: str,
    equivalence: str,
    size: int | None = None,
    nominal: Nominal | None = None,
) -> np.ndarray:
    """Per comparison, its share of α for the equivalence test: the correction's shares over the
    family's TOST p-values (``equivalence = 'family'``), or α for each (``'per-comparison'``). NaN
    p: NaN. ``size``, ``nominal``: as :meth:`.corrections.Correction.shares` (a sequential look)."""
    p_tost = np.asarray(p_tost, dtype=float)
    if EQUIVALENCE.check(equivalence) == "per-comparison":
        return np.where(np.isfinite(p_tost), alpha, np.nan)
    return CORRECTIONS[correction].shares(p_tost, alpha, size, nominal or (lambda a: a))


def family_pvalues(
    diffs: dict[str, np.ndarray | Estimate], margins: dict[str, float]
) -> tuple[np.ndarray, np.ndarray]:
    """Per comparison (name → paired differences, or an estimate with its se), its t-test's
    two-sided p and its TOST p against its margin; NaN with fewer than 3 paired seeds (not tested,
    not in the family)."""
    names = list(diffs)
    p, p_tost = np.full(len(names), np.nan), np.full(len(names), np.nan)
    for i, name in enumerate(names):
        found = _estimate(diffs[name])
        if found is not None:
            delta, se, df = found
            floor = diffs[name].floor() if isinstance(diffs[name], Estimate) else None
            tests = [(se, df), *([floor] if floor is not None else [])]  # both read: the larger p
            if se == 0.0:  # every seed moved by the same amount
                p[i] = 1.0 if delta == 0.0 else 0.0
            else:
                p[i] = max(float(2.0 * special.stdtr(f, -abs(delta) / e)) for e, f in tests)
            p_tost[i] = max(tost_p(delta, e, f, margins[name]) for e, f in tests)
    return p, p_tost


def decide_family(
    diffs: dict[str, np.ndarray | Estimate],
    alpha: float,
    correction: str,
    margins: dict[str, float],
    higher_is_better: bool = True,
    equivalence: str = "family",
) -> dict[str, Decision]:
    """Verdicts for a family of comparisons (name → paired differences, or an
    :class:`.crossed.Estimate`: seeds crossed with test units), corrected together: the better /
    worse tests over their t-test p-values, the equivalence tests over their TOST p-values
    (:func:`equivalence_levels`). Comparisons with fewer than 3 paired seeds are not tested and do
    not count in the family."""
    names = list(diffs)
    p, p_tost = family_pvalues(diffs, margins)
    levels = decision_levels(p, alpha, correction)
    eq_levels = equivalence_levels(p_tost, alpha, correction, equivalence)
    out = {}
    for i, name in enumerate(names):
        d = diffs[name]
        if isinstance(d, Estimate):
            out[name] = decide_estimate(
                d.delta,
                d.se,
                d.df,
                levels[i],
                margins[name],
                higher_is_better,
                d.seeds,
                eq_levels[i],
                d.floor(),
            )
        else:
            out[name] = decide(d, levels[i], margins[name], higher_is_better, eq_levels[i])
    return out

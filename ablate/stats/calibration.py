"""The report's error rates for a study of a given shape, measured by simulation through
``compare`` itself: false-positive rate, family-wise rate, power and CI coverage."""

from __future__ import annotations

import math
import warnings
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from scipy import optimize, stats

from .comparison import MIN_SEEDS_TEST, compare

if TYPE_CHECKING:
    from .settings import ReportSettings


def min_detectable_d(n_seeds: int, alpha: float, power: float = 0.8) -> float:
    """Smallest paired Cohen's d a two-sided paired t-test at level ``alpha`` over ``n_seeds``
    seeds detects with probability ``power`` (noncentral t, df = k − 1, noncentrality d √k).
    NaN with fewer than 3 seeds."""
    k = n_seeds
    if k < MIN_SEEDS_TEST:
        return float("nan")
    crit = stats.t.ppf(1 - alpha / 2, k - 1)

    def gap(d):
        nc = d * math.sqrt(k)
        # the lower tail is negligible where scipy's nct.cdf gives up (NaN)
        return stats.nct.sf(crit, k - 1, nc) + np.nan_to_num(stats.nct.cdf(-crit, k - 1, nc)) - power

    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        high = 1.0
        while gap(high) < 0:  # power rises with d; the bracket stays where nct is finite
            high *= 2
        return float(optimize.brentq(gap, 1e-6, high, xtol=1e-6))


def _synthetic(rng: np.random.Generator, metric: str, n_seeds: int, effects: list[float]) -> pd.DataFrame:
    """A study frame: baseline + one variant per effect; value = seed effect (shared by all
    variants) + variant effect + N(0, 1) noise, so paired differences are N(effect, 2)."""
    seed_effect = rng.normal(0, 1, n_seeds)
    rows = [
        {"variant": v, "seed": s, f"test.{metric}": seed_effect[s] + eff + rng.normal()}
        for v, eff in [("base", 0.0)] + [(f"v{i}", e) for i, e in enumerate(effects)]
        for s in range(n_seeds)
    ]
    return pd.DataFrame(rows)


def calibrate(
    settings: ReportSettings,
    n_seeds: int,
    n_variants: int,
    comparisons: int | None = None,
    planted_studies: int | None = None,
    bootstrap: int = 500,
    power: float = 0.8,
) -> dict | None:
    """Measure the report's error rates for a study of this shape by simulation through ``compare``.

    Null: ⌈comparisons / n_variants⌉ synthetic studies of ``n_seeds`` seeds × (baseline +
    ``n_variants`` variants), all identical in distribution (normal paired differences; the tests
    and intervals are location-scale invariant, so the scale does not matter). Measured:
    ``fpr_raw`` (share of comparisons with raw seed-test p < α, expect α), ``fpr_adj`` (share
    flagged significant after the correction), ``fwer`` (share of studies with any significant
    variant; Holm and, under the full null, BH keep it ≤ α) and ``ci_coverage`` (share of CIs that
    contain the true Δ = 0).
    Planted: ``planted_studies`` studies (default: half as many as null comparisons) in which one
    variant is better by ``planted_d`` (paired Cohen's d), the smallest effect the t-test at
    α / n_variants (Holm's first step) detects with probability ``power``, the others null;
    ``power_measured`` is the share in which it is flagged significant and better, expected
    ≈ ``power`` (a little more, as Holm's later steps are laxer).
    Settings are the report's, with ``bootstrap`` resamples. None when there is no comparison.
    """
    comparisons = settings.calibration if comparisons is None else comparisons
    planted_studies = math.ceil(comparisons / 2) if planted_studies is None else planted_studies
    m, k = n_variants, n_seeds
    if m < 1 or comparisons < 1:
        return None
    s = settings.model_copy(
        update={
            "bootstrap": bootstrap,
            "baseline": "base",
            "metrics": [settings.primary],
            "higher_is_better": {settings.primary: True},
            "calibration": 0,
        }
    )
    rng = np.random.default_rng(settings.seed)
    studies = math.ceil(comparisons / m)
    null = [
        compare(_synthetic(rng, s.primary, k, [0.0] * m), None, s, s.primary).iloc[1:] for _ in range(studies)
    ]
    flat = pd.concat(null, ignore_index=True)
    has_ci = flat["ci_low"].notna()
    out = {
        "n_seeds": k,
        "n_variants": m,
        "comparisons": len(flat),
        "studies": studies,
        "bootstrap": bootstrap,
        "ci": s.ci,
        "confidence": s.confidence,
        "fpr_raw": float((flat["p_seeds"] < s.alpha).mean()) if k >= MIN_SEEDS_TEST else np.nan,
        "fpr_adj": float(flat["significant"].mean()) if k >= MIN_SEEDS_TEST else np.nan,
        "fwer": float(np.mean([t["significant"].any() for t in null])) if k >= MIN_SEEDS_TEST else np.nan,
        "ci_coverage": float(((flat["ci_low"] <= 0) & (flat["ci_high"] >= 0))[has_ci].mean())
        if has_ci.any()
        else np.nan,
        "planted_d": np.nan,
        "planted_studies": 0,
        "power": power,
        "power_measured": np.nan,
    }
    if k >= MIN_SEEDS_TEST and planted_studies > 0:
        d = min_detectable_d(k, s.alpha / m, power)
        hits = []
        for _ in range(planted_studies):
            t = compare(
                _synthetic(rng, s.primary, k, [d * math.sqrt(2)] + [0.0] * (m - 1)), None, s, s.primary
            ).iloc[1]
            hits.append(bool(t["significant"]) and t["delta"] > 0)
        out.update(planted_d=d, planted_studies=planted_studies, power_measured=float(np.mean(hits)))
    return out

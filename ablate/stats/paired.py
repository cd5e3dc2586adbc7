"""Paired data of one metric and its tests: each seed's value per variant, the variant's and the
baseline's values paired by seed (and by evaluation unit), the seed tests (t-test, Wilcoxon, Cohen's d)
and the unit tests (Wilcoxon over (seed, unit) pairs, rank-biserial, P(better on a unit))."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
from scipy import stats

from ablate.errors import AblateError
from ablate.stats.verdicts import MIN_SEEDS_VERDICT

MIN_SEEDS_TEST = MIN_SEEDS_VERDICT  # paired seeds needed for a verdict, the seed tests and d


def _quiet(fn, *args, **kwargs) -> float:
    """p-value of a scipy test, NaN where the test is undefined (e.g. all differences zero)."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        try:
            return float(fn(*args, **kwargs).pvalue)
        except ValueError:
            return float("nan")


def per_seed(results: pd.DataFrame, metric: str) -> pd.DataFrame:
    """seed × variant table of ``test.<metric>`` (several trials of one (variant, seed): their mean)."""
    col = f"test.{metric}"
    if col not in results.columns:
        known = sorted(c[5:] for c in results.columns if c.startswith("test."))
        raise AblateError(
            f"results: no column {col!r} for metric {metric!r}; "
            f"metrics with test results: {', '.join(known) or 'none'}"
        )
    frame = pd.DataFrame(
        {
            "variant": results["variant"].astype(str),
            "seed": results["seed"],
            "x": pd.to_numeric(results[col], errors="coerce"),
        }
    )
    return frame.groupby(["seed", "variant"])["x"].mean().unstack("variant")


def _per_unit(units: pd.DataFrame | None, metric: str) -> pd.DataFrame | None:
    """(seed, unit) × variant table of the per-unit ``metric``; None without unit data."""
    if units is None or units.empty or metric not in units.columns:
        return None
    frame = pd.DataFrame(
        {
            "variant": units["variant"].astype(str),
            "seed": units["seed"],
            "unit": units["unit"],
            "x": pd.to_numeric(units[metric], errors="coerce"),
        }
    )
    return frame.groupby(["seed", "unit", "variant"])["x"].mean().unstack("variant")


def paired(wide: pd.DataFrame | None, variant: str, baseline: str) -> tuple[np.ndarray, np.ndarray]:
    """(variant, base) values over the rows (seeds, or (seed, unit) pairs) where both are finite."""
    if wide is None or variant not in wide.columns or baseline not in wide.columns:
        return np.empty(0), np.empty(0)
    v, b = wide[variant].to_numpy(float), wide[baseline].to_numpy(float)
    ok = np.isfinite(v) & np.isfinite(b)
    return v[ok], b[ok]


def seed_tests(d: np.ndarray) -> dict[str, float]:
    """Paired tests across seeds on the differences ``d``: t-test (primary), Wilcoxon, Cohen's d.

    Seeds are the replication unit: each seed is an independent training run, so the question
    "would this difference show up again if we trained again" is answered by the spread of the
    per-seed differences. The t-test is primary because with k ≤ 5 seeds the exact Wilcoxon test
    cannot reach 0.05: its smallest two-sided p is 2/2^k = 1/2^(k-1) (1/16 at k = 5). Wilcoxon is
    reported alongside as the distribution-free check. Fewer than 3 paired seeds: all NaN.
    (``ttest_1samp(d, 0)`` is ``ttest_rel(variant, base)``; identical differences give d = ±∞.)
    """
    d = np.asarray(d, dtype=float)
    nan = float("nan")
    if len(d) < MIN_SEEDS_TEST:
        return {"p_seeds": nan, "p_seeds_wilcoxon": nan, "d_seeds": nan}
    with np.errstate(all="ignore"):
        cohen = (
            float(d.mean() / d.std(ddof=1))
            if d.std(ddof=1) > 0
            else (0.0 if d.mean() == 0 else float(np.sign(d.mean()) * np.inf))
        )
    return {
        "p_seeds": _quiet(stats.ttest_1samp, d, 0.0),
        "p_seeds_wilcoxon": _quiet(stats.wilcoxon, d),
        "d_seeds": cohen,
    }


def unit_tests(e: np.ndarray, higher: bool = True) -> dict[str, float]:
    """Wilcoxon signed-rank on the unit differences ``e``, rank-biserial and P(variant better).

    Zero differences are dropped by the Wilcoxon test and its rank-biserial (``zero_method='wilcox'``)
    but count half in ``p_better_units``.
    """
    e = np.asarray(e, dtype=float)
    nan = float("nan")
    if len(e) == 0:
        return {"n_units": 0, "p_units": nan, "p_better_units": nan, "rank_biserial": nan}
    better = e if higher else -e
    nz = e[e != 0]
    if len(nz):
        ranks = stats.rankdata(np.abs(nz))
        r_plus, r_minus = ranks[nz > 0].sum(), ranks[nz < 0].sum()
        rb = float((r_plus - r_minus) / (r_plus + r_minus))
    else:
        rb = 0.0
    return {
        "n_units": len(e),
        "p_units": _quiet(stats.wilcoxon, e) if len(nz) else nan,
        "p_better_units": float(np.mean((better > 0) + 0.5 * (better == 0))),
        "rank_biserial": rb,
    }

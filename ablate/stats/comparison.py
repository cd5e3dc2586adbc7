"""Each variant against the baseline on one metric: paired seed tests, unit tests, CIs, and the
multiple-comparison correction over the variants (see the package docstring for the formulas)."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from scipy import stats

from ..errors import AblateError
from .corrections import adjust_pvalues
from .intervals import bootstrap_ci

if TYPE_CHECKING:
    from .settings import ReportSettings

MIN_SEEDS_TEST = 3  # paired seeds needed for the seed tests and d

COLUMNS = [
    "metric",
    "variant",
    "differs",
    "n_seeds",
    "mean",
    "sd",
    "n_paired",
    "delta",
    "rel_change",
    "ci_low",
    "ci_high",
    "p_seeds",
    "p_seeds_wilcoxon",
    "p_seeds_adj",
    "d_seeds",
    "n_units",
    "p_units",
    "p_units_adj",
    "p_better_units",
    "rank_biserial",
    "significant",
]


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


def variants_in_order(results: pd.DataFrame, baseline: str) -> list[str]:
    """The variants with results, baseline first, the rest as they first appear."""
    names = list(dict.fromkeys(results["variant"].astype(str)))
    if baseline not in names:
        raise AblateError(
            f"report.baseline: baseline variant {baseline!r} has no results; "
            f"variants with results: {', '.join(names) or 'none'}"
        )
    return [baseline] + [v for v in names if v != baseline]


def _differs(results: pd.DataFrame, variant: str) -> str:
    if "differs" not in results.columns:
        return ""
    vals = results.loc[results["variant"].astype(str) == variant, "differs"].dropna()
    return str(vals.iloc[0]) if len(vals) else ""


def compare(
    results: pd.DataFrame, units: pd.DataFrame | None, settings: ReportSettings, metric: str
) -> pd.DataFrame:
    """One row per variant (baseline first) comparing it with the baseline on ``metric``.

    Columns: see ``COLUMNS``. The baseline's comparison columns are NaN (``significant`` False).
    Too few paired seeds give NaN, never a made-up number: < 3 for the seed tests and d,
    < ``min_seeds_ci(settings.ci)`` for the CI. ``significant`` is ``p_seeds_adj < alpha``.
    """
    names = variants_in_order(results, settings.baseline)
    x, per_unit = per_seed(results, metric), _per_unit(units, metric)
    higher = settings.higher(metric)
    rows = []
    for v in names:
        col = x[v].to_numpy(float) if v in x.columns else np.empty(0)
        col = col[np.isfinite(col)]
        row = {
            "metric": metric,
            "variant": v,
            "differs": _differs(results, v),
            "n_seeds": len(col),
            "mean": float(col.mean()) if len(col) else np.nan,
            "sd": float(col.std(ddof=1)) if len(col) > 1 else np.nan,
            "n_paired": 0,
            "n_units": 0,
        }
        if v != settings.baseline:
            row.update(_against_base(x, per_unit, settings, v, higher))
        rows.append(row)
    rest = rows[1:]  # the baseline is first
    for test in ("seeds", "units"):
        adj = adjust_pvalues([r.get(f"p_{test}", np.nan) for r in rest], settings.correction)
        for r, a in zip(rest, adj, strict=True):
            r[f"p_{test}_adj"] = a
    for r in rows:
        r["significant"] = bool(r.get("p_seeds_adj", np.nan) < settings.alpha)
    out = pd.DataFrame(rows, columns=COLUMNS)
    for c in ("n_seeds", "n_paired", "n_units"):
        out[c] = out[c].astype(int)
    out["significant"] = out["significant"].astype(bool)
    return out


def _against_base(
    x: pd.DataFrame, per_unit: pd.DataFrame | None, settings: ReportSettings, variant: str, higher: bool
) -> dict:
    v, base = paired(x, variant, settings.baseline)
    d = v - base
    delta = float(d.mean()) if len(d) else np.nan
    base_mean = float(base.mean()) if len(base) else np.nan
    with np.errstate(all="ignore"):
        rel = delta / base_mean if base_mean else np.nan
    low, high = bootstrap_ci(d, settings.bootstrap, settings.seed, settings.confidence, settings.ci)
    uv, ub = paired(per_unit, variant, settings.baseline)
    return {
        "n_paired": len(d),
        "delta": delta,
        "rel_change": rel,
        "ci_low": low,
        "ci_high": high,
        **seed_tests(d),
        **unit_tests(uv - ub, higher),
    }

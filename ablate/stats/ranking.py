"""All variants at once on one metric: the Friedman test with Nemenyi's critical difference, and
every pair of variants against each other."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from scipy import stats

from .comparison import MIN_SEEDS_TEST, paired, per_seed, seed_tests, variants_in_order
from .corrections import adjust_pvalues

if TYPE_CHECKING:
    from .settings import ReportSettings

PAIRWISE_COLUMNS = ["metric", "a", "b", "n_paired", "delta", "p", "p_adj", "significant"]


def friedman(
    results: pd.DataFrame, metric: str, higher_is_better: bool = True, alpha: float = 0.05
) -> dict | None:
    """Friedman test over seeds (blocks) × variants on ``test.<metric>``.

    Uses the seeds where every variant has a value. Needs ≥ 3 variants and ≥ 3 such seeds (with 2
    seeds the χ² approximation is poor, and with 3 variants p cannot fall below 0.135), else
    None. Returns ``statistic`` (χ²), ``p``, ``n_seeds``, ``n_variants``, ``ranks`` (variant → mean
    rank, 1 = best) and ``cd``: the Nemenyi critical difference of mean ranks at ``alpha``,
    q_α(k, ∞) / √2 · √(k (k + 1) / (6 n)).
    """
    x = per_seed(results, metric).dropna(how="all", axis=1).dropna(how="any", axis=0)
    n, k = x.shape
    if k < 3 or n < MIN_SEEDS_TEST:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = stats.friedmanchisquare(*(x[c].to_numpy(float) for c in x.columns))
    ranks = (-x if higher_is_better else x).rank(axis=1).mean(axis=0)
    q = stats.studentized_range.ppf(1 - alpha, k, np.inf)
    return {
        "statistic": float(res.statistic),
        "p": float(res.pvalue),
        "n_seeds": n,
        "n_variants": k,
        "ranks": {str(c): float(r) for c, r in ranks.sort_values().items()},
        "cd": float(q / np.sqrt(2) * np.sqrt(k * (k + 1) / (6 * n))),
    }


def pairwise(results: pd.DataFrame, settings: ReportSettings, metric: str | None = None) -> pd.DataFrame:
    """Every variant against every other on ``metric`` (default: the primary): paired t-test
    across the seeds both have, ``settings.correction`` over the family of all pairs with a p-value.

    One row per unordered pair (a, b), a before b in the report's order (baseline first);
    ``delta`` = mean over paired seeds of b − a. Fewer than 3 paired seeds: ``p`` and ``p_adj``
    NaN (n/a). ``significant`` is ``p_adj < alpha``. This is a separate family from ``compare``'s
    vs-baseline family (it has m (m + 1) / 2 members, not m), so its adjusted p-values are larger.
    """
    metric = metric or settings.primary
    names = variants_in_order(results, settings.baseline)
    x = per_seed(results, metric)
    rows = []
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            vb, va = paired(x, b, a)
            d = vb - va
            rows.append(
                {
                    "metric": metric,
                    "a": a,
                    "b": b,
                    "n_paired": len(d),
                    "delta": float(d.mean()) if len(d) else np.nan,
                    "p": seed_tests(d)["p_seeds"],
                }
            )
    out = pd.DataFrame(rows, columns=PAIRWISE_COLUMNS[:-2])
    out["p_adj"] = adjust_pvalues(out["p"].to_numpy(float), settings.correction) if len(out) else []
    out["significant"] = (out["p_adj"] < settings.alpha).astype(bool)
    return out.reindex(columns=PAIRWISE_COLUMNS)


def pairwise_matrix(pairs: pd.DataFrame, names: list[str], column: str = "p_adj") -> pd.DataFrame:
    """Symmetric variant × variant matrix of one ``pairwise`` column (diagonal NaN)."""
    m = pd.DataFrame(np.nan, index=names, columns=names)
    for r in pairs.itertuples(index=False):
        m.loc[r.a, r.b] = m.loc[r.b, r.a] = getattr(r, column)
    return m

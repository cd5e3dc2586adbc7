"""All variants at once on one metric: the Friedman test (exact p-value for small designs,
Iman–Davenport's F otherwise) with Nemenyi's critical difference, and every pair of variants
against each other.

The blocks are the seeds of one data set (Demšar 2006 ranks over data sets): a rank test here asks
whether the variants' order holds from one training seed to the next.

Exact p-value. Under the null hypothesis every ordering of the variants within a seed is equally
likely, independently across seeds. The statistic is a fixed increasing function of
S = Σ_j R_j² (R_j the rank sum of variant j; the tie correction is the same for every ordering
of a seed's ranks), so p = P(S ≥ S_observed). Its distribution is built seed by seed over the
vectors of rank sums; the vectors are kept sorted, since relabelling the variants changes
neither S nor the uniform choice of the next seed's ordering. Written here because no library at
hand gives it: scipy's ``friedmanchisquare`` is the χ² approximation (its ``permutation_test``
enumerates all (k!)^n orderings, which the tests use on tiny designs), statsmodels has no
Friedman test, and scikit-posthocs / autorank (not installed) add post-hoc tests to scipy's. Beyond
:data:`EXACT_BUDGET` the p-value is Iman & Davenport's (1980) F approximation,
F = (n − 1) χ² / (n (k − 1) − χ²) on (k − 1, (k − 1)(n − 1)) degrees of freedom, closer to the
exact p-value than the χ² approximation for the 4 or more variants where it is used (3 variants
stay exact at any seed count a study has; tests/test_ranking.py measures both).
"""

from __future__ import annotations

import functools
import itertools
import math
import warnings
from collections import Counter
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from scipy import stats

from ablate.stats.comparison import variants_in_order
from ablate.stats.corrections import adjust_pvalues
from ablate.stats.paired import MIN_SEEDS_TEST, paired, per_seed, seed_tests

if TYPE_CHECKING:
    from ablate.stats.settings import ReportSettings

PAIRWISE_COLUMNS = ["metric", "a", "b", "n_paired", "delta", "p", "p_adj", "significant"]

# Rank-sum vectors × orderings one seed may add to the exact distribution; beyond it, Iman–Davenport.
# Exact for 3 variants at any seed count a study has, 4 up to 26 seeds, 5 up to 7, 6 up to 3; < 0.5 s.
EXACT_BUDGET = 300_000

# The critical-difference diagram needs this many seeds: Nemenyi's critical difference rests on
# the large-sample distribution of mean ranks, which take only a few values over fewer seeds.
MIN_SEEDS_CD = 5


def _null_sums(patterns: tuple[tuple[int, ...], ...]) -> tuple[np.ndarray, np.ndarray] | None:
    """Each seed's doubled ranks (sorted) → (S values ascending, P(S ≥ value)) under uniform
    orderings within seeds, S = Σ_j (doubled rank sum_j)²; None beyond :data:`EXACT_BUDGET`."""
    k = len(patterns[0])
    states, probs = np.zeros((1, k), dtype=np.int64), np.ones(1)
    weights = (sum(max(p) for p in patterns) + 1) ** np.arange(k, dtype=np.int64)  # sorted vector → key
    for pattern in patterns:
        # Counted before they are built: 11 variants have 11! ≈ 4·10⁷ orderings (gigabytes).
        distinct = math.factorial(k) // math.prod(math.factorial(c) for c in Counter(pattern).values())
        if len(states) * distinct > EXACT_BUDGET:
            return None
        orderings = np.unique(np.array(list(itertools.permutations(pattern)), dtype=np.int64), axis=0)
        grown = np.sort((states[:, None, :] + orderings[None, :, :]).reshape(-1, k), axis=1)
        _, first, which = np.unique(grown @ weights, return_index=True, return_inverse=True)
        probs = np.bincount(which, weights=np.repeat(probs / len(orderings), len(orderings)))
        states = grown[first]
    s = (states**2).sum(axis=1)
    order = np.argsort(s, kind="stable")
    values, starts = np.unique(s[order], return_index=True)
    mass = np.add.reduceat(probs[order], starts)
    return values, np.minimum(np.cumsum(mass[::-1])[::-1], 1.0)


_cached_null_sums = functools.lru_cache(maxsize=64)(_null_sums)


def exact_friedman_p(ranks: np.ndarray) -> float | None:
    """Exact p-value of the Friedman test on a seeds × variants matrix of within-seed ranks
    (mid-ranks for ties): P(S ≥ S_observed) over every seed's equally likely orderings of its
    ranks. None when the design is beyond :data:`EXACT_BUDGET`."""
    doubled = np.rint(2.0 * np.asarray(ranks, dtype=float)).astype(np.int64)
    patterns = tuple(sorted(tuple(sorted(row)) for row in doubled.tolist()))
    null = _cached_null_sums(patterns)
    if null is None:
        return None
    values, tail = null
    observed = int((doubled.sum(axis=0) ** 2).sum())
    return float(tail[np.searchsorted(values, observed)])


def friedman_null(k: int, n: int) -> tuple[np.ndarray, np.ndarray] | None:
    """The exact null distribution of χ²_F for ``k`` variants and ``n`` seeds without ties:
    (every attainable χ²_F ascending, P(χ²_F ≥ it)); None beyond :data:`EXACT_BUDGET`."""
    null = _cached_null_sums((tuple(range(2, 2 * k + 1, 2)),) * n)
    if null is None:
        return None
    values, tail = null
    return 12.0 / (n * k * (k + 1)) * values / 4.0 - 3.0 * n * (k + 1), tail


def iman_davenport(chi2: float, n: int, k: int) -> tuple[float, float]:
    """(F, p) of Iman & Davenport's F form of the Friedman statistic on (k − 1, (k − 1)(n − 1))
    degrees of freedom; F = ∞ (p = 0) when every seed orders the variants alike."""
    room = n * (k - 1) - chi2
    f = float("inf") if room <= 1e-12 else (n - 1) * chi2 / room
    return f, float(stats.f.sf(f, k - 1, (k - 1) * (n - 1)))


def _cd_note(n: int, k: int, cd: float) -> str | None:
    """Why the critical-difference diagram is not drawn, or None when the seeds support it."""
    if n < MIN_SEEDS_CD:
        return (
            f"No critical-difference diagram: Nemenyi's critical difference rests on the large-sample "
            f"distribution of mean ranks, which over {n} seeds (< {MIN_SEEDS_CD}) take too few values; "
            "the pairwise t-tests below compare the variants instead."
        )
    if cd >= k - 1:
        return (
            f"No critical-difference diagram: with {n} seeds the critical difference ({cd:.2f}) is not "
            f"below the largest possible gap between mean ranks ({k - 1}), so it could separate no pair."
        )
    return None


def friedman(
    results: pd.DataFrame, metric: str, higher_is_better: bool = True, alpha: float = 0.05
) -> dict | None:
    """Friedman test over seeds (blocks) × variants on ``test.<metric>``.

    Uses the seeds where every variant has a value. Needs ≥ 3 variants and ≥ 3 such seeds (with 3
    variants and 2 seeds p cannot fall below 1/6), else None. Returns ``statistic`` (χ²_F, tie
    corrected), ``p`` and ``method``: ``"exact"`` (:func:`exact_friedman_p`) or
    ``"iman-davenport"`` (then ``f`` and ``df`` are its F and degrees of freedom); ``ties``
    (whether any seed has tied values); ``n_seeds``, ``n_variants``, ``ranks`` (variant → mean
    rank, 1 = best, best first); ``cd``, the Nemenyi critical difference of mean ranks at
    ``alpha``, q_α(k, ∞) / √2 · √(k (k + 1) / (6 n)); ``separated``, the pairs (better-ranked
    first) whose mean ranks differ by more than ``cd``; ``cd_note``, None when the seeds support
    a critical-difference diagram (≥ :data:`MIN_SEEDS_CD` seeds and ``cd`` < k − 1, the largest
    possible gap), else the sentence saying why not.
    """
    x = per_seed(results, metric).dropna(how="all", axis=1).dropna(how="any", axis=0)
    n, k = x.shape
    if k < 3 or n < MIN_SEEDS_TEST:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        chi2 = float(stats.friedmanchisquare(*(x[c].to_numpy(float) for c in x.columns)).statistic)
    oriented = -x if higher_is_better else x
    within = oriented.rank(axis=1)
    ties = bool((within.nunique(axis=1) < k).any())
    p = exact_friedman_p(within.to_numpy())
    f, df = float("nan"), None
    if p is None:
        f, p = iman_davenport(chi2, n, k)
        df = (k - 1, (k - 1) * (n - 1))
    ranks = within.mean(axis=0).sort_values(kind="stable")
    q = stats.studentized_range.ppf(1 - alpha, k, np.inf)
    cd = float(q / np.sqrt(2) * np.sqrt(k * (k + 1) / (6 * n)))
    names = [str(c) for c in ranks.index]
    separated = [(a, b) for i, a in enumerate(names) for b in names[i + 1 :] if ranks[b] - ranks[a] > cd]
    return {
        "statistic": chi2,
        "p": float(p),
        "method": "exact" if df is None else "iman-davenport",
        "f": f,
        "df": df,
        "ties": ties,
        "n_seeds": n,
        "n_variants": k,
        "ranks": {str(c): float(r) for c, r in ranks.items()},
        "cd": cd,
        "separated": separated,
        "cd_note": _cd_note(n, k, cd),
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

"""Multiple-comparison corrections of p-values, by name (``report.correction`` in a study file).

Each works on the m finite p-values sorted ascending, p_(1) ≤ … ≤ p_(m), j = 1 … m.
(Same numbers as statsmodels' ``multipletests``, which runs ``gc.collect()`` on every call:
0.05 s with a large heap, too slow for the report's calibration simulation.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ablate.errors import AblateError
from ablate.schema import Vocabulary

# A level's share of α → the nominal level a test at one look may use (identity with fixed seeds;
# a group-sequential look's boundary, :mod:`.boundaries`)
Nominal = Callable[[np.ndarray], np.ndarray]


def _holm(ps: np.ndarray) -> np.ndarray:
    """p̃_(i) = max_{j ≤ i} min(1, (m − j + 1) p_(j))"""
    m, j = len(ps), np.arange(1, len(ps) + 1)
    return np.maximum.accumulate(np.minimum(1.0, (m - j + 1) * ps))


def _benjamini_hochberg(ps: np.ndarray) -> np.ndarray:
    """p̃_(i) = min_{j ≥ i} min(1, m p_(j) / j)"""
    m, j = len(ps), np.arange(1, len(ps) + 1)
    return np.minimum.accumulate(np.minimum(1.0, m * ps / j)[::-1])[::-1]


def _identity(a: np.ndarray) -> np.ndarray:
    return a


def _holm_levels(ps: np.ndarray, alpha: float, size: int, nominal: Nominal) -> np.ndarray:
    """Ascending p_(i) → its share α/(size−i+1) up to the first that fails its nominal level;
    from there on, that share."""
    m = len(ps)
    shares = alpha / (size - np.arange(m))
    failed = np.nonzero(ps > nominal(shares))[0]
    if len(failed):
        shares[failed[0] :] = shares[failed[0]]
    return shares


def _benjamini_hochberg_levels(ps: np.ndarray, alpha: float, size: int, nominal: Nominal) -> np.ndarray:
    """R rejections → every comparison at the share R·α/size (α/size when R = 0)."""
    m = len(ps)
    passed = np.nonzero(ps <= nominal(alpha * np.arange(1, m + 1) / size))[0]
    rejected = passed[-1] + 1 if len(passed) else 1
    return np.full(m, alpha * rejected / size)


@dataclass(frozen=True)
class Correction:
    """``adjust``: ascending p-values → their adjusted values, same order; ``decision_levels``:
    ascending p-values, α, the family's size and the nominal map → each comparison's share of α
    at which its own test decides as the corrected family does
    (:func:`ablate.stats.verdicts.decision_levels`); ``label``: its name in the report's text."""

    adjust: Callable[[np.ndarray], np.ndarray]
    decision_levels: Callable[[np.ndarray, float, int, Nominal], np.ndarray]
    label: str

    def shares(
        self, p: np.ndarray, alpha: float, size: int | None = None, nominal: Nominal = _identity
    ) -> np.ndarray:
        """Each comparison's share of α, for p-values in any order (NaN entries, not tested: NaN).
        ``size``: the family's size (default: the finite p-values; larger where members were
        decided before, as at a sequential look); ``nominal``: a share → the level its p-value
        is compared with (a sequential look's boundary; with fixed seeds, the share itself)."""
        out = np.full(len(p), np.nan)
        ok = np.isfinite(p)
        if ok.any():
            order = np.argsort(p[ok], kind="stable")
            back = np.empty(int(ok.sum()))
            family = int(ok.sum()) if size is None else max(size, int(ok.sum()))
            back[order] = self.decision_levels(p[ok][order], alpha, family, nominal)
            out[ok] = back
        return out

    def levels(self, p: np.ndarray, alpha: float) -> np.ndarray:
        """The decision level of each comparison of a fixed-seed family: its share of α."""
        return self.shares(p, alpha)


CORRECTIONS: Vocabulary[Correction] = Vocabulary(
    "correction",
    {
        "holm": Correction(_holm, _holm_levels, "Holm"),
        "fdr_bh": Correction(_benjamini_hochberg, _benjamini_hochberg_levels, "Benjamini–Hochberg (FDR)"),
    },
)

# How a comparison's equivalence level is set (``report.equivalence``): the study's correction
# over the family's TOST p-values (the family's false equivalence rate ≤ α), or α for each
# comparison on its own (each comparison's false equivalence rate ≤ α).
EQUIVALENCE: Vocabulary[str] = Vocabulary(
    "equivalence level",
    {
        "family": "the family's TOST p-values, corrected together",
        "per-comparison": "each comparison's TOST at α",
    },
)


def adjust_pvalues(p, method: str = "holm") -> np.ndarray:
    """Holm / Benjamini-Hochberg over the finite entries of ``p``; NaN entries stay NaN."""
    if method not in CORRECTIONS:
        raise AblateError(f"unknown correction {method!r}; use one of {', '.join(CORRECTIONS)}")
    p = np.asarray(p, dtype=float)
    out = np.full_like(p, np.nan)
    ok = np.isfinite(p)
    m = int(ok.sum())
    if m == 0:
        return out
    order = np.argsort(p[ok], kind="stable")
    back = np.empty(m)
    back[order] = CORRECTIONS[method].adjust(p[ok][order])
    out[ok] = back
    return out

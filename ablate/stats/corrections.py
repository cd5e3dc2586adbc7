"""Multiple-comparison corrections of p-values, by name (``report.correction`` in a study file).

Each works on the m finite p-values sorted ascending, p_(1) ≤ … ≤ p_(m), j = 1 … m.
(Same numbers as statsmodels' ``multipletests``, which runs ``gc.collect()`` on every call:
0.05 s with a large heap, too slow for the report's calibration simulation.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..errors import AblateError
from ..schema import Vocabulary


def _holm(ps: np.ndarray) -> np.ndarray:
    """p̃_(i) = max_{j ≤ i} min(1, (m − j + 1) p_(j))"""
    m, j = len(ps), np.arange(1, len(ps) + 1)
    return np.maximum.accumulate(np.minimum(1.0, (m - j + 1) * ps))


def _benjamini_hochberg(ps: np.ndarray) -> np.ndarray:
    """p̃_(i) = min_{j ≥ i} min(1, m p_(j) / j)"""
    m, j = len(ps), np.arange(1, len(ps) + 1)
    return np.minimum.accumulate(np.minimum(1.0, m * ps / j)[::-1])[::-1]


@dataclass(frozen=True)
class Correction:
    """``adjust``: ascending p-values → their adjusted values, same order; ``label``: its name
    in the report's text."""

    adjust: Callable[[np.ndarray], np.ndarray]
    label: str


CORRECTIONS: Vocabulary[Correction] = Vocabulary(
    "correction",
    {
        "holm": Correction(_holm, "Holm"),
        "fdr_bh": Correction(_benjamini_hochberg, "Benjamini–Hochberg (FDR)"),
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

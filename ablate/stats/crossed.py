"""Two sources of variance: seeds crossed with the evaluation units.

Every trial is evaluated on the same test units (users, windows, rows), so a comparison's paired
differences form a seeds × units table ``e[s, u]`` (variant − base, unit u, seed s). The spread of
the seeds' means answers "would the difference show again if we trained again" on *these* test
units; a reader who asks about new test units like these needs the units' variance as well. With
``report: {variance: seeds_and_units}`` the verdicts read the mean of ``e`` with the variance of a
crossed two-way random-effects model (seed, unit, seed × unit; Searle, Casella & McCulloch 1992,
ch. 4; the "crossed" design of Bouthillier et al. 2021 without its bootstrap):

    MS_seed = U · Σ_s (ē_s· − ē)² / (S − 1),  MS_unit = S · Σ_u (ē_·u − ē)² / (U − 1),
    MS_rest = Σ (e − ē_s· − ē_·u + ē)² / ((S − 1)(U − 1)),
    Var(ē) = σ²_seed / S + σ²_unit / U + σ²_rest / (S·U) = (MS_seed + MS_unit − MS_rest) / (S·U),

the unit component ``MS_unit − MS_rest`` taken at 0 where it is negative, on Satterthwaite's
degrees of freedom. Its standard error is never below the seeds-only one (``MS_seed / (S·U)``, the
paired t-test's se² when the metric is the units' mean), but its interval can be: Satterthwaite's
df are far above the seeds' S − 1 once the units' part counts, and at 3 seeds that t quantile
shrinks the interval below the seeds-only one (median width 0.8× where the units' part is 20–40 %
of the variance) and covers 92.5 % (units' part 5–20 %). So a verdict reads both tests: the interval is
the wider of the crossed interval and the seeds-only paired t interval at the same level, each p the
larger of the two (an intersection–union test, Berger 1982, as TOST is). Measured on 10⁶ draws of
the balanced table's exact mean squares (``tests/test_crossed.py``, ``benchmarks/calibration.py``):
coverage ≥ 94.9 % at 3 seeds for every units' share, down to 94.3–94.5 % at 4–5 seeds where the
units carry 5–40 % (the seeds-only floor binds less there, Satterthwaite's own shortfall remains),
94.8–95.1 % at 10. Written out:
statsmodels' ``MixedLM`` fits crossed random effects only through variance components of one
group, by REML iterations on the S·U rows (seconds per comparison at 2,999 users), where these mean
squares are exact for the balanced table every study has.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ablate.schema import Vocabulary

VARIANCE: Vocabulary[str] = Vocabulary(
    "variance source",
    {
        "seeds": "retraining: the spread of the seeds on these test units",
        "seeds_and_units": "retraining and new test units like these: seeds crossed with the units",
    },
)


@dataclass(frozen=True)
class Estimate:
    """A comparison's Δ with its standard error on ``df`` degrees of freedom (Satterthwaite's may
    be fractional), over ``seeds`` seeds and ``units`` test units."""

    delta: float
    se: float
    df: float
    seeds: int
    units: int = 0
    # the seeds-only standard error (on seeds − 1 df): the interval read is never narrower than its
    seeds_se: float = math.nan

    def floor(self) -> tuple[float, float] | None:
        """(se, df) of the seeds-only test the crossed one is read with (None: none)."""
        return (self.seeds_se, self.seeds - 1) if math.isfinite(self.seeds_se) else None


def crossed_estimate(table: np.ndarray) -> Estimate | None:
    """The mean of a complete seeds × units table of paired differences and its crossed
    random-effects standard error, with the seeds-only one it is read beside (module docstring);
    None with fewer than 3 seeds or 2 units."""
    e = np.asarray(table, dtype=float)
    if e.ndim != 2 or e.shape[0] < 3 or e.shape[1] < 2 or not np.isfinite(e).all():
        return None
    s, u = e.shape
    grand = float(e.mean())
    seed_means, unit_means = e.mean(axis=1), e.mean(axis=0)
    ms_seed = u * float(np.sum((seed_means - grand) ** 2)) / (s - 1)
    ms_unit = s * float(np.sum((unit_means - grand) ** 2)) / (u - 1)
    rest = e - seed_means[:, None] - unit_means[None, :] + grand
    ms_rest = float(np.sum(rest**2)) / ((s - 1) * (u - 1))
    seeds_se = math.sqrt(ms_seed / (s * u))
    if ms_unit <= ms_rest:  # no unit component beyond the interaction: the seeds-only interval
        return Estimate(grand, seeds_se, s - 1, s, u)
    total = ms_seed + ms_unit - ms_rest
    parts = ms_seed**2 / (s - 1) + ms_unit**2 / (u - 1) + ms_rest**2 / ((s - 1) * (u - 1))
    return Estimate(grand, math.sqrt(total / (s * u)), total**2 / parts, s, u, seeds_se)


def variance_components(table: np.ndarray) -> dict[str, float]:
    """σ² of the seeds, the units and the rest (seed × unit, with noise) in a complete seeds ×
    units table of paired differences, by the mean squares above (negative estimates at 0); NaN
    with fewer than 2 seeds or 2 units."""
    e = np.asarray(table, dtype=float)
    if e.ndim != 2 or min(e.shape) < 2:
        return dict.fromkeys(("seeds", "units", "rest"), math.nan)
    s, u = e.shape
    grand, seed_means, unit_means = float(e.mean()), e.mean(axis=1), e.mean(axis=0)
    ms_seed = u * float(np.sum((seed_means - grand) ** 2)) / (s - 1)
    ms_unit = s * float(np.sum((unit_means - grand) ** 2)) / (u - 1)
    rest = e - seed_means[:, None] - unit_means[None, :] + grand
    ms_rest = float(np.sum(rest**2)) / ((s - 1) * (u - 1))
    return {
        "seeds": max(ms_seed - ms_rest, 0.0) / u,
        "units": max(ms_unit - ms_rest, 0.0) / s,
        "rest": ms_rest,
    }


def crossed_table(per_unit: pd.DataFrame | None, variant: str, baseline: str) -> np.ndarray | None:
    """``variant`` − ``baseline`` as a seeds × units table from the (seed, unit) × variant table
    of per-unit values: the seeds with any unit, and the units every one of them has; None without
    per-unit values of both."""
    if per_unit is None or variant not in per_unit.columns or baseline not in per_unit.columns:
        return None
    e = (per_unit[variant] - per_unit[baseline]).unstack("unit")
    e = e.dropna(axis=0, how="all").dropna(axis=1, how="any")
    return e.to_numpy(float) if e.size else None

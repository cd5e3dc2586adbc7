"""The report's error rates for a study of a given shape, measured by simulation through the
verdict code itself (:func:`.comparison.family_verdicts`, what ``compare`` reads; for the primary metric
of a sequential study, the sequential rule): false *better* / *worse* and false *equivalent*
rates, power on a planted effect, and the coverage of the decision interval."""

from __future__ import annotations

import math
import warnings
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from scipy import optimize, stats

from ablate import stopping
from ablate.stats.comparison import family_verdicts
from ablate.stats.paired import MIN_SEEDS_TEST
from ablate.stats.verdicts import Decision, Verdict, minimum_detectable

if TYPE_CHECKING:
    from ablate.stats.settings import ReportSettings


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


def _study(
    rng: np.random.Generator, n_seeds: int, effects: list[float], mean: float, sd: float
) -> pd.DataFrame:
    """seed × variant table: ``base`` and ``v0`` … one per effect; value = mean + seed effect
    (shared by the variants) + variant effect + N(0, sd² / 2), so paired differences are
    N(effect, sd²)."""
    noise = sd / math.sqrt(2.0)
    shared = mean + rng.normal(0.0, noise, n_seeds)
    effects = [0.0, *effects]
    values = shared[:, None] + np.asarray(effects)[None, :] + rng.normal(0.0, noise, (n_seeds, len(effects)))
    columns = ["base"] + [f"v{i}" for i in range(len(effects) - 1)]
    return pd.DataFrame(values, index=pd.RangeIndex(n_seeds, name="seed"), columns=columns)


def _run(
    rng: np.random.Generator, s: ReportSettings, k: int, effects: list[float], mean: float, sd: float
) -> list[tuple[float, Decision]]:
    """One simulated study: (true Δ, decision) per variant with a verdict."""
    stopping.check()  # a safe point: SIGTERM / Ctrl-C while a report is written stop it here
    table = _study(rng, k, effects, mean, sd)
    names = list(table.columns[1:])
    standings = family_verdicts(table, s, s.primary, names).values()
    return [
        (effect, st.decision)
        for effect, st in zip(effects, standings, strict=True)
        if st.decision is not None and st.decision.n >= MIN_SEEDS_TEST
    ]


def _share(hits: list[bool]) -> float:
    return float(np.mean(hits)) if hits else float("nan")


def calibrate(
    settings: ReportSettings,
    n_seeds: int,
    n_variants: int,
    mean: float = 1.0,
    sd: float = 0.01,
    comparisons: int | None = None,
    planted_studies: int | None = None,
    power: float = 0.8,
) -> dict | None:
    """Measure the verdicts' error rates for a study of this shape by simulation.

    Synthetic studies of ``n_seeds`` seeds (a sequential study: its ``max``, of which the rule
    uses what it needs) × (baseline + ``n_variants`` variants), the baseline's mean ``mean`` and
    the paired differences' sd ``sd`` (pass the study's own: a relative margin and the margin's
    size against the noise depend on them), decided with these settings:

    - A/A, ⌈comparisons / n_variants⌉ studies, every variant identical in distribution to the
      baseline: ``false_verdict`` (share of comparisons called better or worse; ≤ α),
      ``familywise`` (share of studies with any; ≤ α under Holm, and BH under the full null),
      ``equivalent_null`` (share correctly called equivalent);
    - boundary, as many studies, every true Δ = ± the margin: ``false_equivalence`` (share said to
      lie inside the margin, as equivalent or as a negligible difference; ≤ α, each side of the
      interval being a one-sided test at level / 2);
    - planted, ``planted_studies`` (default: half as many as null comparisons), one variant better
      by ``planted_delta``, the minimum detectable difference at ``power`` of a fixed-n t-test at
      α / n_variants (Holm's first step), the others null: ``power_measured`` (share called
      better; ≈ ``power`` with fixed seeds, a little more as Holm's later steps are laxer);
    - ``coverage``: share of all decision intervals that contain their true Δ (≥ 1 − α: each is
      a 1 − level interval, level ≤ α).

    None when there is nothing to simulate (no variant, or ``comparisons`` = 0).
    """
    if comparisons is None:  # a sequential study's looks cost ~25× a fixed study's decision
        comparisons = settings.calibration // (5 if settings.sequential is not None else 1)
    planted_studies = math.ceil(comparisons / 2) if planted_studies is None else planted_studies
    m = n_variants
    if m < 1 or comparisons < 1:
        return None
    design = settings.sequential
    k = design.max if design is not None else n_seeds
    s = settings.model_copy(
        update={
            "baseline": "base",
            "metrics": [settings.primary],
            "higher_is_better": {settings.primary: True},
            "calibration": 0,
            "duplicates": {},
        }
    )
    margin = s.margin_for(mean)
    studies = math.ceil(comparisons / m)
    out = {
        "n_seeds": k,
        "n_variants": m,
        "sequential": design is not None,
        "mean": mean,
        "sd": sd,
        "margin": margin,
        "studies": studies,
        "comparisons": studies * m,
        "false_verdict": np.nan,
        "familywise": np.nan,
        "equivalent_null": np.nan,
        "false_equivalence": np.nan,
        "planted_delta": np.nan,
        "planted_studies": 0,
        "power": power,
        "power_measured": np.nan,
        "coverage": np.nan,
        "coverage_n": 0,
    }
    if k < MIN_SEEDS_TEST or not (math.isfinite(sd) and sd > 0):
        return out
    rng = np.random.default_rng(settings.seed)
    null = [_run(rng, s, k, [0.0] * m, mean, sd) for _ in range(studies)]
    signs = [margin if i % 2 == 0 else -margin for i in range(m)]
    boundary = [_run(rng, s, k, signs, mean, sd) for _ in range(studies)]
    planted_delta = minimum_detectable(k, sd, s.alpha / m, power)
    planted = [_run(rng, s, k, [planted_delta] + [0.0] * (m - 1), mean, sd) for _ in range(planted_studies)]
    differs = (Verdict.BETTER, Verdict.WORSE)
    flat_null = [d for study in null for _, d in study]
    every = [(e, d) for group in (null, boundary, planted) for study in group for e, d in study]
    out.update(
        false_verdict=_share([d.verdict in differs for d in flat_null]),
        familywise=_share([any(d.verdict in differs for _, d in study) for study in null]),
        equivalent_null=_share([d.verdict is Verdict.EQUIVALENT for d in flat_null]),
        # inside the margin, said either way: equivalent, or a real but negligible difference
        false_equivalence=_share(
            [d.verdict is Verdict.EQUIVALENT or d.negligible for study in boundary for _, d in study]
        ),
        planted_delta=planted_delta,
        planted_studies=planted_studies,
        power_measured=_share([bool(study) and study[0][1].verdict is Verdict.BETTER for study in planted]),
        coverage=_share([d.ci_low <= e <= d.ci_high for e, d in every]),
        coverage_n=len(every),
    )
    return out

"""Paired tests over evaluation items: two models scored on the same units (questions, samples),
each unit's score per model and seed, compared unit by unit.

Notation: ``e_u`` = score(variant, u) − score(base, u) on unit ``u`` (one seed per model), or the
seeds × units table ``e[s, u]`` (several seeds, paired by seed). Which test decides, by the data:

- **several seeds** (≥ 3 shared by the two models): the crossed seeds × units model of
  :mod:`.crossed`, read with the seeds-only test beside it; units sharing a cluster are first
  averaged into their cluster (the cluster is then the unit);
- **one seed, 0/1 scores, independent units, equal weights**: McNemar's exact test (the binomial
  test of the discordant units, statsmodels' ``mcnemar(exact=True)``) decides better / worse; the
  interval and TOST read the paired t on ``e_u`` (``d = (only variant − only base) / n``);
- **one seed otherwise**: the mean of ``e_u`` by least squares on a constant — its plain standard
  error (the paired t-test), the sandwich one with unequal unit weights (HC1), or cluster-robust
  with clusters (statsmodels' ``cov_type='cluster'``, G − 1 degrees of freedom, G clusters).

Two seeds are too few for the crossed model: their mean per unit is the unit's score. Every test
feeds :func:`.verdicts.decide_estimate` at the family's decision levels (Holm or BH over the
variants' p-values, TOST levels over their TOST p's), so the verdicts are the study's verdicts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
from scipy import special
from statsmodels.regression.linear_model import WLS
from statsmodels.stats.contingency_tables import mcnemar

from ablate.schema import Vocabulary
from ablate.stats.crossed import crossed_estimate, variance_components
from ablate.stats.verdicts import (
    MIN_SEEDS_VERDICT,
    POWER,
    Decision,
    Verdict,
    decide_estimate,
    decision_levels,
    equivalence_levels,
    tost_p,
)

ITEM_TESTS: Vocabulary[str] = Vocabulary(
    "per-item test",
    {
        "mcnemar": "McNemar's exact test: 0/1 scores, one seed, independent units",
        "paired_t": "paired t-test over the units: one seed, independent units",
        "weighted_t": "weighted mean over the units, sandwich (HC1) standard error: unequal unit weights",
        "cluster_t": "cluster-robust paired t: units share clusters, G − 1 degrees of freedom",
        "crossed": "seeds crossed with the units (with the seeds-only test): several seeds",
    },
)
MIN_UNITS = 3  # units (or clusters) a test needs
VARIANCE_PARTS = ("seeds", "units", "rest")


@dataclass(frozen=True)
class ItemTest:
    """One variant against the baseline over the units: Δ, its standard error on ``df`` degrees of
    freedom, the deciding p, which test and why; the units' agreement (0/1 scores), the variance
    split between seeds and units, the sd of a unit's difference (what a plan needs)."""

    test: str
    why: str
    delta: float
    se: float
    df: float
    p: float
    units: int
    seeds: int
    floor: tuple[float, float] | None = None
    agreement: dict[str, int] | None = None
    variance: dict[str, float] | None = None
    sd_unit: float = math.nan


def is_binary(scores: pd.Series) -> bool:
    return bool(scores.isin([0.0, 1.0]).all())


def agreement(a: np.ndarray, b: np.ndarray) -> dict[str, int]:
    """Units (or (seed, unit) pairs) with 0/1 scores of variant ``a`` and base ``b``."""
    a, b = a.astype(bool), b.astype(bool)
    return {
        "both right": int(np.sum(a & b)),
        "both wrong": int(np.sum(~a & ~b)),
        "only variant": int(np.sum(a & ~b)),
        "only base": int(np.sum(~a & b)),
    }


def _least_squares(e: np.ndarray, weights: np.ndarray | None, clusters: np.ndarray | None):
    """(mean, se, df, p) of ``e`` by least squares on a constant, its covariance by the data."""
    fit = WLS(e, np.ones((len(e), 1)), weights=1.0 if weights is None else weights)
    if clusters is not None:
        result = fit.fit(cov_type="cluster", cov_kwds={"groups": pd.factorize(clusters)[0]}, use_t=True)
        df = float(len(np.unique(clusters)) - 1)
    elif weights is not None:
        result = fit.fit(cov_type="HC1", use_t=True)
        df = float(len(e) - 1)
    else:
        result = fit.fit()
        df = float(len(e) - 1)
    delta, se = float(result.params[0]), float(result.bse[0])
    if not se > 0:  # every unit moved by the same amount: as decide_estimate reads it
        return delta, 0.0, df, 1.0 if delta == 0.0 else 0.0
    return delta, se, df, float(result.pvalues[0])


def item_test(units: pd.DataFrame, variant: str, baseline: str) -> ItemTest | None:
    """``variant`` against ``baseline`` on ``units`` (``variant``, ``seed``, ``unit``, ``score``,
    optional ``cluster`` and ``weight``; every unit of one present for the other); None with fewer
    than 3 units (or clusters)."""
    pair = units[units["variant"].isin([variant, baseline])]
    keys = ["seed", "unit"] + [c for c in ("cluster", "weight") if c in pair.columns]
    wide = pair.groupby([*keys, "variant"], sort=False)["score"].mean().unstack("variant")
    if variant not in wide or baseline not in wide:
        return None
    wide = wide.dropna(subset=[variant, baseline]).reset_index()
    if wide["unit"].nunique() < MIN_UNITS:
        return None
    binary = is_binary(wide[variant]) and is_binary(wide[baseline])
    agreed = agreement(wide[variant].to_numpy(), wide[baseline].to_numpy()) if binary else None
    wide["e"] = wide[variant] - wide[baseline]
    seeds = wide["seed"].nunique()
    clusters = "cluster" in wide.columns and wide["cluster"].nunique() < wide["unit"].nunique()
    if clusters and wide["cluster"].nunique() < MIN_UNITS:
        return None
    weighted = "weight" in wide.columns and wide["weight"].nunique() > 1
    if seeds >= MIN_SEEDS_VERDICT:
        found = _crossed(wide, seeds, clusters, agreed)
        unused = " (the crossed model weighs the units equally: their weights are not used)"
        return replace(found, why=found.why + unused) if found is not None and weighted else found
    per_unit = wide.groupby(keys[1:], sort=False)["e"].mean().reset_index()  # 2 seeds: their mean
    e = per_unit["e"].to_numpy(float)
    averaged = f", the {seeds} seeds' mean per unit (too few for the crossed model)" if seeds > 1 else ""
    sd_unit = float(np.std(e, ddof=1))
    variance = {"seeds": math.nan, "units": sd_unit**2, "rest": math.nan}
    common = {"units": len(e), "seeds": seeds, "agreement": agreed, "variance": variance, "sd_unit": sd_unit}
    if clusters or weighted:
        groups = per_unit["cluster"].to_numpy() if clusters else None
        delta, se, df, p = _least_squares(e, per_unit["weight"].to_numpy(float) if weighted else None, groups)
        name = "cluster_t" if clusters else "weighted_t"
        why = (
            f"{len(e)} units in {len(np.unique(groups))} clusters" if clusters else f"{len(e)} weighted units"
        )
        return ItemTest(name, why + averaged, delta, se, df, p, **common)
    delta, se, df, p = _least_squares(e, None, None)
    if binary and seeds == 1:
        a = agreed
        table = [[a["both right"], a["only variant"]], [a["only base"], a["both wrong"]]]
        p = float(mcnemar(table, exact=True).pvalue) if a["only variant"] + a["only base"] else 1.0
        discordant = a["only variant"] + a["only base"]
        why = f"0/1 scores of {len(e)} independent units, one seed; {discordant} discordant"
        return ItemTest("mcnemar", why, delta, se, df, p, **common)
    why = (
        f"{'0/1' if binary else 'continuous'} scores of {len(e)} independent units{averaged or ', one seed'}"
    )
    return ItemTest("paired_t", why, delta, se, df, p, **common)


def _crossed(wide: pd.DataFrame, seeds: int, clusters: bool, agreed) -> ItemTest | None:
    """The crossed seeds × units estimate (units averaged into their clusters first)."""
    unit = "cluster" if clusters else "unit"
    table = wide.groupby(["seed", unit])["e"].mean().unstack(unit).dropna(axis=1)
    estimate = crossed_estimate(table.to_numpy(float))
    if estimate is None:
        return None
    within = f" ({wide['unit'].nunique()} units averaged into {table.shape[1]} clusters)" if clusters else ""
    why = f"{seeds} seeds × {table.shape[1]} {unit}s{within}"
    tests = [(estimate.se, estimate.df), *([estimate.floor()] if estimate.floor() else [])]
    p = max(float(2.0 * special.stdtr(f, -abs(estimate.delta) / e)) if e > 0 else 1.0 for e, f in tests)
    sd_unit = float(table.mean(axis=0).std(ddof=1))
    return ItemTest(
        "crossed",
        why,
        estimate.delta,
        estimate.se,
        estimate.df,
        p,
        table.shape[1],
        seeds,
        estimate.floor(),
        agreed,
        variance_components(table.to_numpy(float)),
        sd_unit,
    )


def decide_items(
    tests: dict[str, ItemTest],
    alpha: float,
    correction: str,
    margins: dict[str, float],
    higher_is_better: bool = True,
    equivalence: str = "family",
) -> dict[str, Decision]:
    """Verdicts for a family of per-item comparisons, corrected together as
    :func:`.verdicts.decide_family` corrects the seed tests: better / worse where the test's p is
    below its decision level, equivalent where the TOST interval lies inside ±margin."""
    names = list(tests)
    p = np.array([tests[n].p for n in names], dtype=float)
    levels = decision_levels(p, alpha, correction)
    p_tost = [max(tost_p(t.delta, e, f, margins[n]) for e, f in _both(t)) for n, t in tests.items()]
    eq_levels = equivalence_levels(np.array(p_tost, dtype=float), alpha, correction, equivalence)
    out = {}
    for i, name in enumerate(names):
        t = tests[name]
        n = t.seeds if t.test == "crossed" else t.units
        decision = decide_estimate(
            t.delta, t.se, t.df, levels[i], margins[name], higher_is_better, n, eq_levels[i], t.floor
        )
        out[name] = _read_p(decision, t.p, higher_is_better)
    return out


def _both(t: ItemTest) -> list[tuple[float, float]]:
    return [(t.se, t.df), *([t.floor] if t.floor is not None else [])]


def _read_p(decision: Decision, p: float, higher: bool) -> Decision:
    """The decision with better / worse read from the test's own ``p`` (McNemar's; the same as the
    interval's for the t-based tests)."""
    differs = bool(p < decision.level)
    inside = bool(-decision.margin < decision.eq_low and decision.eq_high < decision.margin)
    if differs:
        verdict = Verdict.BETTER if (decision.delta > 0) == higher else Verdict.WORSE
    else:
        verdict = Verdict.EQUIVALENT if inside else Verdict.INCONCLUSIVE
    return replace(decision, verdict=verdict, p=p, negligible=differs and inside)


def design_for(test: ItemTest, effect: float, level: float, power: float = POWER) -> dict[str, float]:
    """A plan from this comparison as a pilot: the units for ``power`` at ``|effect|`` at the
    present seeds, and the seeds at the present units (∞: no number of them is enough; NaN: no
    spread; one seed: the seeds' part unseen, NaN). Normal approximation of the paired test: one
    seed, se² ∝ 1 / U (clusters growing with the units); seeds crossed with units, the variance
    split as measured: se²(S, U) = σ²_seed / S + (σ²_unit + σ²_rest / S) / U."""
    v = test.variance or {}
    seed_var, unit_var, rest_var = (
        0.0 if not math.isfinite(v.get(k, math.nan)) else v[k] for k in VARIANCE_PARTS
    )
    target = (abs(effect) / (special.ndtri(1 - level / 2) + special.ndtri(power))) ** 2  # the se² needed
    spread = test.se > 0 if test.test != "crossed" else seed_var + unit_var + rest_var > 0
    if not (target > 0 and spread):
        return {"units_needed": math.nan, "seeds_needed": math.nan}
    s, u = test.seeds, test.units
    if test.test != "crossed":  # se² ∝ 1 / units (clusters growing with them); seeds unseen
        return {"units_needed": math.ceil(u * test.se**2 / target), "seeds_needed": math.nan}
    left = target - seed_var / s
    units = math.ceil((unit_var + rest_var / s) / left) if left > 0 else math.inf
    seeds = math.inf
    if target > unit_var / u:  # more seeds help only past the units' part
        seeds = math.ceil((seed_var + rest_var / u) / (target - unit_var / u))
    return {"units_needed": units, "seeds_needed": seeds}

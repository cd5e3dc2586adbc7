"""Verdicts across data sets: whether a variant's effect against the baseline holds over the data
sets a study lists (``task.data: [beauty, sports, …]``).

Per data set *i* the effect is the relative paired difference on the primary test metric,
``e_i = mean_s(v_s − b_s) / mean_s(b_s)`` over the seeds *s* both trained, with variance
``var(d) / n_i / mean(b)²`` (the seeds' spread; a relative effect so that data sets whose metric
sits at different levels can be pooled). The per-data-set effects are pooled by a random-effects
meta-analysis (Paule–Mandel τ², truncated at 0: statsmodels' ``combine_effects``, method
``iterated``; its DerSimonian–Laird form can return τ² < 0), its interval by
Hartung–Knapp–Sidik–Jonkman (t with k − 1 df; the z interval is far too narrow at 4 data sets),
with the prediction interval for the effect on a new data set, ``μ ± t_{k−2} √(τ² + se²)``
(Higgins, Thompson & Spiegelhalter 2009; IntHout et al. 2016), and Cochran's Q test of
homogeneity. Beside it, Demšar's (2006) ranks: the Friedman test over data sets (blocks) ×
variants of the per-data-set means, with the Nemenyi critical difference (:mod:`.ranking`).

The across-data-set verdict, per variant:

- **varies** — the effect differs between data sets: Q rejects homogeneity at α, or the
  per-data-set verdicts include both better and worse;
- **generalises (better / worse)** — otherwise, when the prediction interval excludes 0: a new
  data set like these would see the effect with the same sign;
- **generalises (equivalent)** — when the prediction interval lies inside ± the mean relative
  margin of the per-data-set comparisons;
- **unknown** — otherwise (too few data sets or seeds, or effects too small for their spread).

Benavoli et al.'s (2017) hierarchical Bayesian test (``baycomp``) would be the Bayesian
alternative; its hierarchical model needs PyStan (a Stan compiler) at run time, so it is not used.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd
from scipy import stats

from ablate.stats.paired import per_seed
from ablate.stats.ranking import friedman

GENERALISES, VARIES, UNKNOWN = "generalises", "varies", "unknown"


@dataclass(frozen=True)
class AcrossRow:
    """One variant against the baseline over the data sets: the columns of across_datasets.csv."""

    variant: str
    datasets: int  # with a paired effect
    verdict: str  # generalises (better), generalises (worse), generalises (equivalent), varies, unknown
    per_dataset: str  # each data set's own verdict, "beauty: better; sports: inconclusive"
    effect: float = math.nan  # pooled relative change (random effects)
    ci_low: float = math.nan
    ci_high: float = math.nan
    pi_low: float = math.nan  # prediction interval for a new data set
    pi_high: float = math.nan
    tau2: float = math.nan
    i2: float = math.nan
    q: float = math.nan
    p_homogeneity: float = math.nan
    margin: float = math.nan  # mean relative margin of the per-data-set comparisons


def dataset_effect(
    results: pd.DataFrame, metric: str, variant: str, baseline: str
) -> tuple[float, float, int]:
    """(relative effect, its variance, seeds paired) of ``variant`` on one data set's trials."""
    wide = per_seed(results, metric)
    if variant not in wide or baseline not in wide:
        return math.nan, math.nan, 0
    pair = wide[[variant, baseline]].dropna()
    n = len(pair)
    if n < 2:
        return math.nan, math.nan, n
    d = (pair[variant] - pair[baseline]).to_numpy(float)
    base = float(pair[baseline].mean())
    return float(d.mean() / base), float(d.var(ddof=1) / n / base**2), n


def pool(effects: np.ndarray, variances: np.ndarray, alpha: float) -> dict[str, float]:
    """Random-effects pooling of per-data-set effects: Paule–Mandel τ², the HKSJ interval,
    the prediction interval, I² and Cochran's Q (statsmodels' ``combine_effects``)."""
    from statsmodels.stats.meta_analysis import combine_effects

    k = len(effects)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        res = combine_effects(effects, np.maximum(variances, 1e-300), method_re="iterated", alpha=alpha)
        mu, se = float(res.mean_effect_re), float(res.sd_eff_w_re_hksj)
        homogeneity = res.test_homogeneity()
    t = stats.t.ppf(1 - alpha / 2, k - 1)
    out = {"effect": mu, "ci_low": mu - t * se, "ci_high": mu + t * se, "tau2": float(res.tau2)}
    out |= {
        "i2": float(max(res.i2, 0.0)),
        "q": float(homogeneity.statistic),
        "p_homogeneity": float(homogeneity.pvalue),
    }
    if k >= 3:
        t_pi = stats.t.ppf(1 - alpha / 2, k - 2)
        spread = t_pi * math.sqrt(float(res.tau2) + float(res.sd_eff_w_re) ** 2)
        out |= {"pi_low": mu - spread, "pi_high": mu + spread}
    return out


def across_verdict(row: dict, verdicts: list[str], higher_is_better: bool, alpha: float) -> str:
    """The across-data-set verdict from a pooled row and the per-data-set verdicts (module doc)."""
    if ("better" in verdicts and "worse" in verdicts) or row.get("p_homogeneity", 1.0) < alpha:
        return VARIES
    low, high = row.get("pi_low", math.nan), row.get("pi_high", math.nan)
    if math.isnan(low) or math.isnan(high):
        return UNKNOWN
    up, down = ("better", "worse") if higher_is_better else ("worse", "better")
    if low > 0:
        return f"{GENERALISES} ({up})"
    if high < 0:
        return f"{GENERALISES} ({down})"
    margin = row.get("margin", math.nan)
    if not math.isnan(margin) and -margin < low and high < margin:
        return f"{GENERALISES} (equivalent)"
    return UNKNOWN


def across_datasets(
    per_dataset: dict[str, pd.DataFrame],
    comparisons: dict[str, pd.DataFrame],
    metric: str,
    baseline: str,
    higher_is_better: bool,
    alpha: float,
) -> pd.DataFrame:
    """One :class:`AcrossRow` per variant: ``per_dataset`` maps each data set to its finished
    trials (``results``' frame), ``comparisons`` to its comparisons on ``metric`` (as
    comparisons.csv, for the per-data-set verdicts and margins)."""
    variants = [
        v for v in dict.fromkeys(v for r in per_dataset.values() for v in r["variant"]) if v != baseline
    ]
    rows = []
    for variant in variants:
        effects, variances, verdicts, margins, named = [], [], [], [], []
        for name, results in per_dataset.items():
            e, var, _ = dataset_effect(results, metric, variant, baseline)
            compared = comparisons[name].set_index("variant")
            verdict = compared.at[variant, "verdict"] if variant in compared.index else None
            verdict = verdict if isinstance(verdict, str) and verdict else "—"  # none: too few seeds
            named.append(f"{name}: {verdict}")
            verdicts.append(verdict)
            if variant in compared.index and baseline in compared.index:
                margin = float(compared.at[variant, "margin"]) / abs(float(compared.at[baseline, "mean"]))
                margins += [margin] if math.isfinite(margin) else []
            if not math.isnan(e) and var > 0:
                effects.append(e)
                variances.append(var)
        row: dict = {"margin": float(np.mean(margins)) if margins else math.nan}
        if len(effects) >= 2:
            row |= pool(np.array(effects), np.array(variances), alpha)
        verdict = across_verdict(row, verdicts, higher_is_better, alpha)
        rows.append(AcrossRow(variant, len(effects), verdict, "; ".join(named), **row))
    return pd.DataFrame([asdict(r) for r in rows])


def dataset_ranks(
    per_dataset: dict[str, pd.DataFrame], metric: str, higher_is_better: bool, alpha: float
) -> dict | None:
    """Demšar's comparison over data sets: :func:`.ranking.friedman` with the data sets as blocks
    and each variant's mean test metric on a data set as its value (None: fewer than 3 variants
    or too few data sets)."""
    column = f"test.{metric}"
    means = [
        {"variant": v, "seed": i, column: float(m)}
        for i, results in enumerate(per_dataset.values())
        for v, m in results.groupby("variant")[column].mean().items()
    ]
    return friedman(pd.DataFrame(means), metric, higher_is_better, alpha)

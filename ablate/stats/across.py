"""Verdicts across data sets: whether a variant's effect against the baseline holds over the data
sets a study lists (``task.data: [beauty, sports, …]``).

Per data set *i* the effect is the relative paired difference on the primary test metric,
``e_i = mean_s(v_s − b_s) / mean_s(b_s)`` over the seeds *s* both trained, with variance
``v_i = var(d) / n_i / mean(b)²`` (the seeds' spread; a relative effect so that data sets whose
metric sits at different levels can be pooled), estimated on n_i − 1 degrees of freedom: 2 at
3 seeds, where it is off by a factor of 4 one time in ten.

- **Pooled effect**: the mean of the e_i, with the t interval on k − 1 df of their spread. For
  independent normal effects with one mean and any variances — the seeds' noise of each data set,
  and a between-data-set spread τ² — this interval covers at least its level (Bakirov & Székely
  2005, for levels up to 8.3 %), whatever the variances are and however few seeds estimated them.
  The inverse-variance weights of a random-effects pooling are not known at 3 seeds: the
  Hartung–Knapp–Sidik–Jonkman interval on Paule–Mandel weights covered 87.5–93 % with one effect
  shared by 3–8 data sets of 3–5 seeds (``benchmarks/calibration.py``), this one 94.0–98.5 %.
- **Homogeneity**: Cochran's Q, ``Σ w_i (e_i − ē_w)²`` with w_i = 1/v_i, whose χ²_{k−1} p-value
  holds only for known variances (it called one shared effect "varies" in 19–49 % of studies at
  3 seeds, 11–28 % at 5); its p-value here comes from a parametric bootstrap under the fitted null, each data
  set's mean redrawn N(0, v_i) and its variance v_i · χ²_{n_i−1} / (n_i − 1), Q recomputed
  (Krishnamoorthy, Lu & Mathew 2007): 2.5–5.3 % at α = 5 % over the same designs. statsmodels'
  Welch-type heteroscedastic ANOVA (``anova_generic``, ``use_var="unequal"``) rejected 10–13 % at
  8 data sets of 3 seeds, so the bootstrap is written out (:func:`homogeneity_p`).
- **Prediction interval** for the effect on a new data set: the random-effects model's (Paule–Mandel
  τ², statsmodels' ``combine_effects``), ``μ_RE ± t_{k−2} √(τ² + se²)`` around its weighted mean
  (Higgins, Thompson & Spiegelhalter 2009; IntHout et al. 2016), with τ² and I².

Beside it, Demšar's (2006) ranks: the Friedman test over data sets (blocks) × variants of the
per-data-set means, with the Nemenyi critical difference (:mod:`.ranking`).

The across-data-set verdict, per variant:

- **varies** — the effect differs between data sets: the bootstrap Q test rejects homogeneity at α;
- **generalises (better / worse)** — otherwise, when the prediction interval excludes 0: a new
  data set like these would see the effect with the same sign (never when the data sets' own
  verdicts include both better and worse: then **unknown**);
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
    effect: float = math.nan  # pooled relative change: the data sets' mean
    ci_low: float = math.nan
    ci_high: float = math.nan
    pi_low: float = math.nan  # prediction interval for a new data set
    pi_high: float = math.nan
    tau2: float = math.nan
    i2: float = math.nan
    q: float = math.nan
    p_homogeneity: float = math.nan  # Q's parametric-bootstrap p
    margin: float = math.nan  # mean relative margin of the per-data-set comparisons
    effect_re: float = math.nan  # the random-effects weighted mean: the prediction interval's centre


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


# Parametric-bootstrap draws of Q under the null: the p-value to about ±0.0015 at .05, the same
# draws on every run (a fixed generator)
BOOTSTRAP_DRAWS = 20_000
_BOOTSTRAP_SEED = 20261128


def homogeneity_p(effects: np.ndarray, variances: np.ndarray, seeds: np.ndarray) -> float:
    """P(Q* ≥ Q) under the fitted null of one shared effect, Q* from :data:`BOOTSTRAP_DRAWS` data
    sets' means N(0, v_i) and variances v_i · χ²_{n_i−1} / (n_i − 1) (module docstring)."""
    e, v, n = (np.asarray(x, dtype=float) for x in (effects, variances, seeds))

    def q(means: np.ndarray, var: np.ndarray) -> np.ndarray:
        w = 1.0 / var
        return np.sum(w * means**2, axis=-1) - np.sum(w * means, axis=-1) ** 2 / np.sum(w, axis=-1)

    rng = np.random.default_rng(_BOOTSTRAP_SEED)
    means = rng.standard_normal((BOOTSTRAP_DRAWS, len(e))) * np.sqrt(v)
    var = v * rng.chisquare(n - 1.0, (BOOTSTRAP_DRAWS, len(e))) / (n - 1.0)
    return float(np.mean(q(means, var) >= q(e, v) * (1.0 - 1e-12)))


def pool(effects: np.ndarray, variances: np.ndarray, seeds: np.ndarray, alpha: float) -> dict[str, float]:
    """The pooled effect (the effects' mean, its t interval), the bootstrap Q test of homogeneity,
    and the random-effects model's τ², I² and prediction interval (statsmodels' ``combine_effects``,
    Paule–Mandel); ``seeds``: each effect's seeds, its variance on seeds − 1 df."""
    from statsmodels.stats.meta_analysis import combine_effects

    k = len(effects)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        res = combine_effects(effects, np.maximum(variances, 1e-300), method_re="iterated", alpha=alpha)
        homogeneity = res.test_homogeneity()
    mu, se = float(np.mean(effects)), float(np.std(effects, ddof=1)) / math.sqrt(k)
    t = stats.t.ppf(1 - alpha / 2, k - 1)
    out = {"effect": mu, "ci_low": mu - t * se, "ci_high": mu + t * se, "tau2": float(res.tau2)}
    out |= {
        "i2": float(max(res.i2, 0.0)),
        "q": float(homogeneity.statistic),
        "p_homogeneity": homogeneity_p(effects, variances, seeds),
        "effect_re": float(res.mean_effect_re),
    }
    if k >= 3:
        t_pi = stats.t.ppf(1 - alpha / 2, k - 2)
        spread = t_pi * math.sqrt(float(res.tau2) + float(res.sd_eff_w_re) ** 2)
        out |= {"pi_low": out["effect_re"] - spread, "pi_high": out["effect_re"] + spread}
    return out


def across_verdict(row: dict, verdicts: list[str], higher_is_better: bool, alpha: float) -> str:
    """The across-data-set verdict from a pooled row and the per-data-set verdicts (module doc)."""
    if row.get("p_homogeneity", 1.0) < alpha:
        return VARIES
    low, high = row.get("pi_low", math.nan), row.get("pi_high", math.nan)
    if math.isnan(low) or math.isnan(high) or ("better" in verdicts and "worse" in verdicts):
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
        effects, variances, seeds, verdicts, margins, named = [], [], [], [], [], []
        for name, results in per_dataset.items():
            e, var, n = dataset_effect(results, metric, variant, baseline)
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
                seeds.append(n)
        row: dict = {"margin": float(np.mean(margins)) if margins else math.nan}
        if len(effects) >= 2:
            row |= pool(np.array(effects), np.array(variances), np.array(seeds), alpha)
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

"""Does it hold at scale: a variant's effect over a ladder of model sizes (rungs), its trend and
where it is headed.

Notation: rung *r* (k rungs), its scale ``x_r = log10(size)`` (the baseline's parameters, or its
training compute for a ladder over tokens or epochs: :data:`LADDER_SCALES`), its paired
differences ``d_rs`` (variant − baseline) over its ``n_r`` seeds, their mean ``m_r``. The effect
is read as a line in log scale, ``m_r = a + b (x_r − x_ref) + u_r + ē_r``: ``b`` the slope per
decade of scale, ``u_r`` the rung's own deviation from the line (a random intercept, variance
τ²), ``ē_r`` the mean seed noise (variance σ²/n_r).

**The fit** is weighted least squares on the rung means with weights ``n_r`` and the residual scale
estimated from the means' own scatter about the line, t on k − 2 degrees of freedom. Why not the
alternatives the two-level model suggests:

- a mixed model (statsmodels ``MixedLM``, seeds nested in rungs) estimates τ² from k = 3–6 rungs;
  REML sets it to 0 in a large share of such ladders and the intervals then read the seeds'
  noise only, on z, far below their level;
- weights 1/(s_r²/n_r) from each rung's seed variance are off by 4× one time in ten at 3 seeds
  (:mod:`.across`), and a rung whose three seeds happened to agree would decide the line.

With the same seeds per rung and one seed variance the weights are equal and the rung means have
one variance τ² + σ²/n, so the t intervals are exact for normal noise whatever τ² is; the
simulation (:func:`simulate_ladder`, ``benchmarks/ladder_sim.py``) measures them.

**The trend** (:class:`Trend`), at level α:

- **flips** — the fitted effect at the bottom rung and at the top rung both exclude 0 at α
  (pointwise t intervals) with opposite signs. Both ends' intervals excluding 0 in opposite
  directions puts their difference ``b (x_top − x_bottom)`` beyond the sum of their half-widths,
  which is at least the half-width of the difference: a flip implies a significant slope, so the
  false grows / shrinks / flips rate together is the slope test's, ≤ α;
- **grows** / **shrinks** — otherwise, when the slope's 1 − α interval excludes 0: the effect's
  magnitude rises / falls with scale (the slope has the sign / the opposite sign of the effect at
  the ladder's centre, where the fit is surest);
- **holds** — the slope is equivalent to 0: its 1 − 2α interval (TOST) inside ±``margin`` per
  decade, and the effect at the reference scale is decided (its 1 − α interval excludes 0, or its
  1 − 2α interval lies inside ±margin: no effect, at every size);
- **unknown** — otherwise; **needs ≥ 3 rungs** with fewer (a line through two means has no
  residual to judge it by).

**Where it is headed**: the effect a new rung of ``n`` seeds at a named target scale would show, with
the prediction interval of the weighted fit (it widens with the distance from the ladder's
centre); an *extrapolation* outside the ladder's range, an *interpolation* inside it.

**Decision accuracy** (Magnusson et al. 2025, DataDecide): per rung, the share of variant pairs
whose order there agrees with their order at the top rung (a tie counts one half).
"""

from __future__ import annotations

import enum
import itertools
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

from ablate.stats.settings import LADDER_SCALES


class Trend(enum.StrEnum):
    HOLDS = "holds"
    GROWS = "grows"
    SHRINKS = "shrinks"
    FLIPS = "flips"
    UNKNOWN = "unknown"
    NEEDS_RUNGS = "needs ≥ 3 rungs"


MIN_RUNGS = 3  # a line through the rung means with a residual to judge it by
INTERPOLATION, EXTRAPOLATION = "interpolation", "extrapolation"


@dataclass(frozen=True)
class LadderFit:
    """The effect as a line in log10 scale, and the trend it gives (in the metric's units)."""

    trend: Trend
    rungs: int
    reference: float  # log10 scale the effect is read at
    effect: float = math.nan  # fitted effect at the reference scale
    effect_low: float = math.nan  # its 1 − α interval
    effect_high: float = math.nan
    slope: float = math.nan  # change of the effect per decade of scale
    slope_low: float = math.nan  # its 1 − α interval
    slope_high: float = math.nan
    slope_eq_low: float = math.nan  # its 1 − 2α interval, the TOST's
    slope_eq_high: float = math.nan
    margin: float = math.nan  # the study's margin: of the effect, and of the slope per decade
    df: int = 0


@dataclass(frozen=True)
class Projection:
    """The effect a new rung at ``scale`` would show, with its prediction interval."""

    scale: float  # log10 of the target size
    effect: float
    low: float
    high: float
    kind: str  # INTERPOLATION inside the ladder's range, EXTRAPOLATION outside


def rung_means(diffs: pd.DataFrame) -> pd.DataFrame:
    """Per rung (``rung``, ``scale``, ``diff`` columns: one row per paired seed), its scale, mean
    difference and seeds, ordered by scale."""
    finite = diffs[np.isfinite(diffs["diff"].to_numpy(float))]
    grouped = finite.groupby("rung", sort=False)
    means = grouped.agg(scale=("scale", "first"), mean=("diff", "mean"), seeds=("diff", "size"))
    return means.sort_values("scale")


def _columns(means: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return tuple(means[c].to_numpy(float) for c in ("scale", "mean", "seeds"))


@dataclass(frozen=True)
class _Line:
    """The weighted least-squares line through the rung means (statsmodels' WLS)."""

    params: np.ndarray  # (a at scale 0, b)
    cov: np.ndarray
    scale: float  # residual variance of a mean of weight 1 (one seed)
    df: int

    @classmethod
    def fit(cls, scale: np.ndarray, mean: np.ndarray, seeds: np.ndarray) -> _Line:
        import statsmodels.api as sm

        exog = np.column_stack([np.ones_like(scale), scale])
        fit = sm.WLS(mean, exog, weights=seeds).fit()
        return cls(np.asarray(fit.params), np.asarray(fit.cov_params()), float(fit.scale), int(fit.df_resid))

    def at(self, x: float, level: float, seeds: float | None = None) -> tuple[float, float, float]:
        """(fitted effect at ``x``, its 1 − level interval); with ``seeds``, the prediction
        interval of a new rung's mean over that many seeds instead."""
        v = np.array([1.0, x])
        var = float(v @ self.cov @ v) + (self.scale / seeds if seeds else 0.0)
        half = stats.t.ppf(1 - level / 2, self.df) * math.sqrt(var)
        centre = float(v @ self.params)
        return centre, centre - half, centre + half


def fit_ladder(diffs: pd.DataFrame, margin: float, alpha: float, reference: float | None = None) -> LadderFit:
    """The line and the trend (module docstring) of one variant's paired differences ``diffs``
    (columns ``rung``, ``scale`` = log10 size, ``diff``); ``reference``: the log10 scale the
    effect is read at, the top rung's by default; ``margin``: the study's, in the metric's units
    (the slope's per decade)."""
    return fit_means(*_columns(rung_means(diffs)), margin, alpha, reference)


def fit_means(
    scale: np.ndarray, mean: np.ndarray, seeds: np.ndarray, margin: float, alpha: float, reference=None
) -> LadderFit:
    """:func:`fit_ladder` on the rung means already taken: each rung's log10 scale, mean
    difference and seeds."""
    k = len(scale)
    reference = (float(np.max(scale)) if k else math.nan) if reference is None else float(reference)
    if k < MIN_RUNGS:
        return LadderFit(Trend.NEEDS_RUNGS, k, reference, margin=margin)
    line = _Line.fit(scale, mean, seeds)
    slope, se = float(line.params[1]), math.sqrt(float(line.cov[1, 1]))
    half, eq_half = (stats.t.ppf(1 - level, line.df) * se for level in (alpha / 2, alpha))
    effect = line.at(reference, alpha)
    slopes = (slope, slope - half, slope + half, slope - eq_half, slope + eq_half)
    row = LadderFit(Trend.UNKNOWN, k, reference, *effect, *slopes, margin, line.df)
    return LadderFit(**{**row.__dict__, "trend": _trend(line, row, scale, seeds, alpha)})


def _excludes_zero(low: float, high: float) -> int:
    """+1 / −1 when an interval lies above / below 0, else 0."""
    return 1 if low > 0 else -1 if high < 0 else 0


def _trend(line: _Line, row: LadderFit, scale: np.ndarray, seeds: np.ndarray, alpha: float) -> Trend:
    bottom = _excludes_zero(*line.at(float(np.min(scale)), alpha)[1:])
    top = _excludes_zero(*line.at(float(np.max(scale)), alpha)[1:])
    if bottom * top < 0:
        return Trend.FLIPS
    slope_sign = _excludes_zero(row.slope_low, row.slope_high)
    if slope_sign:
        centre = line.at(float(np.average(scale, weights=seeds)), alpha)[0]
        return Trend.GROWS if slope_sign * centre > 0 else Trend.SHRINKS
    flat = -row.margin < row.slope_eq_low and row.slope_eq_high < row.margin
    # the effect at the reference equivalent to 0: its 1 − 2α interval inside ±margin
    _, low, high = line.at(row.reference, 2 * alpha)
    null = -row.margin < low and high < row.margin
    if flat and (_excludes_zero(row.effect_low, row.effect_high) or null):
        return Trend.HOLDS
    return Trend.UNKNOWN


def project(diffs: pd.DataFrame, target: float, alpha: float, seeds: int | None = None) -> Projection | None:
    """The effect a new rung of ``seeds`` seeds (default: the ladder's mean) at log10 size
    ``target`` would show, with its 1 − α prediction interval; None with fewer than 3 rungs."""
    return project_means(*_columns(rung_means(diffs)), target, alpha, seeds)


def project_means(
    scale: np.ndarray, mean: np.ndarray, seeds: np.ndarray, target: float, alpha: float, new_seeds=None
) -> Projection | None:
    """:func:`project` on the rung means already taken."""
    if len(scale) < MIN_RUNGS:
        return None
    line = _Line.fit(scale, mean, seeds)
    new_seeds = float(np.mean(seeds)) if new_seeds is None else float(new_seeds)
    effect, low, high = line.at(target, alpha, new_seeds)
    inside = np.min(scale) <= target <= np.max(scale)
    return Projection(float(target), effect, low, high, INTERPOLATION if inside else EXTRAPOLATION)


def fitted_band(diffs: pd.DataFrame, scales: np.ndarray, alpha: float) -> pd.DataFrame:
    """The fitted effect at each log10 size of ``scales`` with its 1 − α interval (the figure's
    band); empty with fewer than 3 rungs."""
    means = rung_means(diffs)
    if len(means) < MIN_RUNGS:
        return pd.DataFrame(columns=["scale", "effect", "low", "high"])
    line = _Line.fit(*_columns(means))
    return pd.DataFrame(
        [(x, *line.at(float(x), alpha)) for x in scales], columns=["scale", "effect", "low", "high"]
    )


def smallest_predicting(accuracy: pd.Series) -> str | None:
    """The smallest rung (``accuracy``: :func:`decision_accuracy`, rungs ordered by scale) from
    which every rung below the top orders all variant pairs as the top rung does; None where only
    the top rung itself does (or there is nothing to order)."""
    below = accuracy.iloc[:-1]
    if below.isna().all():
        return None
    found = None
    for rung in reversed(below.index):
        if below[rung] < 1.0:
            break
        found = rung
    return found


def decision_accuracy(means: pd.DataFrame) -> pd.Series:
    """Per rung (``means``: rows rungs ordered by scale, columns variants, each its mean metric), the
    share of variant pairs ordered there as at the top (last) rung; a tie counts one half."""
    top = means.iloc[-1]
    pairs = list(itertools.combinations(means.columns, 2))
    if not pairs:
        return pd.Series(np.nan, index=means.index, dtype=float)

    def agreement(row: pd.Series) -> float:
        signs = [np.sign(row[a] - row[b]) * np.sign(top[a] - top[b]) for a, b in pairs]
        return float(np.mean([1.0 if s > 0 else 0.5 if s == 0 else 0.0 for s in signs]))

    return means.apply(agreement, axis=1)


def ladder_table(
    per_rung: dict[str, pd.DataFrame],
    margins: dict[str, float],
    metric: str,
    baseline: str,
    alpha: float,
    target: float | None = None,
    scale: str = "parameters",
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """The trend of every variant over the rungs (``per_rung``: rung → its finished trials, as
    ``results``' frame with a ``params`` column), each read against ``margins[variant]`` (metric
    units), with the projection to a ``target`` size; the rungs (their size, each variant's mean,
    decision accuracy); and the paired differences the trends read (``variant``, ``rung``,
    ``scale``, ``diff``). A rung's size is its baseline's mean of ``scale``'s column
    (:data:`LADDER_SCALES`), in the rungs' first column named by the scale's label; a rung without
    it raises ``ValueError``."""
    from ablate.stats.paired import per_seed

    column, size = f"test.{metric}", LADDER_SCALES[scale]
    scales, sizes = {}, {}
    for rung, r in per_rung.items():
        values = r.loc[r["variant"] == baseline, size.column] if size.column in r else pd.Series([])
        mean = float(pd.to_numeric(values, errors="coerce").mean()) if len(values) else math.nan
        if not mean > 0:
            raise ValueError(f"rung {rung}: its {baseline} trials have no {size.label} figure to place it by")
        scales[rung], sizes[rung] = math.log10(mean), mean
    rungs = pd.DataFrame({rung: r.groupby("variant")[column].mean() for rung, r in per_rung.items()}).T.loc[
        sorted(scales, key=scales.get)
    ]
    rungs.insert(0, size.label, [sizes[r] for r in rungs.index])
    variants = [v for v in rungs.columns[1:] if v != baseline]
    rungs["decision_accuracy"] = decision_accuracy(rungs[[baseline, *variants]]) if variants else math.nan
    rows, points = [], []
    for variant in variants:
        diffs = []
        for rung, results in per_rung.items():
            wide = per_seed(results, metric)
            if variant in wide and baseline in wide:
                d = (wide[variant] - wide[baseline]).dropna().to_numpy(float)
                diffs += [{"rung": rung, "scale": scales[rung], "diff": x} for x in d]
        frame = pd.DataFrame(diffs, columns=["rung", "scale", "diff"])
        points.append(frame.assign(variant=variant))
        fit = fit_ladder(frame, margins.get(variant, math.nan), alpha)
        row = {"variant": variant, **fit.__dict__, "trend": str(fit.trend)}
        ahead = project(frame, math.log10(target), alpha) if target else None
        if ahead is not None:
            row |= {"target": target, "target_effect": ahead.effect, "target_low": ahead.low}
            row |= {"target_high": ahead.high, "target_kind": ahead.kind}
        rows.append(row)
    columns = ["variant", "rung", "scale", "diff"]
    return pd.DataFrame(rows), rungs, pd.concat(points)[columns] if points else pd.DataFrame(columns=columns)


def simulate_ladder(
    scales: np.ndarray,
    seeds: int,
    effect: float,
    slope: float,
    sd: float,
    margin: float,
    alpha: float,
    studies: int,
    rung_sd: float = 0.0,
    rng_seed: int = 0,
) -> dict[str, float]:
    """Ladders drawn as the model says (effect ``effect`` at the bottom rung, ``slope`` per decade,
    seed noise ``sd``, rung deviations ``rung_sd``) and read by :func:`fit_ladder` and
    :func:`project`: the share of each trend, and the coverage of the prediction interval for the
    top rung from a fit on the rungs below it (when there are ≥ 4)."""
    rng = np.random.default_rng(rng_seed)
    scales = np.sort(np.asarray(scales, dtype=float))
    counts = dict.fromkeys(Trend, 0)
    covered = 0
    ones = np.full(len(scales), float(seeds))
    for _ in range(studies):
        line = effect + slope * (scales - scales[0]) + rng.normal(0.0, rung_sd, len(scales))
        means = line + rng.normal(0.0, sd, (len(scales), seeds)).mean(axis=1)
        counts[fit_means(scales, means, ones, margin, alpha).trend] += 1
        if len(scales) > MIN_RUNGS:
            held = project_means(scales[:-1], means[:-1], ones[:-1], scales[-1], alpha, seeds)
            covered += held.low <= means[-1] <= held.high
    shares = {str(trend): n / studies for trend, n in counts.items()}
    return shares | {"coverage": covered / studies if len(scales) > MIN_RUNGS else math.nan}

"""Factorial grids answered per factor: which component choices matter, averaged over the others.

A study with ``grid: {axis: [levels], ...}`` trains every cell of the grid over the seeds. On one
metric's per-(cell, seed) values this fits, by OLS (statsmodels), the linear model

    metric ~ C(axis_1) + … + C(axis_m) + C(axis_i):C(axis_j) (every pair i < j) + C(seed)

with treatment coding (each axis's first level the reference) and the seeds as blocks. Axes with a
single level drop out. Per axis it reports:

- the **main-effect F-test**, type II: the drop in residual sum of squares when the axis's main
  effect leaves a model that already lacks its interactions, over the full model's residual mean
  square (statsmodels' ``anova_lm(typ=2)`` on the same model gives the same numbers);
- per level against the axis's first level, the **marginal-mean contrast**: the model's mean over
  the other axes' levels (equally weighted) and the seeds, level minus first level, with its
  standard error and the model's residual degrees of freedom. It gets a verdict as a comparison
  with the baseline does (:func:`.verdicts.decide_estimate`): its decision level from the
  correction over every contrast of every axis, its equivalence (TOST) level from the same
  correction over their TOST p-values (or α each, ``settings.equivalence``), the margin
  ``settings.margin_for`` the first level's marginal mean.

Per pair of axes, the **interaction F-test** (type II equals type III for the highest-order terms),
corrected over the pairs. An interaction means an axis's effect depends on another's level: the
main effects then average over effects that differ.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from scipy import stats
from statsmodels.regression.linear_model import OLS

from ablate.stats.corrections import adjust_pvalues
from ablate.stats.paired import per_seed
from ablate.stats.verdicts import Decision, decide_estimate, decision_levels, equivalence_levels, tost_p

if TYPE_CHECKING:
    from ablate.stats.settings import ReportSettings


def grid_cells(grid: dict[str, list]) -> dict[str, tuple[str, ...]]:
    """Each grid cell's variant name → its level labels, one per axis, in the grid's order. The
    names are the ones ``ablate.study.load`` gives grid variants: ``axis=value`` joined by commas."""
    axes = list(grid)
    cells = {}
    for values in itertools.product(*(grid[a] for a in axes)):
        labels = tuple(str(v) for v in values)
        cells[",".join(f"{a}={v}" for a, v in zip(axes, labels, strict=True))] = labels
    return cells


@dataclass(frozen=True)
class Term:
    """One row of the ANOVA table: a main effect (one axis) or a two-way interaction (two)."""

    axes: tuple[str, ...]
    df: int
    f: float
    p: float
    p_adj: float  # interactions: corrected over the pairs of axes; main effects: p

    @property
    def name(self) -> str:
        return " × ".join(self.axes)


@dataclass(frozen=True)
class Contrast:
    """One level of an axis against the axis's first level, on marginal means."""

    axis: str
    level: str
    reference: str
    mean: float  # the level's marginal mean
    reference_mean: float
    se: float  # of the contrast, from the model (its residual degrees of freedom: Factorial.df_resid)
    decision: Decision  # delta = mean − reference_mean; its interval, raw p, margin, verdict
    p_adj: float  # corrected over every contrast of every axis: < α exactly when the interval excludes 0


@dataclass(frozen=True)
class Factorial:
    """A grid study's factorial analysis on one metric; ``problem`` says why there is none."""

    metric: str
    levels: dict[str, list[str]]  # axis → level labels (axes with ≥ 2 levels), first = reference
    cells: int = 0
    seeds: int = 0
    observations: int = 0
    df_resid: int = 0
    mains: tuple[Term, ...] = ()
    interactions: tuple[Term, ...] = ()
    contrasts: tuple[Contrast, ...] = ()
    problem: str = ""


def _long(results: pd.DataFrame, metric: str, cells: dict[str, tuple[str, ...]]) -> pd.DataFrame:
    """One row per (grid cell, seed) with a value: ``seed``, ``cell``, ``value``."""
    wide = per_seed(results, metric)
    wide = wide[[c for c in wide.columns if c in cells]]
    long = wide.stack().dropna().rename("value").reset_index()  # pandas ≥ 3 keeps NaN in stack()
    return long.rename(columns={"variant": "cell"}).astype({"cell": str})


def _design(
    data: pd.DataFrame, levels: dict[str, list[str]], seeds: list
) -> tuple[np.ndarray, dict[tuple[str, ...], list[int]]]:
    """Treatment-coded design matrix (intercept, main effects, two-way interactions, seeds) and
    each term's columns: ``(axis,)``, ``(axis_i, axis_j)``, ``("seed",)``."""
    columns: list[np.ndarray] = [np.ones(len(data))]
    terms: dict[tuple[str, ...], list[int]] = {}
    dummies = {a: [(data[a] == lv).to_numpy(float) for lv in levels[a][1:]] for a in levels}
    for a in levels:
        terms[(a,)] = list(range(len(columns), len(columns) + len(dummies[a])))
        columns += dummies[a]
    for a, b in itertools.combinations(levels, 2):
        products = [u * v for u in dummies[a] for v in dummies[b]]
        terms[(a, b)] = list(range(len(columns), len(columns) + len(products)))
        columns += products
    seed_columns = [(data["seed"] == s).to_numpy(float) for s in seeds[1:]]
    terms[("seed",)] = list(range(len(columns), len(columns) + len(seed_columns)))
    columns += seed_columns
    return np.column_stack(columns), terms


def _fit(y: np.ndarray, x: np.ndarray, keep: list[int]):
    return OLS(y, x[:, keep]).fit()


def _drop_test(y, x, keep: list[int], drop: list[int], full) -> tuple[int, float, float]:
    """(df, F, p) of leaving out ``drop`` from the model on ``keep``, over the full model's
    residual mean square (type II)."""
    bigger = _fit(y, x, keep)
    smaller = _fit(y, x, [c for c in keep if c not in drop])
    df = int(round(smaller.df_resid - bigger.df_resid))
    if df <= 0:
        return 0, float("nan"), float("nan")
    f = (smaller.ssr - bigger.ssr) / df / (full.ssr / full.df_resid)
    return df, float(f), float(stats.f.sf(f, df, full.df_resid))


def _marginal_rows(cells: dict[str, tuple[str, ...]], axes: list[str], levels, seeds: list) -> dict:
    """(axis, level) → the design row whose product with the coefficients is the level's marginal
    mean: the model's prediction averaged over every grid cell with that level and every seed."""
    grid = pd.DataFrame([dict(zip(axes, labels, strict=True)) for labels in cells.values()])
    grid = grid.merge(pd.DataFrame({"seed": seeds}), how="cross")
    rows, _ = _design(grid, levels, seeds)
    return {(a, lv): rows[(grid[a] == lv).to_numpy()].mean(axis=0) for a in levels for lv in levels[a]}


def factorial(results: pd.DataFrame, settings: ReportSettings, metric: str | None = None) -> Factorial | None:
    """The factorial analysis of the grid in ``settings.grid`` on ``metric`` (default: primary);
    None when the study has no grid. Only the grid's cells enter (not the baseline or named
    variants). Needs a value in every cell and residual degrees of freedom (≥ 2 seeds)."""
    if not settings.grid:
        return None
    metric = metric or settings.primary
    cells = grid_cells(settings.grid)
    axes = list(settings.grid)
    levels = {a: [str(v) for v in settings.grid[a]] for a in axes if len(settings.grid[a]) >= 2}
    if not levels:
        return Factorial(metric, levels, problem="no grid axis has two levels")
    data = _long(results, metric, cells)
    missing = [c for c in cells if c not in set(data["cell"])]
    if missing:
        return Factorial(
            metric, levels, problem=f"{len(missing)} grid cell(s) without results (e.g. {missing[0]})"
        )
    for i, a in enumerate(axes):
        data[a] = [cells[c][i] for c in data["cell"]]
    seeds = sorted(data["seed"].unique().tolist())
    y = data["value"].to_numpy(float)
    x, terms = _design(data, levels, seeds)
    every = list(range(x.shape[1]))
    full = _fit(y, x, every)
    shape = {"cells": len(cells), "seeds": len(seeds), "observations": len(y)}
    df_resid = int(round(full.df_resid))
    if df_resid < 1:
        return Factorial(metric, levels, **shape, problem="no residual degrees of freedom (one seed)")

    pairs = [t for t in terms if len(t) == 2]
    tested = [_drop_test(y, x, every, terms[t], full) for t in pairs]
    adjusted = adjust_pvalues(np.array([p for _, _, p in tested]), settings.correction)
    interactions = tuple(Term(t, *test, float(q)) for t, test, q in zip(pairs, tested, adjusted, strict=True))
    mains = []
    for a in levels:
        without = [c for c in every if not any(c in terms[t] for t in pairs if a in t)]
        df, f, p = _drop_test(y, x, without, terms[(a,)], full)
        mains.append(Term((a,), df, f, p, p))

    marginal = _marginal_rows(cells, axes, levels, seeds)
    found = []  # (axis, level, estimate, se, p) of each level against its axis's first level
    for a in levels:
        for lv in levels[a][1:]:
            test = full.t_test(marginal[(a, lv)] - marginal[(a, levels[a][0])])
            found.append((a, lv, *(float(np.squeeze(v)) for v in (test.effect, test.sd, test.pvalue))))
    raw = np.array([p for *_, p in found])
    decide_at = decision_levels(raw, settings.alpha, settings.correction)
    adjusted = adjust_pvalues(raw, settings.correction)
    means = [tuple(float(marginal[(a, v)] @ full.params) for v in (lv, levels[a][0])) for a, lv, *_ in found]
    margins = [settings.margin_for(reference_mean) for _, reference_mean in means]
    tost = np.array([tost_p(e, se, df_resid, m) for (_, _, e, se, _), m in zip(found, margins, strict=True)])
    equivalent_at = equivalence_levels(tost, settings.alpha, settings.correction, settings.equivalence)
    contrasts = []
    for i, (a, lv, estimate, se, _) in enumerate(found):
        (mean, reference_mean), level, eq_level = means[i], decide_at[i], equivalent_at[i]
        higher = settings.higher(metric)
        decision = decide_estimate(estimate, se, df_resid, level, margins[i], higher, len(seeds), eq_level)
        p_adj = float(adjusted[i])
        contrasts.append(Contrast(a, lv, levels[a][0], mean, reference_mean, se, decision, p_adj))
    return Factorial(
        metric,
        levels,
        **shape,
        df_resid=df_resid,
        mains=tuple(mains),
        interactions=interactions,
        contrasts=tuple(contrasts),
    )

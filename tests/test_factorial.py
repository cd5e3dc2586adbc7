"""ablate.stats.factorial: a grid study answered per factor. Planted main effects get the right
verdicts; the model's contrasts, standard errors and F-tests agree with an independent numpy
least-squares fit, with hand ANOVA formulas and with statsmodels' own type II table; the report
section shows them."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import statsmodels.formula.api as smf
from statsmodels.stats.anova import anova_lm

from ablate.report import write_report
from ablate.stats import ReportSettings
from ablate.stats.factorial import factorial, grid_cells
from ablate.stats.verdicts import decide, decide_estimate

GRID_2X2 = {"norm.placement": ["pre", "post"], "ffn.kind": ["mlp", "swiglu"]}
GRID_2X3 = {"norm.placement": ["pre", "post"], "attention.heads": [1, 2, 4]}


def grid_study(grid, effects, seeds=5, noise=0.002, rng_seed=0, drop=()) -> pd.DataFrame:
    """Every grid cell × seed: 0.6 + the planted effect of each axis's level + a seed effect +
    noise; plus a baseline that is no grid cell. ``effects``: axis → {level: effect}."""
    rng = np.random.default_rng(rng_seed)
    rows = []
    for name, labels in grid_cells(grid).items():
        for s in range(seeds):
            if (name, s) in drop:
                continue
            x = 0.6 + sum(effects[a].get(lv, 0.0) for a, lv in zip(grid, labels, strict=True))
            rows.append(
                {
                    "variant": name,
                    "seed": s,
                    "differs": name,
                    "test.ndcg@10": x + 0.01 * s + rng.normal(0, noise),
                }
            )
    rows += [
        {"variant": "base", "seed": s, "differs": "—", "test.ndcg@10": 0.58 + 0.01 * s} for s in range(seeds)
    ]
    return pd.DataFrame(rows)


def settings(grid, **kw) -> ReportSettings:
    return ReportSettings(
        **{"study": "g", "primary": "ndcg@10", "grid": grid, "bootstrap": 200, "calibration": 0, **kw}
    )


def long_frame(results: pd.DataFrame, grid) -> pd.DataFrame:
    cells = grid_cells(grid)
    d = results[results["variant"].isin(list(cells))].copy()
    for i in range(len(grid)):
        d[f"f{i}"] = [cells[v][i] for v in d["variant"]]
    return d.rename(columns={"test.ndcg@10": "y"})


def numpy_fit(d: pd.DataFrame, grid):
    """Independent of the module: cell-means coding (one column per cell, no intercept) plus seed
    columns; for two axes this spans the same space as main effects + interaction + seeds."""
    cells = list(grid_cells(grid))
    seeds = sorted(d["seed"].unique())
    x = np.column_stack(
        [(d["variant"] == c).to_numpy(float) for c in cells]
        + [(d["seed"] == s).to_numpy(float) for s in seeds[1:]]
    )
    y = d["y"].to_numpy(float)
    beta, _, rank, _ = np.linalg.lstsq(x, y, rcond=None)
    rss = float(np.sum((y - x @ beta) ** 2))
    df = len(y) - rank
    cov = rss / df * np.linalg.inv(x.T @ x)
    return cells, beta, cov, rss, df


def numpy_contrast(d, grid, axis_index, level, reference):
    """Marginal mean of ``level`` minus that of ``reference`` (equal weight over the other axis's
    levels), its standard error, from :func:`numpy_fit`."""
    cells, beta, cov, _, _ = numpy_fit(d, grid)
    labels = grid_cells(grid)
    weights = np.zeros(len(beta))
    for j, c in enumerate(cells):
        lv = labels[c][axis_index]
        share = 1.0 / sum(1 for c2 in cells if labels[c2][axis_index] == lv)
        weights[j] = share if lv == level else (-share if lv == reference else 0.0)
    return float(weights @ beta), float(math.sqrt(weights @ cov @ weights))


def test_grid_cells_are_the_study_variants():
    from ablate.study.load import load_study

    study = load_study(Path(__file__).resolve().parents[1] / "studies" / "quickstart_grid.yaml")
    cells = grid_cells(study.spec.grid)
    assert len(cells) == 4 and set(cells) <= set(study.variants)
    assert cells["norm.placement=post,ffn.kind=swiglu"] == ("post", "swiglu")
    stored = ReportSettings.from_json(study.report_settings_json())
    assert stored.grid == study.spec.grid and set(grid_cells(stored.grid)) == set(cells)


def test_two_by_two_planted_main_effects_no_interaction():
    results = grid_study(GRID_2X2, {"norm.placement": {"post": 0.05}, "ffn.kind": {}})
    s = settings(GRID_2X2)
    fa = factorial(results, s)
    assert not fa.problem and (fa.cells, fa.seeds, fa.observations) == (4, 5, 20)
    assert fa.df_resid == 20 - (1 + 1 + 1 + 1 + 4)
    verdict = {(c.axis, c.level): c.decision for c in fa.contrasts}
    placement, kind = verdict[("norm.placement", "post")], verdict[("ffn.kind", "swiglu")]
    assert placement.verdict == "better" and not placement.negligible
    assert kind.verdict == "equivalent"  # within 2% of mlp's marginal mean
    assert kind.margin == pytest.approx(
        0.02 * next(c.reference_mean for c in fa.contrasts if c.axis == "ffn.kind")
    )
    (interaction,) = fa.interactions
    assert interaction.axes == ("norm.placement", "ffn.kind") and interaction.p_adj > 0.05

    # by hand: balanced, so the marginal contrast is the difference of raw level means, its se
    # σ̂ √(1/10 + 1/10), and the type II F of a two-level axis N Δ² / 4 / σ̂² (= t²)
    d = long_frame(results, GRID_2X2)
    _, _, _, rss, df = numpy_fit(d, GRID_2X2)
    sigma2 = rss / df
    delta = d.loc[d.f0 == "post", "y"].mean() - d.loc[d.f0 == "pre", "y"].mean()
    assert placement.delta == pytest.approx(delta, rel=1e-10)
    contrast = next(c for c in fa.contrasts if c.axis == "norm.placement")
    assert contrast.se == pytest.approx(math.sqrt(sigma2 * (1 / 10 + 1 / 10)), rel=1e-8)
    main = next(t for t in fa.mains if t.axes == ("norm.placement",))
    assert main.df == 1 and main.f == pytest.approx(20 * delta**2 / 4 / sigma2, rel=1e-8)
    assert main.f == pytest.approx((delta / contrast.se) ** 2, rel=1e-8)
    # the interval the verdict reads: Δ ± t_{df}(1 − a/2) se at the Holm decision level a
    half = placement.ci_high - placement.delta
    from scipy import stats as st

    assert half == pytest.approx(st.t.ppf(1 - placement.level / 2, df) * contrast.se, rel=1e-8)
    assert placement.level == pytest.approx(0.05 / 2)  # smallest of 2 contrasts under Holm


def test_two_by_three_unbalanced_matches_numpy_and_statsmodels_anova():
    effects = {"norm.placement": {"post": 0.04}, "attention.heads": {"4": -0.03}}  # levels as labels
    drop = {("norm.placement=post,attention.heads=2", 3)}
    results = grid_study(GRID_2X3, effects, seeds=4, rng_seed=1, drop=drop)
    fa = factorial(results, settings(GRID_2X3))
    assert fa.levels == {"norm.placement": ["pre", "post"], "attention.heads": ["1", "2", "4"]}
    assert fa.observations == 23 and fa.df_resid == 23 - (1 + 1 + 2 + 2 + 3)
    verdict = {(c.axis, c.level): c.decision.verdict for c in fa.contrasts}
    assert verdict == {
        ("norm.placement", "post"): "better",
        ("attention.heads", "2"): "equivalent",
        ("attention.heads", "4"): "worse",
    }
    d = long_frame(results, GRID_2X3)
    for c in fa.contrasts:
        index = list(GRID_2X3).index(c.axis)
        delta, se = numpy_contrast(d, GRID_2X3, index, c.level, c.reference)
        assert c.decision.delta == pytest.approx(delta, rel=1e-8, abs=1e-12)
        assert c.se == pytest.approx(se, rel=1e-8)
    # unbalanced: the marginal means weight cells equally, not trials
    raw = d.loc[d.f1 == "2", "y"].mean() - d.loc[d.f1 == "1", "y"].mean()
    assert next(c for c in fa.contrasts if c.level == "2").decision.delta != pytest.approx(raw, rel=1e-6)

    table = anova_lm(smf.ols("y ~ C(f0) + C(f1) + C(f0):C(f1) + C(seed)", data=d).fit(), typ=2)
    for term, row in (("norm.placement", "C(f0)"), ("attention.heads", "C(f1)")):
        main = next(t for t in fa.mains if t.axes == (term,))
        assert main.f == pytest.approx(table.loc[row, "F"], rel=1e-8)
        assert main.p == pytest.approx(table.loc[row, "PR(>F)"], rel=1e-6)
        assert main.df == table.loc[row, "df"]
    (interaction,) = fa.interactions
    assert interaction.f == pytest.approx(table.loc["C(f0):C(f1)", "F"], rel=1e-8)
    assert interaction.p_adj == interaction.p > 0.05  # one interaction: nothing to correct


def test_too_few_seeds_to_decide_is_inconclusive():
    results = grid_study(GRID_2X2, {"norm.placement": {"post": 0.01}, "ffn.kind": {}}, seeds=3, noise=0.02)
    fa = factorial(results, settings(GRID_2X2))
    placement = next(c for c in fa.contrasts if c.axis == "norm.placement").decision
    assert placement.verdict == "inconclusive"
    assert placement.mdd > abs(placement.delta)


def test_decide_estimate_is_decide_for_paired_seeds():
    d = np.array([0.012, 0.02, 0.004, 0.015])
    paired = decide(d, 0.05, 0.01)
    estimate = decide_estimate(d.mean(), d.std(ddof=1) / 2, 3, 0.05, 0.01, seeds=4)
    for field in ("verdict", "n", "delta", "ci_low", "ci_high", "p", "mdd", "negligible"):
        assert getattr(estimate, field) == pytest.approx(getattr(paired, field)), field


def test_what_cannot_be_analysed():
    assert factorial(grid_study(GRID_2X2, {"norm.placement": {}, "ffn.kind": {}}), settings({})) is None
    gap = grid_study(GRID_2X2, {"norm.placement": {}, "ffn.kind": {}}, seeds=3)
    gap = gap[gap["variant"] != "norm.placement=post,ffn.kind=mlp"]
    assert "without results" in factorial(gap, settings(GRID_2X2)).problem
    one = grid_study(GRID_2X2, {"norm.placement": {}, "ffn.kind": {}}, seeds=1)
    assert "one seed" in factorial(one, settings(GRID_2X2)).problem
    flat = {"norm.placement": ["pre"], "ffn.kind": ["mlp"]}
    assert (
        "two levels"
        in factorial(grid_study(flat, {"norm.placement": {}, "ffn.kind": {}}), settings(flat)).problem
    )


def test_report_section_which_factors_matter(tmp_path):
    results = grid_study(GRID_2X2, {"norm.placement": {"post": 0.05}, "ffn.kind": {}})
    paths = write_report(results, None, None, settings(GRID_2X2), tmp_path / "grid")
    md = paths["md"].read_text(encoding="utf-8")
    section = md[md.index("## Which factors matter") :]
    assert "norm.placement matters (F(1, 12) = " in section and "post is better than pre" in section
    assert "swiglu is equivalent to mlp within ±" in section
    assert "| norm.placement | pre |" in section and "better ▲" in section
    assert "norm.placement × ffn.kind: no evidence that the effect of norm.placement depends" in section
    plain = write_report(results, None, None, settings({}), tmp_path / "plain")
    assert "Which factors matter" not in plain["md"].read_text(encoding="utf-8")

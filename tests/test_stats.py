"""ablate.stats against hand-computed values on small fixed inputs.

The simulation-based calibration (A/A, planted effect, CI coverage) is in test_calibration.py."""

from __future__ import annotations

import gc
import itertools
import json
import math

import numpy as np
import pandas as pd
import pytest
from pydantic import ValidationError
from scipy import stats as st

from ablate.errors import AblateError
from ablate.report import format_table
from ablate.stats import (
    ReportSettings,
    Verdict,
    adjust_pvalues,
    bootstrap_ci,
    compare,
    comparison_frame,
    comparison_rows,
    comparisons,
    friedman,
    min_detectable_d,
    min_seeds_ci,
    pairwise,
    pairwise_matrix,
)

# 3 variants × 4 seeds; A = base + [.02, .03, .01, .04], B = base + [-.01, 0, .01, -.02].
VALUES = {
    "base": [0.30, 0.32, 0.31, 0.33],
    "A": [0.32, 0.35, 0.32, 0.37],
    "B": [0.29, 0.32, 0.32, 0.31],
}
DIFFERS = {"base": "—", "A": "attention", "B": "ffn"}


def frame(values=VALUES, seeds=None) -> pd.DataFrame:
    rows = []
    for v, xs in values.items():
        for s, x in zip(seeds or range(len(xs)), xs, strict=True):
            rows.append(
                {
                    "variant": v,
                    "seed": s,
                    "differs": DIFFERS.get(v, v),
                    "test.ndcg@10": x,
                    "valid.ndcg@10": x + 0.01,
                    "params": 100,
                    "note": "kept",
                }
            )
    return pd.DataFrame(rows)


def settings(**kw) -> ReportSettings:
    return ReportSettings(**{"study": "t", "primary": "ndcg@10", "bootstrap": 2000, **kw})


NO_UNITS = pd.DataFrame(columns=["variant", "seed", "unit", "ndcg@10"])


def row(df: pd.DataFrame, variant: str):
    return df.set_index("variant").loc[variant]


def test_mean_sd_delta_rel_change_by_hand():
    out = compare(frame(), NO_UNITS, settings(), "ndcg@10")
    assert list(out["variant"]) == ["base", "A", "B"]
    base, a, b = row(out, "base"), row(out, "A"), row(out, "B")
    # base: mean .315; deviations ±.015, ±.005 → Σ² = 5e-4 → sd = √(5e-4 / 3)
    assert base["mean"] == pytest.approx(0.315)
    assert base["sd"] == pytest.approx(math.sqrt(5e-4 / 3))
    # A: mean .34; deviations -.02, .01, -.02, .03 → Σ² = 18e-4 → sd = √(6e-4)
    assert a["mean"] == pytest.approx(0.34)
    assert a["sd"] == pytest.approx(math.sqrt(6e-4))
    assert a["delta"] == pytest.approx(0.025)
    assert a["rel_change"] == pytest.approx(0.025 / 0.315)
    assert b["delta"] == pytest.approx(-0.005)
    assert b["rel_change"] == pytest.approx(-0.005 / 0.315)
    assert a["n_seeds"] == a["n_paired"] == 4
    assert a["differs"] == "attention" and base["differs"] == "—"
    # baseline: comparison columns empty
    assert base[["delta", "ci_low", "boot_low", "p_seeds", "p_seeds_adj", "d_seeds", "mdd"]].isna().all()
    assert not base["significant"] and base["verdict"] == ""


def test_paired_t_test_from_the_formula():
    out = compare(frame(), NO_UNITS, settings(), "ndcg@10")
    sd_d = math.sqrt(5e-4 / 3)  # both A and B differences have Σ(d - d̄)² = 5e-4
    t_a = 0.025 / (sd_d / math.sqrt(4))
    t_b = -0.005 / (sd_d / math.sqrt(4))
    p_a, p_b = 2 * st.t.sf(abs(t_a), df=3), 2 * st.t.sf(abs(t_b), df=3)
    assert row(out, "A")["p_seeds"] == pytest.approx(p_a, rel=1e-6)
    assert row(out, "B")["p_seeds"] == pytest.approx(p_b, rel=1e-6)
    assert row(out, "A")["d_seeds"] == pytest.approx(0.025 / sd_d)
    assert row(out, "B")["d_seeds"] == pytest.approx(-0.005 / sd_d)
    # Holm over the family {A, B}: smallest × 2, then max(previous, next × 1)
    assert p_a < p_b
    assert row(out, "A")["p_seeds_adj"] == pytest.approx(min(1, 2 * p_a), rel=1e-6)
    assert row(out, "B")["p_seeds_adj"] == pytest.approx(max(2 * p_a, p_b), rel=1e-6)
    assert row(out, "A")["significant"] == (2 * p_a < 0.05)  # the verdict: better / worse
    assert row(out, "A")["verdict"] in ("better", "inconclusive")
    # Wilcoxon across 4 seeds: all-positive differences → exact p = 2 / 2^4
    assert row(out, "A")["p_seeds_wilcoxon"] == pytest.approx(2 / 16)


def test_holm_and_bh_by_hand():
    # Holm: sorted .01, .03, .04 → .01·3 = .03, .03·2 = .06, max(.06, .04·1) = .06
    assert adjust_pvalues([0.01, 0.04, 0.03], "holm") == pytest.approx([0.03, 0.06, 0.06])
    # BH: .04·3/3 = .04, min(.04, .03·3/2) = .04, min(.04, .01·3/1) = .03
    assert adjust_pvalues([0.01, 0.04, 0.03], "fdr_bh") == pytest.approx([0.03, 0.04, 0.04])
    out = adjust_pvalues([0.01, np.nan, 0.04, 0.03], "holm")
    assert np.isnan(out[1]) and out[[0, 2, 3]] == pytest.approx([0.03, 0.06, 0.06])
    # capped at 1; ties keep their order; empty and all-NaN inputs stay empty / NaN
    assert adjust_pvalues([0.5, 0.5, 0.6], "holm") == pytest.approx([1.0, 1.0, 1.0])
    assert adjust_pvalues([0.02, 0.02], "fdr_bh") == pytest.approx([0.02, 0.02])
    assert len(adjust_pvalues([], "holm")) == 0 and np.isnan(adjust_pvalues([np.nan], "fdr_bh")).all()
    with pytest.raises(AblateError, match="correction"):
        adjust_pvalues([0.1], "bonferroni")


def test_own_holm_and_bh_match_statsmodels():
    from statsmodels.stats.multitest import multipletests

    rng = np.random.default_rng(3)
    gc.freeze()  # multipletests runs gc.collect() on every call: 0.1 s each with the test heap
    try:
        for _ in range(40):
            p = rng.random(rng.integers(1, 12)) ** 3
            for method in ("holm", "fdr_bh"):
                expected = multipletests(p, method=method)[1]
                assert adjust_pvalues(p, method) == pytest.approx(expected, abs=1e-15)
    finally:
        gc.unfreeze()


def test_percentile_ci_matches_the_exact_bootstrap_distribution():
    d = np.array([0.02, 0.03, 0.01, 0.04])
    low, high = bootstrap_ci(d, 20_000, seed=0, method="percentile")
    # all 4^4 equally likely resamples of 4 seeds, enumerated
    exact = np.sort([np.mean(s) for s in itertools.product(d, repeat=4)])
    step = 0.01 / 4  # the resampled means move in steps of one difference-quantum / k
    assert low == pytest.approx(np.quantile(exact, 0.025), abs=step + 1e-12)
    assert high == pytest.approx(np.quantile(exact, 0.975), abs=step + 1e-12)
    assert d.min() <= low < d.mean() < high <= d.max()
    assert bootstrap_ci(d, 20_000, seed=0, method="percentile") == (low, high)  # fixed RNG
    out = compare(frame(), NO_UNITS, settings(ci="percentile"), "ndcg@10")
    assert row(out, "A")["boot_low"] < 0.025 < row(out, "A")["boot_high"]


def test_bootstrap_t_matches_the_exact_studentized_distribution():
    d = np.array([0.02, 0.03, 0.01, 0.04])
    k, mean, se = 4, 0.025, math.sqrt(5e-4 / 3) / 2  # sd of d = √(5e-4 / 3)
    # all 4^4 equally likely resamples: t* = (mean* − mean) / se*, ±∞ for one repeated seed
    t = []
    for s in itertools.product(d, repeat=4):
        s = np.array(s)
        t.append(
            np.sign(s.mean() - mean) * np.inf
            if np.ptp(s) == 0
            else (s.mean() - mean) / (s.std(ddof=1) / math.sqrt(k))
        )
    t = np.sort(t)
    low, high = bootstrap_ci(d, 40_000, seed=0, method="bootstrap-t")
    # Monte Carlo quantiles of a discrete distribution: between the exact ones at 2.5 % ± 0.5 %
    t_hi = np.quantile(t, [0.97, 0.98], method="inverted_cdf")
    t_lo = np.quantile(t, [0.02, 0.03], method="inverted_cdf")
    assert mean - t_hi[1] * se <= low <= mean - t_hi[0] * se
    assert mean - t_lo[1] * se <= high <= mean - t_lo[0] * se
    assert low < d.min() and high > d.max()  # studentized: reaches beyond the observed differences
    # 3 seeds: 3 of 27 resamples are one repeated seed (t* = ±∞), > 2.5 % a side: n/a, not (−∞, +∞)
    assert min_seeds_ci("bootstrap-t") == 4
    assert np.isnan(bootstrap_ci(d[:3], 1000, seed=0, method="bootstrap-t")).all()


def test_smoothed_bootstrap_t_by_its_definition():
    d = np.array([0.02, 0.03, 0.01, 0.04])
    k, mean, sd = 4, d.mean(), d.std(ddof=1)
    assert (mean, sd) == pytest.approx((0.025, math.sqrt(5e-4 / 3)))
    se = sd / math.sqrt(k)
    low, high = bootstrap_ci(d, 5000, seed=0)  # the default method
    # re-derived: resample seeds, add N(0, se²) to every resampled value, studentize
    rng = np.random.default_rng(0)
    s = d[rng.integers(0, k, size=(5000, k))] + rng.normal(0, se, size=(5000, k))
    t = (s.mean(1) - mean) / (s.std(1, ddof=1) / math.sqrt(k))
    q = np.quantile(t, [0.025, 0.975], method="inverted_cdf")
    assert (low, high) == pytest.approx((mean - q[1] * se, mean - q[0] * se), rel=1e-12)
    # close to the t interval (t_3 = 3.182): a little wider, never absurd
    t_half = st.t.ppf(0.975, 3) * se
    assert 1.0 < (high - low) / (2 * t_half) < 1.6
    assert bootstrap_ci(d, 5000, seed=0) == (low, high) and bootstrap_ci(d, 5000, seed=1) != (low, high)
    # near-tied seeds (the plain bootstrap-t's failure: se* ≈ 0 resamples) stay bounded
    tied = np.array([-0.0339, -0.03391, -0.0280, -0.0420])
    s_low, s_high = bootstrap_ci(tied, 5000, seed=0)
    width_t = 2 * st.t.ppf(0.975, 3) * tied.std(ddof=1) / 2
    assert (s_high - s_low) < 1.6 * width_t
    p_low, p_high = bootstrap_ci(tied, 5000, seed=0, method="bootstrap-t")
    assert (p_high - p_low) > 3 * width_t  # what smoothing fixes
    # constant differences: a point; too few seeds: NaN; unknown method: named
    assert bootstrap_ci(np.full(4, 0.01), 100, seed=0) == (0.01, 0.01)
    assert min_seeds_ci() == 3 and np.isnan(bootstrap_ci(d[:2], 100, seed=0)).all()
    with pytest.raises(AblateError, match="CI method"):
        bootstrap_ci(d, 100, seed=0, method="bca")


def units_frame() -> pd.DataFrame:
    # differences variant − base over the (seed, unit) pairs: +.25, 0, -.25 | +.5, 0; seed 1 unit 9 unpaired
    base = [(0, 1, 0.5), (0, 2, 0.5), (0, 3, 0.5), (1, 1, 0.25), (1, 2, 0.25)]
    var = [(0, 1, 0.75), (0, 2, 0.5), (0, 3, 0.25), (1, 1, 0.75), (1, 2, 0.25), (1, 9, 1.0)]
    rows = [{"variant": "base", "seed": s, "unit": u, "ndcg@10": x} for s, u, x in base]
    rows += [{"variant": "A", "seed": s, "unit": u, "ndcg@10": x} for s, u, x in var]
    return pd.DataFrame(rows)


@pytest.mark.parametrize("higher, expected", [(True, (2 + 0.5 * 2) / 5), (False, (1 + 0.5 * 2) / 5)])
def test_p_better_units_with_ties(higher, expected):
    s = settings(higher_is_better={"ndcg@10": higher})
    out = row(compare(frame({k: VALUES[k] for k in ("base", "A")}), units_frame(), s, "ndcg@10"), "A")
    assert out["n_units"] == 5
    assert out["p_better_units"] == pytest.approx(expected)
    # rank-biserial on the non-zero differences +.25, -.25, +.5: ranks 1.5, 1.5, 3 → (4.5 - 1.5) / 6
    assert out["rank_biserial"] == pytest.approx(0.5)
    assert out["p_units"] == pytest.approx(st.wilcoxon([0.25, 0.0, -0.25, 0.5, 0.0]).pvalue)
    assert out["p_units_adj"] == pytest.approx(out["p_units"])  # family of one


@pytest.mark.parametrize("k", [1, 2])
def test_too_few_seeds_is_na_not_a_number(k):
    data = frame({v: VALUES[v][:k] for v in ("base", "A")})
    out = compare(data, NO_UNITS, settings(), "ndcg@10")
    a = row(out, "A")
    assert a["n_paired"] == k
    assert a["delta"] == pytest.approx(np.mean(np.subtract(VALUES["A"][:k], VALUES["base"][:k])))
    for col in ("p_seeds", "p_seeds_wilcoxon", "p_seeds_adj", "d_seeds", "ci_low", "ci_high", "mdd"):
        assert np.isnan(a[col]), col
    assert np.isnan(a["boot_low"]) and np.isnan(a["boot_high"])  # smoothed bootstrap-t needs 3 seeds
    assert not a["significant"] and a["verdict"] == "" and "a verdict needs ≥ 3" in a["note"]
    pct = row(compare(data, NO_UNITS, settings(ci="percentile"), "ndcg@10"), "A")
    assert np.isnan(pct["boot_low"]) == (k < 2)  # the percentile interval needs only 2
    table = format_table(out, settings())
    assert f"n/a ({k} seed{'s' if k > 1 else ''})" in table


def test_comparison_rows_are_the_frame_typed(tmp_path):
    """The typed rows, their frame (comparisons.csv's columns) and the frame read back agree; a
    comparison without a verdict has None, not an empty word."""
    data = frame({"base": VALUES["base"], "A": VALUES["A"], "B": VALUES["B"][:2]})
    rows = comparisons(data, NO_UNITS, settings(), "ndcg@10")
    assert [r.verdict for r in rows] == [None, Verdict.BETTER, None]
    table = compare(data, NO_UNITS, settings(), "ndcg@10")
    pd.testing.assert_frame_equal(comparison_frame(rows), table)
    pd.testing.assert_frame_equal(comparison_frame(comparison_rows(table)), table)
    table.to_csv(tmp_path / "comparisons.csv", index=False)
    read = comparison_rows(pd.read_csv(tmp_path / "comparisons.csv"))
    assert [(r.variant, r.verdict, r.n_verdict, r.note) for r in read] == [
        (r.variant, r.verdict, r.n_verdict, r.note) for r in rows
    ]


def test_only_paired_seeds_count():
    data = frame({"base": VALUES["base"][:3], "A": VALUES["A"]})
    a = row(compare(data, NO_UNITS, settings(), "ndcg@10"), "A")
    assert a["n_seeds"] == 4 and a["n_paired"] == 3
    assert a["delta"] == pytest.approx(np.mean([0.02, 0.03, 0.01]))
    assert a["rel_change"] == pytest.approx(0.02 / 0.31)  # over the paired base seeds


def test_lower_is_better_flips_the_mark():
    s = settings(higher_is_better={"ndcg@10": False})
    # differences +.03, +.03, +.025, +.03: a clear increase, which is worse when lower is better
    out = compare(frame({"base": VALUES["base"], "A": [0.33, 0.35, 0.335, 0.36]}), NO_UNITS, s, "ndcg@10")
    a = row(out, "A")
    assert a["delta"] > 0 and a["significant"] and a["verdict"] == "worse"
    table = format_table(out, s)
    assert "worse ▼" in table and "▲" not in table


def test_friedman_by_hand():
    fr = friedman(frame(), "ndcg@10")
    # ranks per seed (1 = best): A 1,1,1.5,1; base 2,2.5,3,2; B 3,2.5,1.5,3
    assert fr["ranks"] == pytest.approx({"A": 1.125, "base": 2.375, "B": 2.5})
    assert list(fr["ranks"]) == ["A", "base", "B"]
    # χ² = 12/(n k (k+1)) Σ R_j² − 3 n (k+1), R = 4.5, 9.5, 10;
    # tie correction: divide by 1 − Σ(t³ − t) / (n (k³ − k)) = 1 − 2·6 / 96
    chi2 = (12 / (4 * 3 * 4) * (4.5**2 + 9.5**2 + 10**2) - 3 * 4 * 4) / (1 - 12 / (4 * 24))
    assert fr["statistic"] == pytest.approx(chi2)
    # exact p over every seed's orderings of its (mid-)ranks, not χ²'s 0.071 (tests/test_ranking.py)
    assert fr["method"] == "exact" and fr["p"] == pytest.approx(7 / 54)
    assert fr["n_seeds"] == 4 and fr["n_variants"] == 3
    # Nemenyi CD for k = 3, α = .05: q = 3.314 (Demšar 2006 lists q/√2 = 2.343)
    assert fr["cd"] == pytest.approx(2.343 * math.sqrt(3 * 4 / (6 * 4)), abs=1e-3)
    low = friedman(frame(), "ndcg@10", higher_is_better=False)
    assert low["ranks"]["A"] == pytest.approx(4 - 1.125)


def test_friedman_needs_three_variants_and_three_complete_seeds():
    assert friedman(frame({k: VALUES[k] for k in ("base", "A")}), "ndcg@10") is None
    one = frame({"base": VALUES["base"], "A": VALUES["A"][:1], "B": VALUES["B"]})
    assert friedman(one, "ndcg@10") is None
    two = frame({"base": VALUES["base"], "A": VALUES["A"][:2], "B": VALUES["B"]})
    assert friedman(two, "ndcg@10") is None  # 2 complete seeds: with 3 variants p ≥ 0.135 whatever the data


def test_bad_inputs_name_the_problem():
    with pytest.raises(AblateError, match="baseline variant 'base'"):
        compare(frame({"A": VALUES["A"]}), NO_UNITS, settings(), "ndcg@10")
    with pytest.raises(AblateError, match="test.mrr"):
        compare(frame(), NO_UNITS, settings(), "mrr")
    with pytest.raises(ValidationError, match="correction\n.*unknown correction 'bonferroni'"):
        settings(correction="bonferroni")
    with pytest.raises(ValidationError, match="ci\n.*unknown CI method 'bca'"):
        settings(ci="bca")
    with pytest.raises(ValidationError, match="calibration\n.*greater than or equal to 0"):
        settings(calibration=-1)
    assert settings(metrics=["hr@10", "ndcg@10"]).metrics == ["ndcg@10", "hr@10"]


def test_settings_travel_as_json_and_old_tags_still_read():
    s = settings(
        ci="percentile", correction="fdr_bh", higher_is_better={"ndcg@10": False}, variants=["base", "A"]
    )
    assert ReportSettings.from_json(s.model_dump_json()) == s
    # the tag as older versions wrote it: json.dumps of a plain mapping, fewer keys
    old = {
        "study": "t",
        "primary": "ndcg@10",
        "metrics": ["hr@10"],
        "baseline": "base",
        "alpha": 0.05,
        "correction": "holm",
        "bootstrap": 500,
        "higher_is_better": {"ndcg@10": True},
        "variants": ["base", "A"],
    }
    back = ReportSettings.from_json(json.dumps(old))
    assert back.metrics == ["ndcg@10", "hr@10"]
    assert (back.ci, back.calibration) == ("smoothed-bootstrap-t", 1000)
    with pytest.raises(AblateError, match=r"^report.alpha: .*less than 1"):
        ReportSettings.from_json(json.dumps({**old, "alpha": 2}))
    # the equivalence level: the family's (default) or per comparison, a closed vocabulary
    assert back.equivalence == "family"
    assert ReportSettings.from_json(json.dumps({**old, "equivalence": "per-comparison"})).equivalence == (
        "per-comparison"
    )
    with pytest.raises(AblateError, match=r"^report.equivalence: .*did you mean 'per-comparison'"):
        ReportSettings.from_json(json.dumps({**old, "equivalence": "per-comparisons"}))


def test_pairwise_by_hand():
    pairs = pairwise(frame(), settings())
    assert list(zip(pairs["a"], pairs["b"], strict=True)) == [("base", "A"), ("base", "B"), ("A", "B")]
    # differences b − a per seed: A − base = .02,.03,.01,.04; B − base = -.01,0,.01,-.02;
    # B − A = -.03,-.03,0,-.06 (mean -.03, deviations 0,0,.03,-.03 → sd = √(18e-4 / 3))
    sd_ab = math.sqrt(18e-4 / 3)
    t_ab = -0.03 / (sd_ab / 2)
    sd_base = math.sqrt(5e-4 / 3)
    p = [
        2 * st.t.sf(0.025 / (sd_base / 2), 3),
        2 * st.t.sf(0.005 / (sd_base / 2), 3),
        2 * st.t.sf(abs(t_ab), 3),
    ]
    assert pairs["delta"].tolist() == pytest.approx([0.025, -0.005, -0.03])
    assert pairs["p"].tolist() == pytest.approx(p, rel=1e-6)
    # Holm over 3 pairs: sorted p_A < p_AB < p_B → 3 p_A, max(3 p_A, 2 p_AB), max(…, p_B)
    assert p[0] < p[2] < p[1]
    holm = [3 * p[0], max(3 * p[0], 2 * p[2]), min(1, max(3 * p[0], 2 * p[2], p[1]))]
    assert pairs["p_adj"].tolist() == pytest.approx([holm[0], holm[2], holm[1]], rel=1e-6)
    assert pairs["significant"].tolist() == [h < 0.05 for h in (holm[0], holm[2], holm[1])]
    m = pairwise_matrix(pairs, ["base", "A", "B"])
    assert m.loc["A", "base"] == m.loc["base", "A"] == pytest.approx(holm[0])
    assert np.isnan(np.diag(m.to_numpy())).all()
    bh = pairwise(frame(), settings(correction="fdr_bh"))
    assert bh["p_adj"].tolist() == pytest.approx(adjust_pvalues(p, "fdr_bh"), rel=1e-6)


def test_pairwise_with_too_few_shared_seeds_is_na():
    data = frame({"base": VALUES["base"], "A": VALUES["A"], "B": VALUES["B"][:2]})
    pairs = pairwise(data, settings()).set_index(["a", "b"])
    assert pairs.loc[("base", "B"), "n_paired"] == 2 and np.isnan(pairs.loc[("base", "B"), "p_adj"])
    assert np.isnan(pairs.loc[("A", "B"), "p"]) and not pairs.loc[("A", "B"), "significant"]
    # the family is the pairs with a test: one here, so no correction
    assert pairs.loc[("base", "A"), "p_adj"] == pytest.approx(pairs.loc[("base", "A"), "p"])


def test_min_detectable_d_is_the_80_percent_power_point():
    d = min_detectable_d(5, 0.05)
    nc, crit = d * math.sqrt(5), st.t.ppf(0.975, 4)
    assert st.nct.sf(crit, 4, nc) + st.nct.cdf(-crit, 4, nc) == pytest.approx(0.8, abs=1e-6)
    from statsmodels.stats.power import TTestPower  # an independent implementation

    for k, a in [(3, 0.05), (5, 0.05 / 3), (10, 0.01)]:
        assert min_detectable_d(k, a) == pytest.approx(
            TTestPower().solve_power(nobs=k, alpha=a, power=0.8), rel=1e-3
        )
    assert min_detectable_d(3, 0.05) > min_detectable_d(5, 0.05) > min_detectable_d(10, 0.05)
    assert np.isnan(min_detectable_d(2, 0.05))

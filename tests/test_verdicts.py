"""ablate.stats.verdicts against hand computations: the interval and the verdict it gives, the
decision levels of Holm and Benjamini–Hochberg, the minimum detectable difference (noncentral t),
and the verdict columns of ``compare`` (families, duplicates, the sequential primary metric)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as st

from ablate.stats import ReportSettings, adjust_pvalues, compare
from ablate.stats.sequential import SequentialSeeds, decide_sequential
from ablate.stats.verdicts import (
    Verdict,
    decide,
    decide_family,
    decision_levels,
    equivalence_levels,
    minimum_detectable,
    tost_p,
)


def t_interval(d, level):
    """The paired t interval by its formula: mean ± t_{1−level/2, k−1} · sd / √k."""
    d = np.asarray(d, dtype=float)
    k = len(d)
    half = st.t.ppf(1 - level / 2, k - 1) * d.std(ddof=1) / math.sqrt(k)
    return d.mean() - half, d.mean() + half


def test_better_by_hand():
    d = [0.01, 0.012, 0.011]  # mean .011, sd .001
    out = decide(np.array(d), 0.05, margin=0.005)
    half = 4.302652729911275 * 0.001 / math.sqrt(3)  # t_{.975, 2} from a table: 4.3027
    assert st.t.ppf(0.975, 2) == pytest.approx(4.302652729911275)
    assert (out.ci_low, out.ci_high) == pytest.approx((0.011 - half, 0.011 + half))
    assert out.verdict is Verdict.BETTER and not out.negligible
    assert out.delta == pytest.approx(0.011) and out.n == 3 and out.level == 0.05
    assert out.p == pytest.approx(st.ttest_1samp(d, 0).pvalue)
    # the same differences with a margin wider than the interval: real, but too small to matter
    wide = decide(np.array(d), 0.05, margin=0.02)
    assert wide.verdict is Verdict.BETTER and wide.negligible
    # lower is better: the same increase is worse
    assert decide(np.array(d), 0.05, 0.005, higher_is_better=False).verdict is Verdict.WORSE


def test_equivalent_by_hand():
    d = [0.001, -0.001, 0.0005, -0.0005, 0.0]  # mean 0, sd √(2.5e-6 / 4)
    low, high = t_interval(d, 0.05)
    assert high == pytest.approx(st.t.ppf(0.975, 4) * math.sqrt(2.5e-6 / 4) / math.sqrt(5))
    out = decide(np.array(d), 0.05, margin=0.005)
    assert (out.ci_low, out.ci_high) == pytest.approx((low, high))
    assert out.verdict is Verdict.EQUIVALENT
    # a margin inside the interval: inconclusive, the interval holds 0 and reaches past ±margin
    assert decide(np.array(d), 0.05, margin=0.0005).verdict is Verdict.INCONCLUSIVE


def test_equivalence_is_tost_at_its_own_level():
    """Equivalence reads the 1 − 2e interval (two one-sided tests at e each, not e/2): its p is
    statsmodels' paired TOST p, and the interval fits inside ±margin exactly when that p < e."""
    from statsmodels.stats.weightstats import ttost_paired

    rng = np.random.default_rng(3)
    for _ in range(50):
        k, margin = int(rng.integers(3, 10)), float(rng.uniform(0.2, 2.0))
        d = rng.normal(rng.uniform(-1, 1), 1.0, k)
        out = decide(d, 0.05, margin)
        reference = ttost_paired(d, np.zeros(k), -margin, margin)[0]
        assert out.p_equivalence == pytest.approx(reference, rel=1e-9)
        half = st.t.ppf(1 - 0.05, k - 1) * d.std(ddof=1) / math.sqrt(k)  # one-sided quantile
        assert (out.eq_low, out.eq_high) == pytest.approx((d.mean() - half, d.mean() + half))
        assert (out.eq_level, out.level) == (0.05, 0.05)
        inside = -margin < out.eq_low and out.eq_high < margin
        assert inside == (out.p_equivalence < 0.05)
        assert (out.verdict is Verdict.EQUIVALENT or out.negligible) == inside
    # the 90 % interval [−.0030, +.0030] fits inside ±.0035; the 95 % one (±.0039, a/2 per side) does not
    d = np.array([0.004, -0.004, 0.002, -0.002, 0.0])
    assert tuple(t_interval(d, 0.10)) == pytest.approx((-0.00301, 0.00301), abs=1e-5)
    assert decide(d, 0.05, margin=0.0035).verdict is Verdict.EQUIVALENT
    assert t_interval(d, 0.05)[1] > 0.0035
    assert tost_p(0.0, 0.0, 4, 0.01) == 0.0 and tost_p(0.02, 0.0, 4, 0.01) == 1.0


def test_equivalence_levels_of_the_family():
    p = np.array([0.001, 0.03, 0.2, np.nan])
    # Holm over the TOST p-values: .001 ≤ .05/3, .03 > .05/2 fails, and the rest keep .05/2
    assert equivalence_levels(p, 0.05, "holm", "family")[:3] == pytest.approx([0.05 / 3, 0.025, 0.025])
    assert equivalence_levels(p, 0.05, "holm", "per-comparison")[:3] == pytest.approx([0.05] * 3)
    assert np.isnan(equivalence_levels(p, 0.05, "holm", "family")[3])
    # in a family, better/worse and equivalence have their own levels
    diffs = {"same": np.array([0.001, -0.001, 0.0005, 0.0]), "big": np.array([1.0, 1.1, 0.9, 1.05])}
    out = decide_family(diffs, 0.05, "holm", dict.fromkeys(diffs, 0.01))
    assert out["same"].verdict is Verdict.EQUIVALENT and out["big"].verdict is Verdict.BETTER
    assert out["same"].eq_level == pytest.approx(0.025) and out["big"].level == pytest.approx(0.025)
    assert out["same"].level == pytest.approx(0.05) and out["big"].eq_level == pytest.approx(0.05)
    with pytest.raises(ValueError, match="did you mean 'family'"):
        equivalence_levels(p, 0.05, "holm", "famly")


def test_too_few_or_constant_differences():
    two = decide(np.array([0.01, 0.02]), 0.05, 0.005)
    assert two.verdict is Verdict.INCONCLUSIVE and np.isnan(two.ci_low) and two.n == 2
    same = decide(np.full(3, 0.01), 0.05, 0.005)  # every seed moved by .01: the interval is .01
    assert same.verdict is Verdict.BETTER and (same.ci_low, same.ci_high) == (0.01, 0.01)
    zero = decide(np.zeros(4), 0.05, 0.005)
    assert zero.verdict is Verdict.EQUIVALENT and zero.p == 1.0


def test_decision_levels_by_hand():
    p = np.array([0.01, 0.04, 0.03, 0.2, np.nan])
    # Holm at α = .05: sorted .01 ≤ .05/4 passes; .03 > .05/3 fails, and every later one keeps .05/3
    assert decision_levels(p, 0.05, "holm")[:4] == pytest.approx([0.05 / 4, 0.05 / 3, 0.05 / 3, 0.05 / 3])
    # BH: .01 ≤ .05·1/4; .03 > .05·2/4, .04 > .05·3/4, .2 > .05: one rejection → all at 1·α/4
    assert decision_levels(p, 0.05, "fdr_bh")[:4] == pytest.approx([0.0125] * 4)
    # BH with three rejections (.01 ≤ .0125, .02 ≤ .025, .03 ≤ .0375) → 3α/4 for every one
    assert decision_levels(np.array([0.01, 0.02, 0.03, 0.5]), 0.05, "fdr_bh") == pytest.approx([0.0375] * 4)
    assert np.isnan(decision_levels(p, 0.05, "holm")[4])


@pytest.mark.parametrize("correction", ["holm", "fdr_bh"])
def test_interval_excludes_zero_exactly_when_the_adjusted_p_is_below_alpha(correction):
    """One interval, one decision: on random families the decision interval excludes 0 iff the
    corrected p-value is < α (and the p-values are scipy's paired t-test)."""
    rng = np.random.default_rng(17)
    checked = 0
    for _ in range(300):
        m, k = rng.integers(1, 8), rng.integers(3, 9)
        diffs = {f"v{i}": rng.normal(rng.choice([0.0, 0.5, 1.5]), 1.0, k) for i in range(m)}
        out = decide_family(diffs, 0.05, correction, dict.fromkeys(diffs, 0.3))
        p = [st.ttest_1samp(d, 0).pvalue for d in diffs.values()]
        assert [o.p for o in out.values()] == pytest.approx(p, rel=1e-9)
        for o, adjusted in zip(out.values(), adjust_pvalues(p, correction), strict=True):
            assert (o.ci_low > 0 or o.ci_high < 0) == (adjusted < 0.05)
            assert (o.verdict in (Verdict.BETTER, Verdict.WORSE)) == (adjusted < 0.05)
            checked += adjusted < 0.05
    assert checked > 100  # both outcomes occur


def test_family_leaves_out_comparisons_without_enough_seeds():
    diffs = {"a": np.array([0.02, 0.021, 0.019]), "b": np.array([0.01, 0.02])}
    out = decide_family(diffs, 0.05, "holm", {"a": 0.001, "b": 0.001})
    assert out["a"].level == 0.05  # a family of one: b has 2 seeds, no test
    assert np.isnan(out["b"].level) and out["b"].verdict is Verdict.INCONCLUSIVE


@pytest.mark.parametrize("k, level", [(3, 0.05), (3, 0.05 / 3), (5, 0.05 / 2), (10, 0.01), (20, 0.05)])
def test_minimum_detectable_difference_is_the_80_percent_power_point(k, level):
    sd = 0.02
    mdd = minimum_detectable(k, sd, level)
    # independent: scipy's noncentral t, df = k − 1, noncentrality Δ √k / sd
    crit, nc = st.t.ppf(1 - level / 2, k - 1), mdd / sd * math.sqrt(k)
    assert st.nct.sf(crit, k - 1, nc) + st.nct.cdf(-crit, k - 1, nc) == pytest.approx(0.8, abs=1e-6)


def test_minimum_detectable_difference_by_simulation():
    # 3 seeds at α/3 (Holm's first step over 3 variants): where statsmodels' TTestPower fails
    mdd = minimum_detectable(3, 1.0, 0.05 / 3)
    assert mdd == pytest.approx(5.6675, abs=1e-3)
    rng = np.random.default_rng(5)
    x = rng.normal(mdd, 1.0, (40_000, 3))
    t = x.mean(1) / (x.std(1, ddof=1) / math.sqrt(3))
    assert np.mean(np.abs(t) > st.t.ppf(1 - 0.05 / 6, 2)) == pytest.approx(0.8, abs=0.006)
    assert np.isnan(minimum_detectable(1, 1.0, 0.05)) and minimum_detectable(3, 0.0, 0.05) == 0.0


# -- the verdict columns of compare ----------------------------------------------------------

VALUES = {
    "base": [0.30, 0.32, 0.31, 0.33],
    "A": [0.32, 0.35, 0.32, 0.37],  # + .02, .03, .01, .04
    "same": [0.30, 0.32, 0.31, 0.33],  # the baseline's models again
    "short": [0.31, 0.33],  # 2 seeds
}


def frame(values) -> pd.DataFrame:
    rows = [
        {"variant": v, "seed": s, "differs": v, "test.ndcg@10": x, "test.hr@10": x + 0.3}
        for v, xs in values.items()
        for s, x in enumerate(xs)
    ]
    return pd.DataFrame(rows)


def settings(**kw) -> ReportSettings:
    return ReportSettings(**{"study": "t", "primary": "ndcg@10", "bootstrap": 500, **kw})


def test_compare_has_the_verdict_of_the_tested_family():
    s = settings(margin=0.005, duplicates={"same": "base"})
    out = compare(frame(VALUES), None, s, "ndcg@10").set_index("variant")
    a = out.loc["A"]
    # the family is {A}: 'same' is a duplicate, 'short' has 2 seeds; so A's level is α itself
    d = np.array([0.02, 0.03, 0.01, 0.04])
    assert a["level"] == 0.05 and (a["ci_low"], a["ci_high"]) == pytest.approx(t_interval(d, 0.05))
    assert a["p_seeds_adj"] == pytest.approx(a["p_seeds"])
    assert a["p_seeds"] == pytest.approx(st.ttest_1samp(d, 0).pvalue)
    assert a["verdict"] == "better" and a["significant"] and a["margin"] == 0.005
    assert a["mdd"] == pytest.approx(minimum_detectable(4, d.std(ddof=1), 0.05))
    assert a["sd_diff"] == pytest.approx(d.std(ddof=1)) and a["n_verdict"] == 4
    assert a["boot_low"] != a["ci_low"]  # the bootstrap interval is beside it, not it
    for v, why in (("same", "configured exactly like base"), ("short", "2 paired seeds")):
        row = out.loc[v]
        assert row["verdict"] == "" and not row["significant"] and why in row["note"]
        assert np.isnan(row["p_seeds_adj"]) and np.isnan(row["level"])
    assert out.loc["base", "verdict"] == "" and not out.loc["base", "exploratory"]
    # a relative margin: 2 % of the baseline's mean over the paired seeds
    relative = compare(frame(VALUES), None, settings(), "ndcg@10").set_index("variant")
    assert relative.loc["A", "margin"] == pytest.approx(0.02 * 0.315)
    assert relative.loc["short", "margin"] != relative.loc["short", "margin"]  # NaN: not tested


def test_secondary_metrics_are_exploratory_with_their_own_family():
    s = settings(metrics=["ndcg@10", "hr@10"])
    hr = compare(frame(VALUES), None, s, "hr@10").set_index("variant")
    assert hr["exploratory"].all()
    # 'same' (not marked a duplicate here: equivalent, p = 1) and A are the family: Holm over 2,
    # so A (p = .03 alone) is decided at .025, where its interval holds 0
    assert hr.loc["A", "level"] == pytest.approx(0.025) and hr.loc["A", "verdict"] == "inconclusive"
    assert hr.loc["same", "verdict"] == "equivalent" and hr.loc["A", "p_seeds_adj"] > 0.05


def test_sequential_primary_metric_follows_the_sequential_rule():
    rng = np.random.default_rng(3)
    seeds = 7
    values = {
        "base": list(0.3 + rng.normal(0, 0.002, seeds)),
        "clear": list(0.35 + rng.normal(0, 0.002, seeds))[:3],  # decided at the first look
        "noisy": list(0.3 + rng.normal(0.004, 0.01, seeds)),
    }
    design = {"initial": 3, "max": 7, "step": 2, "spending": "pocock"}  # stops at the first look
    s = settings(sequential=design, metrics=["ndcg@10", "hr@10"])
    out = compare(frame(values), None, s, "ndcg@10").set_index("variant")
    table = frame(values).pivot(index="seed", columns="variant", values="test.ndcg@10")
    expected = decide_sequential(
        table, "base", ["clear", "noisy"], SequentialSeeds(**design), 0.05, "holm", s.margin_for
    )
    for v in ("clear", "noisy"):
        decision = expected[v].decision
        assert out.loc[v, "verdict"] == str(decision.verdict) and out.loc[v, "level"] == decision.level
        assert out.loc[v, "n_verdict"] == decision.n and out.loc[v, "note"] == expected[v].reason
        assert np.isnan(out.loc[v, "p_seeds_adj"])  # the verdict is p_seeds < level at its look
        assert (out.loc[v, "p_seeds"] < out.loc[v, "level"]) == bool(out.loc[v, "significant"])
    assert out.loc["clear", "verdict"] == "better" and out.loc["clear", "n_verdict"] == 3
    # a secondary metric: fixed-n verdicts at every paired seed, Holm over the family
    hr = compare(frame(values), None, s, "hr@10").set_index("variant")
    assert hr.loc["noisy", "n_verdict"] == seeds and hr["exploratory"].all()
    assert not np.isnan(hr.loc["noisy", "p_seeds_adj"])

"""ablate.stats.ranking's Friedman test: exact p-values against published tables and brute-force
enumeration, Iman–Davenport beyond the exact budget, the critical-difference rule, and the
report's ranking text reconciling the rank test with the pairwise t-tests."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as st

from ablate.report import write_report
from ablate.report.figures import cd_figure
from ablate.report.text import friedman_text, pairwise_text
from ablate.stats import ReportSettings, friedman, pairwise
from ablate.stats.ranking import MIN_SEEDS_CD, exact_friedman_p, friedman_null, iman_davenport

# Exact upper-tail probabilities P(χ²_F ≥ value), no ties: Siegel (1956), Nonparametric Statistics
# for the Behavioral Sciences, Table N (from Friedman 1937); the issue quotes the first three.
# (k, n) → {χ²_F: p as printed, to its printed decimals}
SIEGEL_TABLE_N = {
    (3, 3): {6.0: "0.028", 4.667: "0.194", 2.667: "0.361", 2.0: "0.528"},
    (3, 4): {8.0: "0.0046", 6.5: "0.042", 6.0: "0.069", 4.5: "0.125", 3.5: "0.273"},
    (3, 5): {10.0: "0.00077", 8.4: "0.0085", 7.6: "0.024", 6.4: "0.039", 5.2: "0.093"},
    (4, 3): {9.0: "0.0017", 8.2: "0.017", 7.4: "0.033", 7.0: "0.054", 6.6: "0.075", 5.8: "0.148"},
}

# Critical values of M = χ²_F, the smallest value with P(M ≥ value) ≤ α ("—": none reaches α), as
# in the widely reproduced table "Critical values for the Friedman test" (k = 3–6, n = 2–20; e.g.
# https://fr.scribd.com/document/464088360/Tabla-de-Friedman-pdf). Columns: k = 3, 4, 5, 6, each
# at α = 5 % then 1 %. Rows beyond the exact budget (k = 5 over 7 seeds, k = 6 over 3) are not
# checked; one printed entry is a misprint (k = 4, n = 17, 1 %: printed 10.050, exact 11.047,
# P(M ≥ 10.05) = 0.016 > 1 %).
CRITICAL = """
2  —     —     6.000 —      7.600 8.000  9.143  9.714
3  6.000 —     7.400 9.000  8.533 10.130 9.857  11.760
4  6.500 8.000 7.800 9.600  8.800 11.200 10.290 12.710
5  6.400 8.400 7.800 9.960  8.960 11.680 10.490 13.230
6  7.000 9.000 7.600 10.200 9.067 11.870 10.570 13.620
7  7.143 8.857 7.800 10.540 9.143 12.110 10.670 13.860
8  6.250 9.000 7.650 10.500 9.200 13.200 10.710 14.000
9  6.222 9.556 7.667 10.730 9.244 12.440 10.780 14.140
10 6.200 9.600 7.680 10.680 9.280 12.480 10.800 14.230
11 6.545 9.455 7.691 10.750 9.309 12.580 10.840 14.320
12 6.500 9.500 7.700 10.800 9.333 12.600 10.860 14.380
13 6.615 9.385 7.800 10.850 9.354 12.680 10.890 14.450
14 6.143 9.143 7.714 10.890 9.371 12.740 10.900 14.490
15 6.400 8.933 7.720 10.920 9.387 12.800 10.920 14.540
16 6.500 9.375 7.800 10.950 9.400 12.800 10.960 14.570
17 6.118 9.294 7.800 10.050 9.412 12.850 10.950 14.610
18 6.333 9.000 7.733 10.930 9.422 12.890 10.950 14.630
19 6.421 9.579 7.863 11.020 9.432 12.880 11.000 14.670
20 6.300 9.300 7.800 11.100 9.400 12.920 11.000 14.660
"""
MISPRINTS = {(4, 17, 0.01)}


def frame(values: dict[str, list[float]]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {"variant": v, "seed": s, "differs": v, "test.ndcg@10": x}
            for v, xs in values.items()
            for s, x in enumerate(xs)
        ]
    )


def settings(**kw) -> ReportSettings:
    return ReportSettings(**{"study": "r", "primary": "ndcg@10", "bootstrap": 200, "calibration": 0, **kw})


def _tail(k: int, n: int, chi2: float) -> float:
    values, tail = friedman_null(k, n)
    i = int(np.argmin(np.abs(values - chi2)))
    assert values[i] == pytest.approx(chi2, abs=1e-3), "not an attainable value"
    return float(tail[i])


@pytest.mark.parametrize("design", list(SIEGEL_TABLE_N))
def test_exact_p_matches_siegel_table_n(design):
    k, n = design
    for chi2, printed in SIEGEL_TABLE_N[design].items():
        decimals = len(printed.split(".")[1])
        assert round(_tail(k, n, chi2), decimals) == pytest.approx(float(printed)), chi2


def test_exact_critical_values_match_the_published_table():
    checked = 0
    for line in CRITICAL.strip().splitlines():
        n, *cells = line.split()
        for (k, alpha), cell in zip(itertools.product((3, 4, 5, 6), (0.05, 0.01)), cells, strict=True):
            null = friedman_null(k, int(n))
            if null is None or (k, int(n), alpha) in MISPRINTS:
                continue
            values, tail = null
            reaching = values[tail <= alpha + 1e-12]
            if cell == "—":
                assert len(reaching) == 0, (k, n, alpha)
            else:
                assert reaching[0] == pytest.approx(float(cell), abs=6e-3), (k, n, alpha)
            checked += 1
    assert (
        checked >= 2 * 19 + 2 * 19 + 2 * 6 + 2 * 2 - 1
    )  # k = 3, 4 every row; k = 5 to n = 7; k = 6 to n = 3


def _brute_force(ranks: np.ndarray) -> float:
    """P(S ≥ S_obs) over every combination of each seed's orderings of its own ranks."""
    observed = (ranks.sum(axis=0) ** 2).sum()
    per_seed = [list(itertools.permutations(row)) for row in ranks]
    hits = total = 0
    for choice in itertools.product(*per_seed):
        s = (np.sum(choice, axis=0) ** 2).sum()
        hits += s >= observed - 1e-9
        total += 1
    return hits / total


@pytest.mark.parametrize(
    "k, n, ties", [(3, 3, False), (3, 4, True), (4, 3, False), (4, 3, True), (3, 5, True)]
)
def test_exact_p_equals_brute_force_enumeration(k, n, ties):
    rng = np.random.default_rng(k * 10 + n + ties)
    for _ in range(3):
        x = rng.normal(size=(n, k))
        if ties:
            x = np.round(x)
        ranks = st.rankdata(x, axis=1)
        exact = exact_friedman_p(ranks)
        assert exact == pytest.approx(_brute_force(ranks), abs=1e-12)

        def statistic(*samples, axis=-1):
            data = np.moveaxis(np.stack(samples, axis=0), 0, -1)
            return (st.rankdata(data, axis=-1).sum(axis=-2) ** 2).sum(axis=-1)

        # scipy's exhaustive permutation test (orders permuted within each seed) agrees too
        scipy_p = st.permutation_test(
            [x[:, j] for j in range(k)],
            statistic,
            permutation_type="samples",
            n_resamples=np.inf,
            alternative="greater",
            vectorized=True,
        ).pvalue
        assert exact == pytest.approx(scipy_p, abs=1e-12)


def test_three_by_three_all_alike_is_exact_028_not_chi2_050():
    fr = friedman(
        frame({"base": [0.30, 0.31, 0.32], "A": [0.33, 0.34, 0.35], "B": [0.27, 0.28, 0.29]}), "ndcg@10"
    )
    assert fr["statistic"] == pytest.approx(6.0) and fr["method"] == "exact" and not fr["ties"]
    assert fr["p"] == pytest.approx(1 / 36)  # every seed in one order: 3! / 6^3
    assert st.chi2.sf(6.0, 2) == pytest.approx(0.0498, abs=1e-4)  # what the report printed before
    text = friedman_text(fr, settings(), 3)
    assert "χ²_F = 6.00, exact p = 0.028" in text and "Iman" not in text
    assert "No critical-difference diagram" in text and f"< {MIN_SEEDS_CD}" in text


def test_ties_keep_the_exact_p_value():
    fr = friedman(
        frame({"base": [0.3, 0.3, 0.3, 0.3], "A": [0.3, 0.4, 0.5, 0.4], "B": [0.2, 0.3, 0.2, 0.1]}), "ndcg@10"
    )
    assert fr["ties"] and fr["method"] == "exact"
    ranks = np.array([[1.5, 1.5, 3], [2.5, 1, 2.5], [2, 1, 3], [2, 1, 3]])  # base, A, B; 1 = best
    assert fr["p"] == pytest.approx(_brute_force(ranks))


def test_iman_davenport_beyond_the_exact_budget():
    rng = np.random.default_rng(3)
    values = {f"v{j}": list(0.5 + 0.01 * j + rng.normal(0, 0.01, 6)) for j in range(7)}
    fr = friedman(frame(values), "ndcg@10")
    assert fr["method"] == "iman-davenport" and fr["df"] == (6, 30)
    chi2, n, k = fr["statistic"], 6, 7
    f = (n - 1) * chi2 / (n * (k - 1) - chi2)
    assert fr["f"] == pytest.approx(f) and fr["p"] == pytest.approx(st.f.sf(f, 6, 30))
    assert "Iman–Davenport F(6, 30) = " in friedman_text(fr, settings(), 7)
    assert iman_davenport(n * (k - 1), n, k) == (float("inf"), 0.0)  # every seed in one order


def test_eleven_variants_fall_back_before_the_orderings_are_built(monkeypatch):
    """11 variants have 11! orderings per seed: the exact path declines before it builds them
    (it used to allocate gigabytes and die with a MemoryError after the study trained)."""
    import ablate.stats.ranking as ranking

    built = []

    def counted(pattern):
        built.append(len(pattern))
        assert math.factorial(len(pattern)) <= ranking.EXACT_BUDGET, "orderings built past the budget"
        return itertools.permutations(pattern)

    monkeypatch.setattr(ranking.itertools, "permutations", counted)
    ranking._cached_null_sums.cache_clear()
    rng = np.random.default_rng(11)
    for k in (11, 12):
        values = {f"v{j}": list(0.5 + 0.01 * j + rng.normal(0, 0.01, 3)) for j in range(k)}
        fr = friedman(frame(values), "ndcg@10")
        assert fr["method"] == "iman-davenport" and fr["df"] == (k - 1, 2 * (k - 1))
    assert built == []


def test_iman_davenport_is_closer_to_the_exact_p_than_chi2():
    """Why the fallback is Iman–Davenport: for 4 to 6 variants, where the exact distribution runs
    out (3 variants stay exact at any seed count a study has), its p-values in the tail that
    matters (0.001–0.1) are nearer the exact ones than the χ² approximation's."""
    for k, n in ((4, 20), (4, 26), (5, 5), (5, 7), (6, 3)):
        values, tail = friedman_null(k, n)
        tail_region = (tail >= 0.001) & (tail <= 0.1)
        exact, chi2 = tail[tail_region], values[tail_region]
        f_error = np.mean(
            np.abs([iman_davenport(c, n, k)[1] / e - 1 for c, e in zip(chi2, exact, strict=True)])
        )
        chi2_error = np.mean(np.abs(st.chi2.sf(chi2, k - 1) / exact - 1))
        assert f_error < chi2_error, (k, n)
    assert friedman_null(3, 120) is not None


def _steady(n: int, gaps=(0.0, -0.02, -0.04)) -> pd.DataFrame:
    """base > A > B on every seed by steady gaps, tiny noise."""
    rng = np.random.default_rng(n)
    level = 0.5 + 0.01 * np.arange(n)
    return frame(
        {v: list(level + g + rng.normal(0, 1e-4, n)) for v, g in zip(("base", "A", "B"), gaps, strict=True)}
    )


def test_critical_difference_rule_and_figure(tmp_path):
    six = friedman(_steady(6), "ndcg@10")
    cd = 2.343 * math.sqrt(3 * 4 / (6 * 6))  # Demšar 2006: q_0.05 / √2 = 2.343 for k = 3
    assert six["cd"] == pytest.approx(cd, abs=1e-3) and six["cd_note"] is None
    assert six["ranks"] == {"base": 1.0, "A": 2.0, "B": 3.0}
    assert six["separated"] == [("base", "B")]  # gaps of 1 mean rank are under the CD of 1.35
    path = cd_figure(six, settings(), tmp_path / "cd.png")
    assert path is not None and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    three = friedman(_steady(3), "ndcg@10")
    assert three["cd"] < 2 and three["cd_note"].startswith("No critical-difference diagram")
    assert cd_figure(three, settings(), tmp_path / "none.png") is None
    # enough seeds, but a CD no rank gap can exceed (k − 1 = 2) at α = 0.001
    strict = friedman(_steady(5), "ndcg@10", alpha=0.001)
    assert strict["cd"] >= 2 and "largest possible gap" in strict["cd_note"]


def test_text_reconciles_the_rank_test_with_the_t_tests():
    s = settings()
    steady = _steady(6)
    fr, pairs = friedman(steady, "ndcg@10"), pairwise(steady, s)
    assert pairs["significant"].all()
    text = pairwise_text(pairs, s, fr)
    assert "The t-tests separate base from A; A from B, the rank test cannot" in text
    assert "ranks keep only each seed's order, not how far apart the variants are" in text

    # B always last, but by amounts that vary wildly: ranks separate base from B, the t-test cannot
    erratic = _steady(6)
    b = erratic["variant"] == "B"
    erratic.loc[b, "test.ndcg@10"] -= np.array([0.0, 0.0, 0.0, 0.0, 0.0, 1.0])
    fr, pairs = friedman(erratic, "ndcg@10"), pairwise(erratic, s)
    text = pairwise_text(pairs, s, fr)
    assert ("base", "B") in fr["separated"]
    assert "The rank test separates base from B, the t-tests do not" in text

    # 3 seeds (no diagram): the t-tests separate, the Friedman test cannot reject
    few = frame({"base": [0.50, 0.51, 0.52], "A": [0.401, 0.409, 0.4205], "B": [0.400, 0.410, 0.4195]})
    fr, pairs = friedman(few, "ndcg@10"), pairwise(few, s)
    assert fr["p"] == pytest.approx(_tail(3, 3, 4.667), abs=1e-9) and fr["p"] > 0.05
    text = pairwise_text(pairs, s, fr)
    assert "while the Friedman test does not reject" in text
    assert "cannot go below p = 0.0278" in text


def test_report_draws_the_diagram_only_with_enough_seeds(tmp_path):
    six = write_report(_steady(6), None, None, settings(), tmp_path / "six")
    assert "cd" in six and six["cd"].is_file()
    md = six["md"].read_text(encoding="utf-8")
    assert "Critical-difference diagram (Demšar 2006)" in md and "it separates base ahead of B" in md
    three = write_report(_steady(3), None, None, settings(), tmp_path / "three")
    assert "cd" not in three
    assert "No critical-difference diagram" in three["md"].read_text(encoding="utf-8")

"""The report's running text: findings, settings, the ranking and pairwise paragraphs, and the
calibration section (tests, families, simulated error rates)."""

from __future__ import annotations

import pandas as pd

from ..stats import MIN_SEEDS_TEST, ReportSettings
from .cells import isnan, mark, number, p_is, rate, too_few_seeds


def settings_text(settings: ReportSettings, family: int, seeds: int) -> list[str]:
    """The settings section: metrics, tests, correction, CI; a caveat where the CI method
    undercovers with this many seeds."""
    higher = "higher" if settings.higher(settings.primary) else "lower"
    corr = settings.correction_method.label
    method = settings.ci_method
    return [
        f"Primary metric: {settings.primary} ({higher} is better); secondary: "
        f"{', '.join(settings.metrics[1:]) or 'none'}. Baseline: {settings.baseline}.",
        "Seed test (primary): paired t-test across seeds (seeds are the replication unit; with ≤ 5 seeds "
        "an exact Wilcoxon test cannot reach p < 0.05, so Wilcoxon across seeds is only listed in "
        "comparisons.csv). Unit test: paired Wilcoxon signed-rank across evaluation units, pooled over "
        "seeds (pairs = (seed, unit) present for both variant and baseline); it is conditional on the "
        "trained models and does not see seed-to-seed variation, so it does not decide significance.",
        f"Correction: {corr} over the family of {family} comparison{'s' if family != 1 else ''} "
        f"(every variant vs. {settings.baseline}), separately per metric and per test; "
        f"the p-values shown are adjusted. Significant: adjusted seed-test p < α = {settings.alpha:g} "
        f"(▲ better, ▼ worse than the baseline).",
        f"Δ = variant − baseline, mean over paired seeds, with a {settings.confidence:.0%} "
        f"{method.label} CI over seeds ({settings.bootstrap:,} resamples, RNG seed {settings.seed}); "
        "rel. change = Δ / baseline mean; d = paired Cohen's d over seeds; "
        "P(>base) = share of (seed, unit) pairs where the variant is better (ties count half). "
        f"Too few seeds for a test (< {MIN_SEEDS_TEST}) or a CI (< {method.min_seeds}) is shown as n/a.",
    ] + (
        [
            f"With {seeds} seeds a {method.label} interval is narrower than its nominal level "
            "(it never reaches beyond the observed differences): read significance from the seed test, "
            "not from whether the CI excludes 0."
        ]
        if 1 < seeds < method.undercovers_below
        else []
    )


def findings(cmp: pd.DataFrame, settings: ReportSettings) -> str:
    """The opening line: which variants differ significantly on the primary metric."""
    higher = settings.higher(settings.primary)
    sig = cmp[cmp["significant"]]
    if sig.empty:
        return (
            f"No variant differs significantly from {settings.baseline} on {settings.primary} "
            f"(adjusted seed-test p < {settings.alpha:g})."
        )
    parts = [
        f"{r.variant} {mark(r, higher)} ({r.rel_change:+.1%}, {p_is(r.p_seeds_adj)})"
        for r in sig.itertuples(index=False)
    ]
    return f"Significant on {settings.primary}: " + "; ".join(parts) + "."


def friedman_text(fr: dict | None, settings: ReportSettings, n_variants: int) -> str:
    if fr is None:
        return (
            f"Friedman test: not available ({n_variants} variant{'s' if n_variants != 1 else ''}; "
            "needs ≥ 3 variants and ≥ 3 seeds where every variant finished)."
        )
    ranks = ", ".join(f"{v} {r:.2f}" for v, r in fr["ranks"].items())
    return (
        f"Friedman test on test {settings.primary} over {fr['n_variants']} variants × "
        f"{fr['n_seeds']} seeds: χ² = {fr['statistic']:.2f}, {p_is(fr['p'])}. "
        f"Mean ranks (1 = best): {ranks}. Nemenyi critical difference at α = {settings.alpha:g}: "
        f"{fr['cd']:.2f}."
    )


def pairwise_text(pairs: pd.DataFrame, settings: ReportSettings) -> str:
    corr = settings.correction_method.label
    tested = int(pairs["p"].notna().sum())
    sig = pairs[pairs["significant"]]
    found = (
        "none"
        if sig.empty
        else "; ".join(f"{r.b} − {r.a} = {number(r.delta, True)} ({p_is(r.p_adj)})" for r in sig.itertuples())
    )
    return (
        f"All pairs on test {settings.primary}: paired t-test across the seeds both variants have, "
        f"{corr} over the family of {tested} pair{'s' if tested != 1 else ''} with a test "
        f"({len(pairs) - tested} n/a: < {MIN_SEEDS_TEST} paired seeds); a separate family from "
        f"the comparisons with {settings.baseline}. Significant at α = {settings.alpha:g}: {found}."
    )


def calibration_text(
    cal: dict | None, settings: ReportSettings, tables: dict[str, pd.DataFrame], n_pairs: int
) -> list[str]:
    """The calibration section: which tests, α, the correction and its families, the CI, and the
    error rates ``stats.calibrate`` measured (``cal``; None: not simulated)."""
    corr = settings.correction_method.label
    method = settings.ci_method
    a = settings.alpha
    primary = tables[settings.primary]
    family = int((primary["variant"] != settings.baseline).sum())
    n_seed = sum(int(t["p_seeds"].notna().sum()) for t in tables.values())
    n_unit = sum(int(t["p_units"].notna().sum()) for t in tables.values())
    lines = [
        "Tests: paired t-test across seeds (two-sided; decides significance); Wilcoxon signed-rank "
        "across seeds (comparisons.csv); Wilcoxon signed-rank across evaluation units pooled over seeds; "
        "Friedman test over seeds × variants with the Nemenyi critical difference; pairwise paired "
        "t-tests (heatmap).",
        f"α = {a:g}; correction: {corr}. Families: {family} comparison{'s' if family != 1 else ''} with "
        f"{settings.baseline} per metric and per test; with a p-value: {n_seed} seed-test and {n_unit} "
        f"unit-test comparisons over the {len(tables)} metric{'s' if len(tables) != 1 else ''}; "
        f"{n_pairs} pair{'s' if n_pairs != 1 else ''} in the pairwise family. CIs are per comparison "
        "(not adjusted for multiplicity).",
        f"CI: {settings.confidence:.0%} {method.label} of the mean paired difference over seeds, "
        f"{settings.bootstrap:,} resamples; needs ≥ {method.min_seeds} paired seeds.",
    ]
    if cal is None:
        return lines + ["Simulation: not run (no comparison, or report.calibration = 0)."]
    k, m, n = cal["n_seeds"], cal["n_variants"], cal["comparisons"]
    lines.append(
        f"Simulation at report time, through the same code path (ablate.stats.compare with these settings, "
        f"{cal['bootstrap']} bootstrap resamples, RNG seed {settings.seed}): {n} null comparisons in "
        f"{cal['studies']} synthetic studies shaped like this one ({k} seeds × {m} variant"
        f"{'s' if m != 1 else ''} + baseline), every variant identical in distribution to the baseline "
        "(normal seed-to-seed differences; all tests and intervals are location-scale invariant, so "
        "the metric's scale does not matter)."
    )
    if k < MIN_SEEDS_TEST:
        lines.append(f"False-positive rate: {too_few_seeds(k)}: no seed test to calibrate.")
    else:
        lines += [
            f"Raw seed-test p < α: {rate(cal['fpr_raw'], n)} of null comparisons (expected {a:.0%}).",
            f"Flagged significant after {corr}: {rate(cal['fpr_adj'], n)} of null comparisons; studies with "
            f"any false positive (family-wise rate): {rate(cal['fwer'], cal['studies'])} "
            f"(≤ {a:.0%} expected).",
            f"Power: a planted effect of paired d = {cal['planted_d']:.2f} (the size a t-test at α/{m} "
            "detects "
            f"{cal['power']:.0%} of the time with {k} seeds; smaller effects are likely missed) was "
            f"flagged in {rate(cal['power_measured'], cal['planted_studies'])} of studies.",
        ]
    if isnan(cal["ci_coverage"]):
        lines.append(
            f"CI coverage: {too_few_seeds(k)}: the {method.label} interval needs ≥ {method.min_seeds} seeds."
        )
    else:
        lines.append(
            f"CI coverage: the {settings.confidence:.0%} interval contained the true Δ = 0 in "
            f"{rate(cal['ci_coverage'], n)} of null comparisons (nominal "
            f"{settings.confidence:.0%})."
        )
    lines.append(
        "Not simulated here: the unit test. Its (seed, unit) pairs are not independent "
        "replications; it is calibrated in the test suite (tests/test_calibration.py), which also "
        "shows it over-rejecting when trained models vary by seed — hence it never sets the mark."
    )
    return lines

"""The verdicts in words: the report's opening lines, each secondary metric's exploratory note,
the Methods paragraphs that say how a verdict is reached, and the calibration list (the verdicts'
error rates, simulated at report time)."""

from __future__ import annotations

import math

from ablate.report.cells import NA, against, effect, isnan, number, rate, too_few_seeds
from ablate.stats import MIN_SEEDS_TEST, ComparisonRow, ReportSettings, Verdict

# decided comparisons first in the running text
_ORDER = {Verdict.BETTER: 0, Verdict.WORSE: 1, Verdict.EQUIVALENT: 2, Verdict.INCONCLUSIVE: 3, None: 4}


def _decimals(margin: float) -> int:
    """Decimals that show the margin to two significant digits (3 for ±0.014, 0 for ±140)."""
    if isnan(margin) or margin <= 0:
        return 4
    return max(0, 1 - math.floor(math.log10(margin)))


def _short(x: float, decimals: int, signed: bool = False) -> str:
    if isnan(x):
        return NA
    return (f"{x:+.{decimals}f}" if signed else f"{x:.{decimals}f}").replace("-", "−")


def _tested(cmp: list[ComparisonRow], settings: ReportSettings) -> list[ComparisonRow]:
    return [r for r in cmp if r.variant != settings.baseline and r.verdict is not None]


def _margin_text(cmp: list[ComparisonRow], settings: ReportSettings) -> str:
    """'±0.014 (2% of base's mean)' or '±0.005' for this metric's comparisons."""
    tested = _tested(cmp, settings)
    if not tested:
        return "none (no tested comparison)"
    value = f"±{_short(tested[0].margin, _decimals(tested[0].margin))}"
    words = settings.margin_words(tested[0].metric)
    return f"{value} ({words})" if words else value


def verdict_sentence(row: ComparisonRow, settings: ReportSettings) -> str:
    """One comparison's verdict as a clause: 'post-norm is better (+0.049 [+0.036, +0.062])'."""
    v = row.variant
    if v in settings.duplicates:
        return (
            f"{v} is configured exactly like {settings.duplicates[v]}: it trains the same models; "
            "its comparison is not tested"
        )
    if row.verdict is None:
        if row.n_paired < MIN_SEEDS_TEST:
            return f"{v}: no verdict, {too_few_seeds(row.n_paired)} (a verdict needs ≥ {MIN_SEEDS_TEST})"
        return f"{v}: no verdict yet ({row.note})"
    places = _decimals(row.margin)
    margin = f"±{_short(row.margin, places)}"
    ci = f"[{_short(row.ci_low, places, True)}, {_short(row.ci_high, places, True)}]"
    shown = effect(row, lambda x, signed: _short(x, places, signed))
    estimate = f"{shown} {ci}"
    if row.verdict in (Verdict.BETTER, Verdict.WORSE):
        small = f", by less than the {margin} margin (negligible)" if row.negligible else ""
        return f"{v} is {row.verdict} ({estimate}){small}"
    if row.verdict is Verdict.EQUIVALENT:
        if not isnan(row.eq_low):  # the TOST interval it reads (older comparisons.csv: none)
            ci = f"[{_short(row.eq_low, places, True)}, {_short(row.eq_high, places, True)}]"
            estimate = f"{shown} {ci}"
        return f"{v} is equivalent within {margin} ({estimate})"
    said = f"{v}: inconclusive — its interval {ci} spans both 0 and the {margin} margin"
    if "maximum" in row.note:  # a sequential comparison that used every seed it may have
        said += f"; it stopped at the maximum of {row.n_verdict} seeds"
    if isnan(row.seeds_for_margin):
        return said
    return said + f"; ≈ {int(row.seeds_for_margin)} seeds for 80% power at Δ = {margin} (sd as observed)"


def verdict_sentences(cmp: list[ComparisonRow], settings: ReportSettings) -> list[str]:
    """Every comparison's verdict clause, decided ones first."""
    rows = [r for r in cmp if r.variant != settings.baseline]
    rows.sort(key=lambda r: _ORDER[r.verdict])
    return [verdict_sentence(r, settings) + "." for r in rows]


def headline(cmp: list[ComparisonRow], settings: ReportSettings) -> str:
    """The line above the primary metric's verdicts."""
    higher = "higher" if settings.higher(settings.primary) else "lower"
    if not any(r.variant != settings.baseline for r in cmp):
        return (
            f"Results on {settings.primary} (the primary metric; {higher} is better) of {settings.baseline} "
            "alone: the study has no other variant, so nothing is compared and no margin applies."
        )
    return (
        f"Verdicts on {settings.primary} (the primary metric; {higher} is better), each variant against "
        f"{settings.baseline}; practical margin {_margin_text(cmp, settings)}:"
    )


def exploratory_text(cmp: list[ComparisonRow], settings: ReportSettings) -> str:
    metric = cmp[0].metric
    n = len(_tested(cmp, settings))
    return (
        f"Exploratory: the verdicts on {metric} are corrected over its own family of {n} tested "
        f"comparison{'s' if n != 1 else ''}, not across the {len(settings.metrics)} metrics; read them "
        f"as leads for a study with {metric} as its primary metric, not as findings. "
        f"Margin {_margin_text(cmp, settings)}."
    )


def guarantees(settings: ReportSettings, family: int) -> list[str]:
    """The verdicts' two error guarantees on the primary metric, one sentence each."""
    a, corr = f"α = {settings.alpha:g}", settings.correction_method.label
    if settings.correction == "fdr_bh":
        differs = (
            f"False better / worse: among the comparisons called better or worse, the expected share "
            f"whose true difference is 0 is at most {a} ({corr} over the family of {family})."
        )
    else:
        differs = (
            f"False better / worse: the chance that any of the {family} comparisons with a true difference "
            f"of 0 is called better or worse is at most {a} ({corr} over the family)."
        )
    if settings.equivalence == "per-comparison":
        equivalent = (
            "False equivalence: each comparison whose true difference is at or beyond the margin is "
            f"called equivalent (or negligible) with chance at most {a} (TOST at α; not corrected over "
            "the family)."
        )
    elif settings.correction == "fdr_bh":
        equivalent = (
            "False equivalence: among the comparisons called equivalent (or negligible), the expected "
            f"share whose true difference is at or beyond the margin is at most {a} ({corr} over the "
            "family's TOST p-values)."
        )
    else:
        equivalent = (
            "False equivalence: the chance that any comparison whose true difference is at or beyond "
            f"the margin is called equivalent (or negligible) is at most {a} ({corr} over the family's "
            "TOST p-values, apart from the better / worse family)."
        )
    return [differs, equivalent]


def settings_text(settings: ReportSettings, tables: dict[str, list[ComparisonRow]]) -> list[str]:
    """The Methods paragraphs on the verdicts: metrics, how a verdict is reached, the margin, the
    MDD, and what is left out of the tables."""
    primary = tables[settings.primary]
    higher = "higher" if settings.higher(settings.primary) else "lower"
    corr = settings.correction_method.label
    family = len(_tested(primary, settings))
    eq_how = (
        f"e is α = {settings.alpha:g} for each comparison (the study's `equivalence: per-comparison`)"
        if settings.equivalence == "per-comparison"
        else f"e comes from {corr} over the family's TOST p-values (the larger of the two one-sided p's)"
    )
    lines = [
        f"Primary metric: {settings.primary} ({higher} is better); secondary, exploratory: "
        f"{', '.join(settings.metrics[1:]) or 'none'}. Baseline: {settings.baseline}.",
        f"Verdicts: each variant against {settings.baseline} on its paired per-seed differences (a seed "
        f"is one independent training run: the replication unit). better / worse (▲ / ▼): its paired t "
        f"interval at its decision level excludes 0 — the level at which its own t-test rejects exactly "
        f"when {corr} over the family of {family} tested comparison{'s' if family != 1 else ''} at "
        f"α = {settings.alpha:g} does. equivalent: two one-sided t-tests (TOST) against ±margin, each "
        f"at its equivalence level e, reject — its 1 − 2e interval lies inside the margin; {eq_how}. "
        "inconclusive: neither. A real difference inside the margin is better / worse, marked "
        "negligible.",
        *guarantees(settings, family),
        f"Intervals: the table's Δ [interval] is the interval the verdict reads — the paired t interval "
        f"at the comparison's {corr}-adjusted level, or for an equivalent verdict its TOST interval — and "
        "conf. is that interval's own confidence: the intervals do not hold their true Δ all at once "
        f"with that confidence (no simultaneous coverage). p (adj) is the {corr}-adjusted t-test "
        f"p-value, below α = {settings.alpha:g} exactly when the t interval excludes 0.",
        f"Margin: {_margin_text(primary, settings)} on {settings.primary}: a difference inside it is too "
        "small to matter. Set it in the study file's report section: `margin: 0.005` (absolute, in the "
        'metric\'s units), `margin: "1%"` (of the baseline\'s mean) or `margin: "2% of error"` (of its '
        "distance to a perfect score: 1 − mean where higher is better); without one each metric has its "
        "task's default (accuracy: 2% of error), else 2% of the mean.",
        "MDD: the minimum detectable difference, in the metric's units (and as a share of the "
        "baseline's mean): the |Δ| the comparison's t-test detects with 80% power at its seeds and "
        "level, given the observed spread of the paired differences; a true difference below it is "
        "likely missed. An inconclusive comparison says how many seeds per variant a new fixed-seed "
        "study would need for 80% power at Δ = ± the margin, with the spread of the paired differences "
        "observed here (the t-test at α/m, as `ablate plan` computes it): a plan for a new study, "
        "not a number of seeds to add to this one and read again, which would raise its error rate.",
    ]
    if settings.sequential is not None:
        lines.append(
            f"Seeds: sequential, {settings.sequential.describe()}. The primary verdicts come from the "
            "look at which each comparison stopped, read at the nominal level of that look's "
            "group-sequential boundary, so the error rates hold across looks; its table's column "
            "p (vs look level) holds the raw p-value and that level, not an adjusted p. Its Δ is "
            "the median-unbiased estimate after stopping, the naive mean beside it. Secondary "
            "metrics use every seed and are exploratory."
        )
    lines.append(
        "Not in the tables (comparisons.csv only): the per-unit (user) Wilcoxon tests pooled over "
        "seeds (p_units, p_better_units, rank_biserial), the Wilcoxon test across seeds, Cohen's d, "
        f"and the {settings.confidence:.0%} {settings.ci_method.label} interval (boot_low, "
        "boot_high). The per-unit tests treat every (seed, unit) pair as an independent observation "
        "of the same trained models: they never see how much training with another seed moves the "
        "result, so a small p there is not evidence that a difference would replicate (they "
        "over-reject on A/A comparisons)."
    )
    return lines


def calibration_text(
    cal: dict | None, settings: ReportSettings, tables: dict[str, list[ComparisonRow]], n_pairs: int
) -> list[str]:
    """The calibration section: what decides, the families, and the verdicts' error rates that
    ``stats.calibrate`` measured (``cal``; None: not simulated)."""
    a, corr = settings.alpha, settings.correction_method.label
    sizes = ", ".join(f"{len(_tested(t, settings))} on {m}" for m, t in tables.items())
    lines = [
        f"What decides: the verdicts (paired t intervals at {corr} decision levels, α = {a:g}). "
        f"Families: per metric, the tested comparisons with {settings.baseline} ({sizes}); not "
        "corrected across metrics (the secondary ones are exploratory). The "
        f"{n_pairs} pair{'s' if n_pairs != 1 else ''} of the pairwise comparison form a separate family.",
    ]
    if cal is None:
        return lines + ["Simulation: not run (no comparison, or report.calibration = 0)."]
    k, m, n = cal["n_seeds"], cal["n_variants"], cal["comparisons"]
    seeds = f"up to {k} seeds (the sequential rule)" if cal["sequential"] else f"{k} seeds"
    lines.append(
        f"Simulated at report time through the verdict code (ablate.stats.calibrate with these settings, "
        f"RNG seed {settings.seed}): studies shaped like this one on {settings.primary}, {seeds} × {m} "
        f"variant{'s' if m != 1 else ''} + baseline, the baseline's mean {number(cal['mean'])} and normal "
        f"paired differences with this study's sd {number(cal['sd'])}, so the margin "
        f"±{number(cal['margin'])} and the noise stand in this study's proportion."
    )
    if isnan(cal["false_verdict"]):
        why = too_few_seeds(k) if k < MIN_SEEDS_TEST else f"{NA} (no spread of the paired differences)"
        return lines + [f"Error rates: {why}: no verdict to calibrate."]
    return lines + [
        f"A/A, every variant identical to the baseline ({n} comparisons in {cal['studies']} studies): "
        f"called better or worse in {rate(cal['false_verdict'], n)}, {against(cal['false_verdict'], n, a)}; "
        f"studies with any: {rate(cal['familywise'], cal['studies'])}, "
        f"{against(cal['familywise'], cal['studies'], a)}; called equivalent (rightly): "
        f"{rate(cal['equivalent_null'], n)}.",
        f"False equivalence, every true Δ = ± the margin ({n} comparisons): said to lie inside the "
        f"margin (equivalent, or a negligible difference) in {rate(cal['false_equivalence'], n)}, "
        f"{against(cal['false_equivalence'], n, a)}.",
        f"Power: one variant better by Δ = {number(cal['planted_delta'])} (the MDD of a t-test at "
        f"α/{m}, {corr}'s first step, with {k} seeds) called better in "
        f"{rate(cal['power_measured'], cal['planted_studies'])} of studies "
        f"({cal['power']:.0%} expected with fixed seeds).",
        f"Coverage: the decision intervals held the true Δ in {rate(cal['coverage'], cal['coverage_n'])} "
        f"of the simulated comparisons (≥ {1 - a:.0%} expected: each is a 1 − level interval, level ≤ α).",
        "Not simulated here: the per-unit tests; tests/test_calibration.py shows them over-rejecting "
        "when trained models vary by seed, which is why they decide nothing.",
    ]

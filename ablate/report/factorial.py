"""The "Which factors matter" section of a grid study's report: per grid axis its main effect
(F-test and each level against the first, with a verdict), and the two-way interactions."""

from __future__ import annotations

import pandas as pd

from ablate.report.cells import NA, isnan, number, p_is, p_value
from ablate.report.document import Element
from ablate.stats import ReportSettings
from ablate.stats.factorial import Contrast, Factorial, Term, factorial
from ablate.stats.settings import parse_margin


def _f(term: Term, df_resid: int) -> str:
    if isnan(term.f):
        return NA
    return f"F({term.df}, {df_resid}) = {term.f:.2f}"


def _interval(c: Contrast) -> str:
    d = c.decision
    return f"{number(d.delta, True)} [{number(d.ci_low, True)}, {number(d.ci_high, True)}]"


def _verdict(c: Contrast, higher: bool) -> str:
    d = c.decision
    if d.verdict in ("better", "worse"):
        arrow = "▲" if (d.delta > 0) == higher else "▼"
        return f"{d.verdict} {arrow}" + (" (negligible)" if d.negligible else "")
    return str(d.verdict)


def _clause(c: Contrast) -> str:
    """'post is better than pre (+0.049 [+0.046, +0.052])'."""
    d = c.decision
    said = f"{c.level} is {d.verdict} than {c.reference} ({_interval(c)})"
    if d.verdict == "equivalent":
        return f"{c.level} is equivalent to {c.reference} within ±{number(d.margin)} ({_interval(c)})"
    if d.verdict == "inconclusive":
        return f"{c.level} vs {c.reference} is inconclusive ({_interval(c)}, margin ±{number(d.margin)})"
    return said + (f", by less than the ±{number(d.margin)} margin" if d.negligible else "")


def _axis_sentence(axis: str, fa: Factorial) -> str:
    main = next(t for t in fa.mains if t.axes == (axis,))
    clauses = "; ".join(_clause(c) for c in fa.contrasts if c.axis == axis)
    decided = any(c.decision.verdict in ("better", "worse") for c in fa.contrasts if c.axis == axis)
    head = f"{axis} matters" if decided else axis
    return f"{head} ({_f(main, fa.df_resid)}, {p_is(main.p)}): {clauses}."


def _interaction_sentence(term: Term, fa: Factorial, settings: ReportSettings) -> str:
    a, b = term.axes
    test = f"{_f(term, fa.df_resid)}, adjusted {p_is(term.p_adj)}"
    if isnan(term.p_adj):
        return f"{term.name}: not estimable ({test})."
    if term.p_adj < settings.alpha:
        return (
            f"{term.name}: the effect of {a} depends on the level of {b} ({test}); the main effects "
            "above average over effects that differ, so read the cells in the primary table too."
        )
    return (
        f"{term.name}: no evidence that the effect of {a} depends on the level of {b} ({test}); with "
        f"{fa.seeds} seeds a modest interaction could still go unseen."
    )


def factorial_elements(results: pd.DataFrame, settings: ReportSettings) -> list[Element]:
    """The section for a study with a ``grid:`` on the primary metric; nothing without a grid."""
    fa = factorial(results, settings)
    if fa is None:
        return []
    elements = [Element("h2", "Which factors matter")]
    if fa.problem:
        return elements + [Element("p", f"No factorial analysis: {fa.problem}.")]
    higher = settings.higher(fa.metric)
    corr = settings.correction_method.label
    spec = settings.margin_of(fa.metric)
    if isinstance(spec, str):
        share, of = parse_margin(spec)
        margin = f"{share * 100:g}% of" + (" the error (1 − mean) of" if of == "error" and higher else "")
    else:
        margin = f"±{spec:g}, not relative to"
    elements.append(
        Element(
            "p",
            f"The grid's {fa.cells} cells × {fa.seeds} seeds on test {fa.metric} ({fa.observations} trials; "
            "the baseline and named variants left out), in one linear model: each axis's main effect, "
            "every two-way interaction, and the seed as a block (OLS, statsmodels; "
            f"{fa.df_resid} residual degrees of freedom). Each level is compared with its axis's first "
            "level on marginal means (averaged over the other axes' levels and the seeds), with the "
            f"model's t interval at its decision level ({corr} over the {len(fa.contrasts)} contrasts "
            "of all axes): the interval shown is the one the verdict reads. Margin of equivalence: "
            f"{margin} the first level's marginal mean. The F-test (type II) asks whether the axis "
            "matters at all.",
        )
    )
    elements.append(Element("list", items=[_axis_sentence(a, fa) for a in fa.levels]))
    rows = []
    for axis, levels in fa.levels.items():
        main = next(t for t in fa.mains if t.axes == (axis,))
        contrasts = [c for c in fa.contrasts if c.axis == axis]
        test = f"{_f(main, fa.df_resid)}, {p_is(main.p)}"
        rows.append([axis, levels[0], number(contrasts[0].reference_mean), "reference", *[""] * 5, test])
        for c in contrasts:
            d = c.decision
            rows.append(
                [
                    "",
                    c.level,
                    number(c.mean),
                    _interval(c),
                    f"{d.delta / abs(c.reference_mean):+.1%}" if c.reference_mean else NA,
                    f"{1.0 - d.level:.1%}",
                    number(d.mdd),
                    p_value(c.p_adj),
                    _verdict(c, higher),
                    "",
                ]
            )
    headers = [
        "factor",
        "level",
        f"{fa.metric} marginal mean",
        "Δ vs first level [interval]",
        "rel. change",
        "confidence",
        "MDD (80% power)",
        f"p ({corr})",
        "verdict",
        "factor F-test (type II)",
    ]
    elements.append(Element("table", headers=headers, items=rows))
    if fa.interactions:
        elements.append(
            Element(
                "p",
                f"Two-way interactions: F-tests, {corr} over the {len(fa.interactions)} pair"
                f"{'s' if len(fa.interactions) != 1 else ''} of axes.",
            )
        )
        elements.append(
            Element("list", items=[_interaction_sentence(t, fa, settings) for t in fa.interactions])
        )
    return elements

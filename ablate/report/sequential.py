"""The report's section on sequential seeds: the design, the α each look spent, and per variant the
seeds it got, its verdict, the look that decided it and why it stopped — the decisions the driver
planned with (:meth:`.ReportSettings.sequential_standing`), recomputed from the results."""

from __future__ import annotations

import math

import pandas as pd

from ablate.report.cells import number
from ablate.report.document import Element
from ablate.stats import ReportSettings
from ablate.stats.sequential import SequentialDecision, SequentialSeeds


def per_seed_table(results: pd.DataFrame, settings: ReportSettings) -> pd.DataFrame:
    """Seed × variant of the primary test metric (absent: not trained)."""
    column = f"test.{settings.primary}"
    if results.empty or column not in results.columns:
        return pd.DataFrame(dtype=float)
    return results.pivot_table(index="seed", columns="variant", values=column, aggfunc="first")


def _verdict(s: SequentialDecision) -> str:
    return "waiting" if s.decision is None else str(s.decision.verdict)


def _interval(s: SequentialDecision, design: SequentialSeeds) -> str:
    """The effect: the median-unbiased Δ, the naive mean beside it, and the interval the verdict read
    at its look's nominal level."""
    d = s.decision
    if d is None:
        return "—"
    adjusted = s.adjusted(design)
    read = f"[{number(d.ci_low, True)}, {number(d.ci_high, True)}] at {1 - d.level:.2%}"
    if math.isnan(adjusted):
        return f"{number(d.delta, True)} {read}"
    low, high = s.adjusted_interval(design)
    return (
        f"{number(adjusted, True)} [{number(low, True)}, {number(high, True)}] at {1 - s.share:.0%}; "
        f"naive {number(d.delta, True)} {read}"
    )


def sequential_elements(results: pd.DataFrame, settings: ReportSettings) -> list[Element]:
    """The section, or nothing when the study has a fixed list of seeds."""
    design = settings.sequential
    if design is None:
        return []
    per_seed = per_seed_table(results, settings)
    standing = settings.sequential_standing(per_seed)
    trained = per_seed.notna().sum() if not per_seed.empty else pd.Series(dtype=int)
    looks, levels = design.looks(), design.spent(settings.alpha)
    method = settings.correction_method.label
    text = (
        f"Seeds were added {design.step} at a time, from {design.initial} up to {design.max} per variant, "
        f"only while a variant's comparison with {settings.baseline} on test {settings.primary} was "
        f"inconclusive; {settings.baseline} got as many seeds as any variant needed. A look is a number of "
        f"seeds ({', '.join(map(str, looks))}); once every open variant and {settings.baseline} have "
        f"them, each open comparison is decided by its paired t-test at the nominal level of its look's "
        f"boundary: a group-sequential design per comparison planned to {design.max} seeds, its "
        f"boundaries computed from the joint distribution of the looks ({design.spending}-type "
        f"Lan–DeMets α-spending; Jennison & Turnbull ch. 19), at its share of α from {method} over the "
        f"family (comparisons rejected at earlier looks pass their share on; Maurer & Bretz 2013). "
        f"Equivalent: both one-sided tests against ±margin cross their one-sided boundaries at the "
        f"equivalence share. Over all looks the chance of any false better or worse is at most "
        f"α = {settings.alpha:g}, and of calling a difference as large as the margin equivalent at most "
        f"α (tests/test_sequential.py measures both by simulation). Stopping for equivalence is "
        f"non-binding. Δ is the median-unbiased estimate by the studentized sample-mean ordering under the "
        f"looks' own t boundaries (stopping early on a large difference inflates the plain mean, shown "
        f"as naive), with its confidence interval by "
        f"the same ordering at 1 − the comparison's share of α (the interval of the effect; the "
        f"look's t interval beside it is the one the verdict read), and the level column is the "
        f"nominal level of each look's boundary at the full α (a family's later Holm steps use "
        f"their own share)."
    )
    spent = 0.0
    look_rows = []
    nominal = design.nominal(settings.alpha)
    for k, (n, level) in enumerate(zip(looks, levels, strict=True), start=1):
        spent += level
        closed = [f"{v} ({_verdict(s)})" for v, s in standing.items() if s.closed and s.look == k]
        row = [
            str(k),
            ", ".join(closed) or "—",
            str(n),
            f"{level:.4f}",
            f"{spent:.4f}",
            f"{nominal[k - 1]:.4f}",
        ]
        look_rows.append(row)
    variant_rows = [
        [
            v,
            _verdict(s),
            s.reason,
            str(int(trained.get(v, 0))),
            str(s.seeds) if s.decision is not None else "—",
            _interval(s, design),
        ]
        for v, s in standing.items()
    ]
    left_out = [
        f"{v}: configured exactly like {first}, not tested ({int(trained.get(v, 0))} seeds)"
        for v, first in settings.duplicates.items()
    ]
    return [
        Element("h2", "Sequential seeds"),
        Element("p", text),
        Element(
            "table",
            headers=["look", "decided here", "seeds", "α spent", "α spent so far", "nominal level"],
            items=look_rows,
        ),
        Element(
            "table",
            headers=[
                "variant",
                "verdict",
                "why it stopped",
                "seeds trained",
                "seeds used",
                "Δ median-unbiased [its interval]; naive Δ [the look's t interval]",
            ],
            items=variant_rows,
            left=3,
        ),
        *([Element("list", items=left_out)] if left_out else []),
    ]

"""The report's section on sequential seeds: the design, the α each look spent, and per variant the
seeds it got, its verdict, the look that decided it and why it stopped — the decisions the driver
planned with (:func:`ablate.stats.sequential.sequential_standing`), recomputed from the results."""

from __future__ import annotations

import pandas as pd

from ..stats import ReportSettings
from ..stats.sequential import SequentialDecision, sequential_standing
from .cells import number
from .document import Element


def per_seed_table(results: pd.DataFrame, settings: ReportSettings) -> pd.DataFrame:
    """Seed × variant of the primary test metric (absent: not trained)."""
    column = f"test.{settings.primary}"
    if results.empty or column not in results.columns:
        return pd.DataFrame(dtype=float)
    return results.pivot_table(index="seed", columns="variant", values=column, aggfunc="first")


def _verdict(s: SequentialDecision) -> str:
    return "waiting" if s.decision is None else str(s.decision.verdict)


def _interval(s: SequentialDecision) -> str:
    d = s.decision
    if d is None:
        return "—"
    return (
        f"{number(d.delta, True)} [{number(d.ci_low, True)}, {number(d.ci_high, True)}] at {1 - d.level:.2%}"
    )


def sequential_elements(results: pd.DataFrame, settings: ReportSettings) -> list[Element]:
    """The section, or nothing when the study has a fixed list of seeds."""
    design = settings.sequential
    if design is None:
        return []
    per_seed = per_seed_table(results, settings)
    standing = sequential_standing(per_seed, settings)
    trained = per_seed.notna().sum() if not per_seed.empty else pd.Series(dtype=int)
    looks, levels = design.looks(), design.levels(settings.alpha)
    method = settings.correction_method.label
    text = (
        f"Seeds were added {design.step} at a time, from {design.initial} up to {design.max} per variant, "
        f"only while a variant's comparison with {settings.baseline} on test {settings.primary} was "
        f"inconclusive; {settings.baseline} got as many seeds as any variant needed. A look is a number of "
        f"seeds ({', '.join(map(str, looks))}); once every open variant and {settings.baseline} have "
        f"them, each open comparison is decided by its paired t interval at the α that look spends "
        f"({design.spending}-type α-spending, Lan & DeMets 1983), {method}-corrected over the "
        f"comparisons still open, and a decided variant gets no more seeds. The looks' α add up to "
        f"α = {settings.alpha:g}, so over all looks and comparisons the chance of any false better or "
        f"worse is at most α, and a difference as large as the margin is called equivalent with chance "
        f"at most α (a union bound: conservative; tests/test_sequential.py measures both by simulation)."
    )
    spent = 0.0
    look_rows = []
    for k, (n, level) in enumerate(zip(looks, levels, strict=True), start=1):
        spent += level
        closed = [f"{v} ({_verdict(s)})" for v, s in standing.items() if s.closed and s.look == k]
        look_rows.append([str(k), ", ".join(closed) or "—", str(n), f"{level:.4f}", f"{spent:.4f}"])
    variant_rows = [
        [
            v,
            _verdict(s),
            s.reason,
            str(int(trained.get(v, 0))),
            str(s.seeds) if s.decision is not None else "—",
            _interval(s),
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
            headers=["look", "decided here", "seeds", "α spent", "α spent so far"],
            items=look_rows,
        ),
        Element(
            "table",
            headers=["variant", "verdict", "why it stopped", "seeds trained", "seeds used", "Δ [interval]"],
            items=variant_rows,
            left=3,
        ),
        *([Element("list", items=left_out)] if left_out else []),
    ]

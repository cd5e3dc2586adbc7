"""Sequential seeds: train more seeds only where a primary comparison is still inconclusive.

A study file may say ``seeds: {initial: 3, max: 20, step: 2}``. Every variant and the baseline
start with seeds 0 … initial−1; at each *look* (initial, initial+step, …, max seeds) the open
comparisons are decided (:func:`ablate.stats.verdicts.decide_family`), and only the variants still
inconclusive — and the baseline, while any is — get the next ``step`` seeds.

Error rates: look k may spend ``α_k = f(t_k) − f(t_{k−1})`` of the study's α, with ``t_k`` the
look's seeds over ``max`` and ``f`` an α-spending function (Lan & DeMets 1983: Pocock-type
``α·ln(1 + (e−1)·t)`` by default, or O'Brien–Fleming-type ``2 − 2Φ(z_{1−α/2}/√t)``). Each look
decides its open comparisons with the family correction at level ``α_k``, so by the union bound
the chance of any false *better* / *worse* over all looks and comparisons is at most Σα_k = α,
whatever the correlation between looks; the same holds for a false *equivalent* when the true
difference is at or beyond the margin. The bound is conservative (repeated t-tests on nested
samples are positively correlated); ``tests/test_sequential.py`` measures the rates by
simulation.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from statistics import NormalDist
from typing import TYPE_CHECKING

import numpy as np
from pydantic import Field, field_validator, model_validator

from ..schema import Strict, Vocabulary

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from .settings import ReportSettings
    from .verdicts import Decision

# The study-file schema holds SequentialSeeds: the verdicts (scipy, statsmodels) load on first use.
MIN_SEEDS_VERDICT = 3  # as verdicts.MIN_SEEDS_VERDICT (tests/test_sequential.py checks)
_NORMAL = NormalDist()

SPENDING: Vocabulary[Callable[[float, float], float]] = Vocabulary(
    "alpha-spending function",
    {
        "pocock": lambda t, alpha: alpha * math.log(1.0 + (math.e - 1.0) * t),
        "obrien_fleming": lambda t, alpha: (
            0.0 if t <= 0 else 2.0 - 2.0 * _NORMAL.cdf(_NORMAL.inv_cdf(1.0 - alpha / 2.0) / math.sqrt(t))
        ),
    },
)


class SequentialSeeds(Strict):
    """``seeds: {initial, max, step, spending}``: seeds 0 … max−1, added ``step`` at a time."""

    initial: int
    max: int
    step: int = Field(1, ge=1)
    spending: SPENDING.field = "pocock"

    @field_validator("initial")
    @classmethod
    def _enough_for_a_verdict(cls, value: int) -> int:
        if value < MIN_SEEDS_VERDICT:
            raise ValueError(
                f"initial must be at least {MIN_SEEDS_VERDICT} (the fewest paired seeds a verdict uses), "
                f"got {value}"
            )
        return value

    @model_validator(mode="after")
    def _initial_within_max(self) -> SequentialSeeds:
        if self.initial > self.max:
            raise ValueError(f"initial ({self.initial}) is above max ({self.max})")
        return self

    def looks(self) -> list[int]:
        """Seeds per variant at each look: initial, initial + step, …, max (always the last)."""
        counts = list(range(self.initial, self.max + 1, self.step))
        return counts if counts[-1] == self.max else [*counts, self.max]

    def seeds(self) -> list[int]:
        """Every seed a variant may get, in the order they are added."""
        return list(range(self.max))

    def levels(self, alpha: float) -> list[float]:
        """α_k each look may spend (they sum to α)."""
        spend = SPENDING[self.spending]
        spent = [float(spend(n / self.max, alpha)) for n in self.looks()]
        spent[-1] = alpha  # the last look spends what is left (f(1) = α up to rounding)
        return [b - a for a, b in zip([0.0, *spent[:-1]], spent, strict=True)]

    def describe(self) -> str:
        """One line for ``validate``, ``status`` and the report."""
        looks = ", ".join(map(str, self.looks()))
        return (
            f"{self.initial} to {self.max} seeds per variant, {self.step} at a time where a comparison is "
            f"still inconclusive (looks at {looks} seeds; {self.spending} alpha spending)"
        )


@dataclass(frozen=True)
class SequentialDecision:
    """Where a comparison stands: decided (at ``look``, with ``seeds``), or waiting for a look."""

    seeds: int  # seeds the decision (or the wait) is at
    look: int  # 1-based
    looks: int
    decision: Decision | None  # None: its look is not complete yet
    reason: str

    @property
    def closed(self) -> bool:
        from .verdicts import Verdict

        return self.decision is not None and (
            self.decision.verdict is not Verdict.INCONCLUSIVE or self.look == self.looks
        )


def decide_sequential(
    per_seed: pd.DataFrame,
    baseline: str,
    variants: list[str],
    design: SequentialSeeds,
    alpha: float,
    correction: str,
    margin_of: Callable[[float], float],
    higher_is_better: bool = True,
) -> dict[str, SequentialDecision]:
    """Each variant's standing after the looks whose seeds are all trained.

    ``per_seed`` is seed × variant of the primary metric (NaN or absent: not trained yet). A
    variant decided at an earlier look keeps that decision; one still open waits for the first look
    whose seeds it (or the baseline) lacks. ``margin_of(baseline mean at the look)`` is the margin."""
    from .verdicts import Verdict, decide_family

    looks, levels = design.looks(), design.levels(alpha)
    columns = [baseline, *(v for v in variants if v != baseline)]
    # seed × (baseline, variants) as one array: the looks below slice it (pandas lookups per look
    # and variant would dominate the calibration simulations' run time)
    table = per_seed.reindex(index=design.seeds(), columns=columns).to_numpy(dtype=float)
    column = {name: j for j, name in enumerate(columns)}
    standing: dict[str, SequentialDecision] = {}
    open_ = [v for v in variants if v != baseline]
    for k, (n, level) in enumerate(zip(looks, levels, strict=True), start=1):
        trained = np.isfinite(table[:n]).all(axis=0)
        ready = [v for v in open_ if trained[column[v]] and trained[0]]
        for v in open_:
            if v not in ready:
                waiting = f"waiting for {n} seeds (look {k})"
                if v in standing:  # inconclusive at the look before
                    waiting = f"inconclusive at {standing[v].seeds} seeds; {waiting}"
                standing[v] = SequentialDecision(n, k, len(looks), None, waiting)
        if not ready:
            break
        base = table[:n, 0]
        diffs = {v: table[:n, column[v]] - base for v in ready}
        margin = margin_of(float(np.mean(base)))
        decided = decide_family(diffs, level, correction, dict.fromkeys(ready, margin), higher_is_better)
        for v, decision in decided.items():
            if decision.verdict is not Verdict.INCONCLUSIVE:
                reason = f"{decision.verdict} at {n} seeds (look {k} of {len(looks)})"
            elif k == len(looks):
                reason = f"inconclusive at the maximum of {n} seeds"
            else:
                reason = f"inconclusive at {n} seeds: {looks[k]} next"
            standing[v] = SequentialDecision(n, k, len(looks), decision, reason)
        open_ = [v for v in ready if not standing[v].closed]  # the waiting ones stay at this look
        if not open_ or k == len(looks):
            break
    return standing


def sequential_standing(per_seed: pd.DataFrame, settings: ReportSettings) -> dict[str, SequentialDecision]:
    """:func:`decide_sequential` as the study's settings say: its design, α, correction, margin and
    the primary metric's direction, over the variants it tests (one configured exactly like another
    trains the same models and is left out, as from the report's family). The driver plans with
    this and the report shows it, so both read the same decisions."""
    tested = [v for v in settings.variants if v != settings.baseline and v not in settings.duplicates]
    return decide_sequential(
        per_seed,
        settings.baseline,
        tested,
        settings.sequential,
        settings.alpha,
        settings.correction,
        settings.margin_for,
        settings.higher(settings.primary),
    )


def seeds_wanted(
    standing: dict[str, SequentialDecision], baseline: str, design: SequentialSeeds
) -> dict[str, int]:
    """How many seeds (0 … n−1) each variant needs trained now: a closed variant the seeds it was
    decided at, an open one its next look's; the baseline as many as any variant."""
    looks = design.looks()
    wanted = {}
    for v, s in standing.items():
        if s.closed:
            wanted[v] = s.seeds
        elif s.decision is None:  # waiting for this look
            wanted[v] = s.seeds
        else:  # inconclusive before the last look: the next one
            wanted[v] = looks[s.look]
    wanted[baseline] = max([design.initial, *wanted.values()])
    return wanted

"""Sequential seeds: train more seeds only where a primary comparison is still inconclusive.

A study file may say ``seeds: {initial: 3, max: 20, step: 2}``. Every variant and the baseline
start with seeds 0 … initial−1; at each *look* (initial, initial+step, …, max seeds) the open
comparisons are decided (:func:`ablate.stats.verdicts.decide`), and only the variants still
inconclusive — and the baseline, while any is — get the next ``step`` seeds.

Error rates: a group-sequential design per comparison, planned to the maximum of ``max`` seeds.
Its boundaries come from the joint distribution of the looks (:mod:`.boundaries`): Lan–DeMets
α-spending, ``f(t)`` of the look's seeds over ``max`` (O'Brien–Fleming-type
``2 − 2Φ(z_{1−α/2}/√t)`` per side by default, or Pocock-type ``α·ln(1 + (e−1)·t)``), and a
look reads its paired t-test at a nominal level set so that the looks' t-tests together spend α as
planned (at 2 degrees of freedom the normal boundaries' levels overshoot). Better / worse: two-sided
boundaries at the comparison's share of α; equivalent: each of the two one-sided tests (TOST)
against one-sided boundaries at its equivalence share, so a difference at the margin is called
equivalent at some look with chance at most that share. Across the variants the shares come
from the study's correction over the family (Holm: α/m, α/(m−1), … with the comparisons rejected
at earlier looks leaving the family and passing on their share — Maurer & Bretz 2013's graphical
Holm for group-sequential designs, which keeps the family-wise rate; Benjamini–Hochberg the same
way, without that guarantee). Stopping for equivalence is non-binding (the efficacy boundaries
ignore it), and serves as the futility rule. ``tests/test_sequential.py`` measures the rates by simulation.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from pydantic import Field, field_validator, model_validator

from ablate.schema import Strict
from ablate.stats.spending import SPENDING

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from ablate.stats.verdicts import Decision

# The study-file schema holds SequentialSeeds: the verdicts (scipy, statsmodels) load on first use.
MIN_SEEDS_VERDICT = 3  # as verdicts.MIN_SEEDS_VERDICT (tests/test_sequential.py checks)


class SequentialSeeds(Strict):
    """``seeds: {initial, max, step, spending}``: seeds 0 … max−1, added ``step`` at a time."""

    initial: int
    max: int
    step: int = Field(1, ge=1)
    # O'Brien–Fleming-type: at 3 % noise it needs fewer trials than the fixed design of equal power
    # (0.62–0.99× under an effect, benchmarks/sequential.py); Pocock-type costs more with three
    # comparisons (0.90–1.33×)
    spending: SPENDING.field = "obrien_fleming"

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

    def spent(self, alpha: float) -> list[float]:
        """α each look may spend (they sum to α), two-sided: f(t, α/2) per side."""
        spend = SPENDING[self.spending]
        spent = [2.0 * float(spend(n / self.max, alpha / 2.0)) for n in self.looks()]
        spent[-1] = alpha  # the last look spends what is left (f(1) = α up to rounding)
        return [b - a for a, b in zip([0.0, *spent[:-1]], spent, strict=True)]

    def nominal(self, level: float, sides: int = 2) -> list[float]:
        """Each look's nominal level for its paired t-test, of the design at overall ``level``
        (two-sided, or one-sided for each of the two one-sided equivalence tests): the t-tests of
        the looks together spend the design's α (:func:`.boundaries.t_nominal_levels`)."""
        from ablate.stats.boundaries import t_nominal_levels

        return list(t_nominal_levels(tuple(self.looks()), self.spending, float(level), sides))

    def describe(self) -> str:
        """One line for ``validate``, ``status`` and the report."""
        looks = ", ".join(map(str, self.looks()))
        return (
            f"{self.initial} to {self.max} seeds per variant, {self.step} at a time where a comparison is "
            f"still inconclusive (looks at {looks} seeds; group-sequential boundaries, {self.spending}-type "
            "alpha spending)"
        )


@dataclass(frozen=True)
class SequentialDecision:
    """Where a comparison stands: decided (at ``look``, with ``seeds``), or waiting for a look."""

    seeds: int  # seeds the decision (or the wait) is at
    look: int  # 1-based
    looks: int
    decision: Decision | None  # None: its look is not complete yet
    reason: str
    share: float = math.nan  # its share of α at this look (the boundaries its t-test read)

    def adjusted(self, design: SequentialSeeds) -> float:
        """The median-unbiased Δ of a closed comparison: by the sample-mean ordering under the
        boundaries its looks read — their paired t-tests at the nominal levels of its share of α
        (:func:`.boundaries.mean_ordering_estimate`), in units of its looks' sd(d), the sd at the
        deciding look; NaN when open or without spread. Computed on demand: the simulations read
        verdicts only."""
        return self._ordered(design, (0.5,))[0]

    def adjusted_interval(self, design: SequentialSeeds) -> tuple[float, float]:
        """The 1 − share confidence interval of Δ after stopping, by the same ordering (its ends are
        the Δ at which the observed stop is at the ordering's share/2 and 1 − share/2 quantiles):
        the interval for the effect, where the look's t interval is the one the verdict read at its
        nominal level. NaN, NaN when open or without spread. It covers 95–97 % (Δ = 0.5–2 sd,
        ``benchmarks/calibration.py``); at a comparison that ran to its last look, its end on the
        side where the design would have stopped early is set by the early looks' t statistics (2
        df at 3 seeds), up to 2–3× as far from Δ as that look's t interval."""
        low, high = self._ordered(design, (self.share / 2.0, 1.0 - self.share / 2.0))
        return low, high

    def _ordered(self, design: SequentialSeeds, quantiles: tuple[float, ...]) -> list[float]:
        from scipy import special

        from ablate.stats.boundaries import mean_ordering_estimate

        d = self.decision
        if d is None or not self.closed or not math.isfinite(self.share) or not d.ci_high > d.ci_low:
            return [math.nan] * len(quantiles)
        sd = (d.ci_high - d.ci_low) / (2.0 * special.stdtrit(d.n - 1, 1.0 - d.level / 2.0)) * math.sqrt(d.n)
        seeds = tuple(design.looks())
        nominal = tuple(design.nominal(self.share, 2))
        return [
            theta * sd
            for theta in mean_ordering_estimate(seeds, nominal, self.look - 1, d.delta / sd, quantiles)
        ]

    @property
    def closed(self) -> bool:
        from ablate.stats.verdicts import Verdict

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
    equivalence: str = "family",
) -> dict[str, SequentialDecision]:
    """Each variant's standing after the looks whose seeds are all trained.

    ``per_seed`` is seed × variant of the primary metric (NaN or absent: not trained yet). A
    variant decided at an earlier look keeps that decision; one still open waits for the first look
    whose seeds it (or the baseline) lacks. ``margin_of(baseline mean at the look)`` is the margin.
    At each look the open comparisons get their shares of α from the correction over the whole
    family less the comparisons already rejected (better / worse; for the equivalence tests, those
    already said inside the margin), and read their t-tests at the nominal levels of those shares'
    boundaries (``SequentialDecision.share``, from which :meth:`SequentialDecision.adjusted` gives
    the median-unbiased Δ)."""
    from ablate.stats.corrections import CORRECTIONS
    from ablate.stats.verdicts import Verdict, decide, equivalence_levels, family_pvalues

    looks = design.looks()
    columns = [baseline, *(v for v in variants if v != baseline)]
    # seed × (baseline, variants) as one array: the looks below slice it (pandas lookups per look
    # and variant would dominate the calibration simulations' run time)
    table = per_seed.reindex(index=design.seeds(), columns=columns).to_numpy(dtype=float)
    column = {name: j for j, name in enumerate(columns)}
    standing: dict[str, SequentialDecision] = {}
    open_ = [v for v in variants if v != baseline]
    family = len(open_)
    differs, inside = 0, 0  # comparisons rejected so far: better / worse; said inside the margin
    for k, n in enumerate(looks, start=1):
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
        p, p_tost = family_pvalues(diffs, dict.fromkeys(ready, margin))

        def two_sided(shares, k=k):
            return np.array([design.nominal(a, 2)[k - 1] for a in np.atleast_1d(shares)])

        def one_sided(shares, k=k):
            return np.array([design.nominal(a, 1)[k - 1] for a in np.atleast_1d(shares)])

        shares = CORRECTIONS[correction].shares(p, alpha, family - differs, two_sided)
        eq_shares = equivalence_levels(p_tost, alpha, correction, equivalence, family - inside, one_sided)
        for i, v in enumerate(ready):
            level = float(two_sided(shares[i])[0]) if np.isfinite(shares[i]) else math.nan
            eq_level = float(one_sided(eq_shares[i])[0]) if np.isfinite(eq_shares[i]) else math.nan
            decision = decide(diffs[v], level, margin, higher_is_better, eq_level)
            if decision.verdict is not Verdict.INCONCLUSIVE:
                reason = f"{decision.verdict} at {n} seeds (look {k} of {len(looks)})"
            elif k == len(looks):
                reason = f"inconclusive at the maximum of {n} seeds"
            else:
                reason = f"inconclusive at {n} seeds: {looks[k]} next"
            standing[v] = SequentialDecision(n, k, len(looks), decision, reason, float(shares[i]))
            differs += decision.verdict in (Verdict.BETTER, Verdict.WORSE)
            inside += decision.verdict is Verdict.EQUIVALENT or decision.negligible
        open_ = [v for v in ready if not standing[v].closed]  # the waiting ones stay at this look
        if not open_ or k == len(looks):
            break
    return standing


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

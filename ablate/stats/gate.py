"""The research loop's gate: one candidate at a time against the incumbent, kept only when its
seeds say so.

Each candidate is trained at the incumbent's seeds (paired), look by look as the sequential design
(:mod:`.sequential`) adds them while the comparison is open, up to its ``max`` seeds, and tested at
the level the stream's online rule gives it (LORD++, :mod:`.online`): the false discovery rate of
the loop's keeps stays at ``alpha`` however many candidates it sees. The answers:

- **keep**: better (its interval excludes 0 on the good side) and not a proven gain smaller than the
  margin; or equivalent (TOST inside ±margin) and declared simpler;
- **revert**: worse, or equivalent (a gain inside the margin included) and not simpler;
- **undecided**: still open at its last look — reverted, its interval reported;
- **no change**: the same configuration and code as the incumbent (its key) — refused untrained;
- **failed**: a trial failed or gave a non-finite metric — recorded, the incumbent untouched.

An honest incumbent: after a keep, the new incumbent is compared on a fresh block of seeds, never on
the seeds it won with (which overstate it: the winner's curse); the keep's own Δ is also given
median-unbiased under the design (:meth:`.sequential.SequentialDecision.adjusted`).

The trainer is plugged in: ``trainer(key, seeds) → values`` (one per seed), the driver's trials in a
real loop (:mod:`ablate.drive.loop`), draws in the simulation (``benchmarks/gate.py``).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
from pydantic import Field, model_validator

from ablate.schema import Strict
from ablate.stats.online import floored, lord_level
from ablate.stats.sequential import SequentialDecision, SequentialSeeds
from ablate.stats.spending import SPENDING
from ablate.stats.verdicts import decide

Trainer = Callable[[str, list[int]], np.ndarray]
INCUMBENT, CANDIDATE = "incumbent", "candidate"


class Outcome(enum.StrEnum):
    KEEP = "keep"
    REVERT = "revert"
    UNDECIDED = "undecided"
    NO_CHANGE = "no change"
    FAILED = "failed"


class CandidateFailed(Exception):
    """A trial of the candidate (or of the incumbent's next seeds) could not give a number: one line."""


class GateSettings(Strict):
    """The loop's rules: FDR level of its keeps, the practical margin (metric units), the seeds per
    candidate (looks at initial, initial + step, …, max) and the metric's direction."""

    alpha: float = Field(0.1, gt=0.0, lt=1.0)
    margin: float = Field(gt=0.0)
    initial: int = Field(3, ge=3)
    max: int = Field(12, ge=3)
    step: int = Field(3, ge=1)
    spending: SPENDING.field = "obrien_fleming"
    higher_is_better: bool = True
    wealth: float | None = Field(None, gt=0.0)  # LORD++'s W₀ (default alpha / 2)
    # the most candidates the loop will test: LORD++'s γ spent over them (:mod:`.online`); None: an
    # unending stream, each test's level smaller
    horizon: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _coherent(self) -> GateSettings:
        if self.initial > self.max:
            raise ValueError(f"initial ({self.initial}) is above max ({self.max})")
        if self.wealth is not None and self.wealth > self.alpha:
            raise ValueError(f"wealth ({self.wealth}) is above alpha ({self.alpha})")
        return self

    @property
    def design(self) -> SequentialSeeds:
        return SequentialSeeds(initial=self.initial, max=self.max, step=self.step, spending=self.spending)


@dataclass(frozen=True)
class GateDecision:
    """One candidate's answer and the numbers behind it (metric units; Δ = candidate − incumbent)."""

    number: int  # its place in the stream, 1-based
    key: str  # what it trains (a real loop: its fingerprint)
    description: str
    outcome: Outcome
    reason: str
    incumbent: str  # the incumbent it was compared with
    simpler: bool = False
    test: int | None = None  # its test number in the online rule (None: untested)
    level: float = math.nan  # the one-sided level its "better" test was run at (α_t)
    discovery: bool = False  # kept as better: a discovery of the online rule
    seeds: list[int] = field(default_factory=list)  # paired seeds trained for it
    delta: float = math.nan
    low: float = math.nan  # the interval its last look read (two-sided, at interval_level)
    high: float = math.nan
    interval_level: float = math.nan
    delta_adjusted: float = math.nan  # median-unbiased Δ of a keep under the sequential design
    incumbent_mean: float = math.nan  # the incumbent on these seeds, with its 95 % t interval
    incumbent_low: float = math.nan
    incumbent_high: float = math.nan

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "outcome": str(self.outcome)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GateDecision:
        return cls(**{**data, "outcome": Outcome(data["outcome"])})

    def line(self) -> str:
        """One line: the answer, Δ with its interval, seeds, the level."""
        if self.test is None:
            return f"#{self.number} {self.outcome}: {self.reason}"
        return (
            f"#{self.number} {self.outcome}: {self.reason}; Δ = {self.delta:+.4g} "
            f"[{self.low:+.4g}, {self.high:+.4g}], {len(self.seeds)} seeds, tested at level {self.level:.3g}"
        )


class Gate:
    """The stream's state — its decisions in order — and the rule for the next candidate."""

    def __init__(self, settings: GateSettings, start: str, history: Sequence[GateDecision] = ()):
        self.settings, self.start = settings, start
        self.history = list(history)

    @property
    def incumbent(self) -> str:
        kept = [d.key for d in self.history if d.outcome is Outcome.KEEP]
        return kept[-1] if kept else self.start

    @property
    def block(self) -> int:
        """Each keep moves the incumbent to a fresh block of ``max`` seeds."""
        return sum(d.outcome is Outcome.KEEP for d in self.history)

    def seeds(self, n: int) -> list[int]:
        return [self.block * self.settings.max + i for i in range(n)]

    def next_level(self) -> float:
        """α_t of the next tested candidate (floored onto the boundaries' grid, :func:`.online.floored`)."""
        tests = sum(d.test is not None for d in self.history)
        found = [d.test for d in self.history if d.discovery and d.test is not None]
        return floored(
            lord_level(tests + 1, found, self.settings.alpha, self.settings.wealth, self.settings.horizon)
        )

    def consider(
        self, key: str, trainer: Trainer, description: str = "", simpler: bool = False
    ) -> GateDecision:
        """Decide the next candidate (appended to the history) with ``trainer`` for its seeds."""
        number, incumbent = len(self.history) + 1, self.incumbent
        base = GateDecision(number, key, description, Outcome.NO_CHANGE, "", incumbent, simpler)
        if key == incumbent:
            reason = "the same resolved configuration and code as the incumbent; not trained"
            return self._append(replace(base, reason=reason))
        test = sum(d.test is not None for d in self.history) + 1
        try:
            decision = judge(key, incumbent, trainer, self.settings, self.next_level(), self.seeds, simpler)
        except CandidateFailed as exc:
            return self._append(replace(base, outcome=Outcome.FAILED, reason=str(exc)))
        return self._append(replace(decision, number=number, description=description, test=test))

    def _append(self, decision: GateDecision) -> GateDecision:
        self.history.append(decision)
        return decision


def judge(
    key: str,
    incumbent: str,
    trainer: Trainer,
    settings: GateSettings,
    level: float,
    seeds_of: Callable[[int], list[int]],
    simpler: bool = False,
) -> GateDecision:
    """One candidate's sequential comparison at one-sided level ``level`` for "better": the design's
    two-sided boundaries at 2·level, so each side spends ``level`` (the equivalence tests at 2·level
    per side: they only ever revert, or keep a change declared simpler). For a family of one this is
    :func:`.sequential.decide_sequential`'s look, read here one look at a time (the simulation's
    thousands of nights would recompute every earlier look at each)."""
    design = settings.design
    looks = design.looks()
    share = min(2.0 * level, 0.5)
    two_sided, one_sided = design.nominal(share, 2), design.nominal(share, 1)
    for look, n in enumerate(looks, start=1):
        seeds = seeds_of(n)
        values = {
            name: _finite(name, trainer(k, seeds), seeds)
            for name, k in ((INCUMBENT, incumbent), (CANDIDATE, key))
        }
        diff = values[CANDIDATE] - values[INCUMBENT]
        verdict = decide(
            diff, two_sided[look - 1], settings.margin, settings.higher_is_better, one_sided[look - 1], False
        )
        standing = SequentialDecision(n, look, len(looks), verdict, "", share)
        if not standing.closed:
            continue
        outcome, reason, discovery = _answer(standing.decision, simpler, look == len(looks))
        inc = values[INCUMBENT]
        half = float(_t_half(len(inc))) * float(np.std(inc, ddof=1)) / math.sqrt(len(inc))
        d = standing.decision
        return GateDecision(
            0,
            key,
            "",
            outcome,
            f"{reason} at {n} seeds (look {look} of {len(looks)})",
            incumbent,
            simpler,
            level=level,
            discovery=discovery,
            seeds=seeds,
            delta=d.delta,
            low=d.ci_low,
            high=d.ci_high,
            interval_level=d.level,
            delta_adjusted=standing.adjusted(design) if discovery else math.nan,
            incumbent_mean=float(np.mean(inc)),
            incumbent_low=float(np.mean(inc)) - half,
            incumbent_high=float(np.mean(inc)) + half,
        )
    raise AssertionError("the last look always closes a comparison")  # pragma: no cover


def _answer(d, simpler: bool, last: bool) -> tuple[Outcome, str, bool]:
    """(outcome, why, discovery) of a closed comparison's verdict."""
    from ablate.stats.verdicts import Verdict

    inside = d.verdict is Verdict.EQUIVALENT or (d.verdict is Verdict.BETTER and d.negligible)
    if d.verdict is Verdict.BETTER and not d.negligible:
        return Outcome.KEEP, "better", True
    if inside:
        what = "equivalent" if d.verdict is Verdict.EQUIVALENT else "a real gain smaller than the margin"
        if simpler:
            return Outcome.KEEP, f"{what}, and simpler", False
        return Outcome.REVERT, f"{what}, and not simpler", False
    if d.verdict is Verdict.WORSE:
        return Outcome.REVERT, "worse", False
    return Outcome.UNDECIDED, "undecided at the budget (reverted)", False


def _t_half(n: int) -> float:
    from scipy import special

    return special.stdtrit(n - 1, 0.975)


def _finite(name: str, values: np.ndarray, seeds: list[int]) -> np.ndarray:
    values = np.asarray(values, dtype=float)
    if values.shape != (len(seeds),):
        raise CandidateFailed(f"the {name}'s trainer gave {values.size} value(s) for {len(seeds)} seed(s)")
    bad = [s for s, v in zip(seeds, values, strict=True) if not math.isfinite(v)]
    if bad:
        raise CandidateFailed(f"the {name}'s metric is not finite at seed(s) {', '.join(map(str, bad))}")
    return values

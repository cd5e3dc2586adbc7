"""How many seeds a design needs, before it runs (``ablate plan``): the chance of each verdict at
an assumed true difference Δ and noise sd(d) (the sd of one seed's paired difference).

Fixed seeds, n per variant, one comparison of a family of m:

- **better / worse** at Δ: the two-sided paired t-test at α/m — the first step of Holm and of
  Benjamini–Hochberg, so a lower bound on either's power for that comparison — rejects with the
  noncentral t's probability (df n − 1, noncentrality Δ√n / sd; :func:`.verdicts.difference_power`);
- **equivalent** at Δ: TOST at e per side (e = α/m over the family, or α per comparison) finds the
  1 − 2e interval inside ±margin: P(|mean − 0| < margin − t_{1−e, n−1} s/√n), the mean normal and
  the sample sd s a scaled χ, independent; integrated over s (scipy's ``quad``).

Sequential seeds: the chances and the expected seeds come from studies simulated through the
design's own decisions (:func:`.sequential.decide_sequential`), as the driver would reach them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from scipy import integrate, special, stats

from ablate.stats.sequential import decide_sequential, seeds_wanted
from ablate.stats.verdicts import MIN_SEEDS_VERDICT, POWER, Verdict, difference_power

if TYPE_CHECKING:  # pragma: no cover
    from ablate.stats.settings import ReportSettings

MOST_SEEDS = 10_000  # a design that needs more seeds than this: none, in practice


def equivalence_power(n: int, delta: float, sd: float, margin: float, level: float) -> float:
    """P(TOST at ``level`` per side calls ``n`` paired seeds equivalent within ±``margin``) when
    their differences are N(``delta``, ``sd``²)."""
    if n < 2 or not sd > 0:
        return float(abs(delta) < margin) if sd == 0 else float("nan")
    df, se = n - 1, sd / math.sqrt(n)
    quantile = float(special.stdtrit(df, 1.0 - level))

    def inside(u: float) -> float:  # u = χ²_{n−1}: the sample sd is sd·√(u / df)
        room = margin - quantile * se * math.sqrt(u / df)
        if room <= 0:
            return 0.0
        mass = special.ndtr((room - delta) / se) - special.ndtr((-room - delta) / se)
        return float(mass * stats.chi2.pdf(u, df))

    # beyond this u the interval is wider than the margin: no mass
    top = df * (margin / (quantile * se)) ** 2 if quantile > 0 else math.inf
    top = min(top, float(special.chdtri(df, 1e-14)))
    value, _ = integrate.quad(inside, 0.0, top, limit=200, epsabs=1e-10)
    return min(1.0, max(0.0, value))


def fewest_seeds(chance: Callable[[int], float], power: float = POWER) -> int | None:
    """The fewest seeds n ≥ 3 (a verdict's minimum) with ``chance(n)`` ≥ ``power``, ``chance``
    rising with n; None beyond :data:`MOST_SEEDS`."""
    low = high = MIN_SEEDS_VERDICT
    while chance(high) < power:  # bracket, then bisect
        if high >= MOST_SEEDS:
            return None
        low, high = high + 1, min(high * 2, MOST_SEEDS)
    while low < high:
        mid = (low + high) // 2
        low, high = (mid + 1, high) if chance(mid) < power else (low, mid)
    return high


def seeds_for_difference(effect: float, sd: float, level: float, power: float = POWER) -> int | None:
    """Seeds per variant at which the paired t-test at ``level`` detects ``effect`` with ``power``."""
    if not (sd > 0 and effect != 0 and math.isfinite(sd) and math.isfinite(level)):
        return None
    return fewest_seeds(lambda n: difference_power(n, effect, sd, level), power)


def seeds_for_equivalence(sd: float, margin: float, level: float, power: float = POWER) -> int | None:
    """Seeds per variant at which TOST at ``level`` per side calls a true Δ = 0 equivalent within
    ±``margin`` with chance ``power``."""
    if not (sd > 0 and margin > 0 and math.isfinite(sd) and math.isfinite(level)):
        return None
    return fewest_seeds(lambda n: equivalence_power(n, 0.0, sd, margin, level), power)


@dataclass(frozen=True)
class Simulated:
    """Simulated studies of one design: per study and comparison its verdict (``negligible``: a
    difference inside the margin) and the seeds it was decided at; per study its trials (every
    variant's seeds and the baseline's)."""

    verdicts: np.ndarray  # (studies, m) of Verdict
    negligible: np.ndarray  # (studies, m) bool
    seeds: np.ndarray  # (studies, m)
    trials: np.ndarray  # (studies,)

    @property
    def studies(self) -> int:
        return len(self.trials)

    def share(self, *verdicts: Verdict, column: int | None = None) -> float:
        """The share of comparisons (of one ``column``, or all) with one of ``verdicts``."""
        held = self.verdicts if column is None else self.verdicts[:, column]
        return float(np.isin(held, list(verdicts)).mean())

    def any_share(self, *verdicts: Verdict) -> float:
        """The share of studies where some comparison has one of ``verdicts``."""
        return float(np.isin(self.verdicts, list(verdicts)).any(axis=1).mean())


def simulate_sequential(
    settings: ReportSettings,
    deltas: list[float],
    sd: float | np.ndarray,
    mean: float,
    studies: int,
    seed: int = 0,
) -> Simulated:
    """``studies`` studies of ``settings.sequential`` (its α, correction, equivalence and margin
    relative to ``mean`` where it is relative), one variant per true Δ in ``deltas`` (variant −
    base, in the metric's units) with paired differences of sd ``sd`` (or each study its own, an
    array of ``studies``: a pilot's uncertain sd, :class:`.planned.Noise`): each seed's baseline and
    variants draw independent N(·, sd²/2) noise, so the comparisons share the baseline as a real
    study's do. Each study is decided on its full table of ``max`` seeds: a look reads only its
    own seeds, so this is what the driver reaches adding seeds look by look."""
    design = settings.sequential
    rng = np.random.default_rng(seed)
    names = ["base", *(f"v{i}" for i in range(len(deltas)))]
    shift = np.array([mean, *(mean + d for d in deltas)])
    scale = np.broadcast_to(np.asarray(sd, dtype=float) / math.sqrt(2.0), (studies,))
    noise = rng.normal(0.0, 1.0, (studies, design.max, len(names))) * scale[:, None, None]
    verdicts = np.empty((studies, len(deltas)), dtype=object)
    negligible = np.zeros((studies, len(deltas)), dtype=bool)
    seeds = np.zeros((studies, len(deltas)), dtype=int)
    trials = np.zeros(studies, dtype=int)
    higher = settings.higher(settings.primary)
    for s in range(studies):
        table = pd.DataFrame(shift + noise[s], columns=names)
        standing = decide_sequential(
            table,
            "base",
            names[1:],
            design,
            settings.alpha,
            settings.correction,
            settings.margin_for,
            higher,
            settings.equivalence,
        )
        for j, v in enumerate(names[1:]):
            decision = standing[v].decision
            verdicts[s, j], negligible[s, j] = decision.verdict, decision.negligible
            seeds[s, j] = standing[v].seeds
        trials[s] = sum(seeds_wanted(standing, "base", design).values())
    return Simulated(verdicts, negligible, seeds, trials)

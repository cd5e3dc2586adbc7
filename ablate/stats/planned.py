"""What ``ablate plan`` promises, computed as the study will meet it (:mod:`.power` holds the t-test's
and TOST's power and the sequential simulations).

**A pilot's sd is an estimate.** The sd of a seed's paired difference read from a pilot rests on
few degrees of freedom (2 after 3 seeds of one variant), and a plan that takes it as exact delivers
less than it promises: at 80 % promised, 59–80 % on average over pilots, and after a 3-seed pilot
5–42 % of plans under 50 % (``benchmarks/calibration.py``). Here the plan averages the power over
the sd's sampling distribution: σ² = ν s² / χ²_ν (the pilot's s on ν degrees of freedom; the
fiducial / flat-prior posterior of a normal variance), and asks for the fewest seeds whose
*expected* power is 80 %. Over pilots that realises a mean power of 80–85 % (pilots of 1 or 3
variants × 3 or 5 seeds, 1,000 each; under 50 %: 0.1–17 % of plans); upper confidence bounds of the
sd at a fixed level over- or under-shoot with ν. ν of a pilot with several variants is
Satterthwaite's for the pooled sum of squares of differences that share the baseline's seeds (their
covariance ½ σ² at equal noise): 4 rather than 6 for 3 variants × 3 seeds (:func:`pilot_df`). The
plan also says how sure it is: the chances, under the same distribution, that the power at its
seeds is at least 80 % and under 50 %.

**Equivalence from the report's own decisions.** The chance to call Δ = 0 equivalent is the share
of simulated studies — every variant at Δ = 0, the seeds' noise as above, the baseline shared —
whose comparisons :func:`.comparison.family_verdicts` (the report's function) calls equivalent. A
formula for TOST at α/m missed both ways: with one variant the t-test rejects a true Δ = 0 in 5 %
of studies, which the report calls better or worse (negligible), not equivalent (82.8 % promised,
77–78 % realised); with 3–6 variants Holm's later steps test at more than α/m (it asked for more
seeds than needed).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from scipy import stats

from ablate.stats.power import fewest_seeds, seeds_for_equivalence
from ablate.stats.verdicts import MIN_SEEDS_VERDICT, POWER, Verdict, difference_power

if TYPE_CHECKING:  # pragma: no cover
    from ablate.stats.settings import ReportSettings

_POINTS = 200  # quantiles of the sd's distribution the expected power averages over
_SEED = 20261128  # the simulated studies' generator: a plan prints the same figures every time


@dataclass(frozen=True)
class Noise:
    """The sd of a seed's paired difference: given (``df`` None, taken as exact) or a pilot's
    estimate on ``df`` degrees of freedom (σ² = df · sd² / χ²_df)."""

    sd: float
    df: float | None = None

    def sds(self) -> np.ndarray:
        """Equally likely values of σ: the midpoints of ``_POINTS`` equal slices of its distribution."""
        if self.df is None:
            return np.array([self.sd])
        q = (np.arange(_POINTS) + 0.5) / _POINTS
        return self.sd * np.sqrt(self.df / stats.chi2.ppf(q, self.df))

    def draw(self, studies: int, rng: np.random.Generator) -> np.ndarray:
        """σ for each of ``studies`` simulated studies."""
        if self.df is None:
            return np.full(studies, self.sd)
        return self.sd * np.sqrt(self.df / rng.chisquare(self.df, studies))

    def interval(self, level: float = 0.8) -> tuple[float, float]:
        """The central ``level`` interval of σ (the sd itself twice when given)."""
        if self.df is None:
            return self.sd, self.sd
        ends = stats.chi2.ppf([(1 + level) / 2, (1 - level) / 2], self.df)
        low, high = self.sd * np.sqrt(self.df / ends)
        return float(low), float(high)


def pilot_df(table: pd.DataFrame, baseline: str) -> float:
    """Satterthwaite's degrees of freedom of the pooled sum of squares of a pilot's paired
    differences (seed × variant ``table``; each variant's differences with the baseline over the
    seeds both have, at least 2), every cell with the same variance: ``(tr A)² / tr(A²)`` for the
    quadratic form ``x'Ax`` of the cells. Differences sharing the baseline's seeds are correlated,
    so the pooled sd is less certain than its Σ(n − 1) suggests."""
    cells = {(s, baseline): i for i, s in enumerate(table.index)}
    blocks = []
    for v in table.columns.drop(baseline):
        seeds = table.index[table[v].notna() & table[baseline].notna()]
        if len(seeds) < 2:
            continue
        ids = [(cells.setdefault((s, v), len(cells)), cells[(s, baseline)]) for s in seeds]
        blocks.append(ids)
    a = np.zeros((len(cells), len(cells)))
    for ids in blocks:
        k = len(ids)
        d = np.zeros((k, len(cells)))  # the differences as rows over the cells
        for r, (own, base) in enumerate(ids):
            d[r, own], d[r, base] = 1.0, -1.0
        a += d.T @ (np.eye(k) - 1.0 / k) @ d
    return float(np.trace(a) ** 2 / np.trace(a @ a)) if blocks else math.nan


def expected_power(n: int, effect: float, noise: Noise, level: float) -> float:
    """The paired t-test's power at ``n`` seeds averaged over σ (:meth:`Noise.sds`)."""
    return float(np.mean(difference_power(n, effect, noise.sds(), level)))


def seeds_for_power(effect: float, noise: Noise, level: float, power: float = POWER) -> int | None:
    """The fewest seeds whose expected power at ``effect`` is ``power`` (None: none up to 10,000)."""
    if not (noise.sd > 0 and effect != 0 and math.isfinite(noise.sd) and math.isfinite(level)):
        return None
    return fewest_seeds(lambda n: expected_power(n, effect, noise, level), power)


def how_sure(n: int, effect: float, noise: Noise, level: float) -> tuple[float, float]:
    """Under σ's distribution, P(the power at ``n`` seeds ≥ 80 %) and P(it is under 50 %)."""
    power = np.atleast_1d(difference_power(n, effect, noise.sds(), level))
    return float(np.mean(power >= POWER)), float(np.mean(power < 0.5))


def simulate_fixed(
    settings: ReportSettings,
    m: int,
    noise: Noise,
    mean: float,
    n: int,
    studies: int,
    delta: float = 0.0,
    seed: int = _SEED,
) -> np.ndarray:
    """The verdicts (studies × m) of ``studies`` fixed-seed studies of ``n`` seeds, every one of
    ``m`` variants at true Δ = ``delta``, decided by :func:`.comparison.family_verdicts` on the
    primary metric with ``settings``' α, correction, equivalence and margin. Each study draws its σ
    (:meth:`Noise.draw`) and each seed's baseline and variants independent N(·, σ²/2) noise, so the
    comparisons share the baseline as a real study's do. The draws of a smaller ``n`` are the first
    seeds of a larger one's (the search over n compares like with like)."""
    from ablate.stats.comparison import family_verdicts

    names = [settings.baseline, *(f"variant {i + 1}" for i in range(m))]
    fixed = settings.model_copy(update={"variants": names, "duplicates": {}, "sequential": None})
    rng = np.random.default_rng(seed)
    sd = noise.draw(studies, rng)
    z = rng.standard_normal((n, studies, m + 1))
    shift = np.array([mean, *([mean + delta] * m)])
    verdicts = np.empty((studies, m), dtype=object)
    for s in range(studies):
        table = pd.DataFrame(shift + z[:, s, :] * (sd[s] / math.sqrt(2.0)), columns=names)
        decided = family_verdicts(table, fixed, settings.primary, names[1:])
        verdicts[s] = [d.decision.verdict if d.decision else None for d in decided.values()]
    return verdicts


def equivalence_chance(
    settings: ReportSettings, m: int, noise: Noise, mean: float, n: int, studies: int, seed: int = _SEED + 1
) -> float:
    """The share of comparisons called equivalent when every Δ = 0 (:func:`simulate_fixed`; the
    search for seeds draws its own, ``seed`` = ``_SEED``)."""
    verdicts = simulate_fixed(settings, m, noise, mean, n, studies, seed=seed)
    return float(np.mean(verdicts == Verdict.EQUIVALENT))


def seeds_for_equivalence_simulated(
    settings: ReportSettings, m: int, noise: Noise, mean: float, margin: float, studies: int
) -> tuple[int | None, float]:
    """The fewest seeds (≥ 3) at which :func:`equivalence_chance` reaches 80 %, bisected between
    TOST's formula at α (Holm's last step) and at α/m (its first), the same draws at every n; and
    the chance at those seeds from other draws (the search's own estimate is biased up: it picks
    the first n whose draws reached 80 %)."""
    level = settings.alpha if settings.equivalence == "per-comparison" else settings.alpha / m
    # a pilot's uncertain σ asks for more: the formula at σ's upper quartile as the start
    sd = noise.sd if noise.df is None else float(noise.interval(0.5)[1])
    start = seeds_for_equivalence(sd, margin, level)
    floor = seeds_for_equivalence(noise.sd, margin, settings.alpha)  # Holm's last step: α
    if start is None:
        return None, math.nan
    chance: dict[int, float] = {}

    def at(k: int) -> float:
        if k not in chance:
            chance[k] = equivalence_chance(settings, m, noise, mean, k, studies, seed=_SEED)
        return chance[k]

    low, high = max((floor or MIN_SEEDS_VERDICT) - 1, MIN_SEEDS_VERDICT - 1), max(start, MIN_SEEDS_VERDICT)
    while at(high) < POWER:  # above the formula's: up until it is reached
        low, high = high, high + max(1, high // 4)
        if high > 4 * start + 20:  # far beyond the formula's: said as none
            return None, math.nan
    while high - low > 1:  # the fewest in (low, high] reaching it (the same draws at every n)
        mid = (low + high) // 2
        low, high = (low, mid) if at(mid) >= POWER else (mid, high)
    return high, equivalence_chance(settings, m, noise, mean, high, studies)

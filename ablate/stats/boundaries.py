"""Group-sequential boundaries from the joint distribution of the looks (Jennison & Turnbull 2000,
ch. 19), for the sequential seeds of :mod:`.sequential`.

The looks' statistics Z_1 … Z_K of one comparison are correlated: with information I_k (seeds at
look k), the score S_k = Z_k √I_k has independent increments S_k − S_{k−1} ~ N(θ ΔI_k, ΔI_k).
P(the first crossing is at look k) is an integral over the paths that stayed inside the
continuation regions of the looks before; it is computed by the standard recursion on a grid
(the density of S_{k−1} on its continuation region, convolved with the normal increment,
integrated by Simpson's rule).

Lan–DeMets α-spending: look k's boundary c_k is the one at which P(first crossing at look k)
= f(t_k) − f(t_{k−1}), t_k = I_k / I_K, with f the spending function (:data:`SPENDING`). The
verdicts read a look through its *nominal* level, the level of an ordinary test whose critical
value is c_k (two-sided 2(1 − Φ(c_k)), one-sided 1 − Φ(c_k)), applied to the look's paired
t-test: Jennison & Turnbull's significance-level approach for group-sequential t-tests (§ 3.8),
which keeps the error rates close to nominal with small samples (``tests/test_sequential.py``
measures them).

Why hand-written: scipy has no group-sequential boundaries, and its ``multivariate_normal.cdf``
(Genz's randomized quasi-Monte Carlo) is noisy under a root finder; the Python packages found
(``gsdesign`` 0.1, ``spotify-confidence``) are early ports or pull in a whole A/B-testing stack.
The recursion is about forty lines; the tests check it against Jennison & Turnbull's tables
(Pocock K = 5: c = 2.413; O'Brien–Fleming K = 5: c = 2.040) and against scipy's
``multivariate_normal.cdf``.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from scipy import optimize, special

from ablate.stats.spending import SPENDING

_GRID = 401  # points per look (odd, for Simpson's rule): crossing probabilities to ~1e-7
_ESTIMATE_GRID = 81  # the estimate's root search evaluates the recursion ~30 times: Δ to ~1e-4 sd
_TAILS = 10.0  # the grid spans the mean ± this many sd, where the region is wider


def _simpson(n: int) -> np.ndarray:
    w = np.ones(n)
    w[1:-1:2], w[2:-1:2] = 4.0, 2.0
    return w / 3.0


def _pdf(x: np.ndarray) -> np.ndarray:
    return np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)


class _Paths:
    """The sub-density of S at the last look of the paths that have not crossed yet: grid points
    and their probability mass (start: S_0 = 0 with mass 1)."""

    def __init__(self, drift: float = 0.0, points: int = _GRID):
        self.drift, self.info, self.points, self.weights = drift, 0.0, points, _simpson(points)
        self.grid, self.mass = np.zeros(1), np.ones(1)

    def exits(self, info: float, low: float, high: float) -> tuple[float, float]:
        """P(the paths still open cross above ``high`` / below ``low`` (Z scale) at ``info``)."""
        step = info - self.info
        shift, sd = self.grid + self.drift * step, math.sqrt(step)
        root = math.sqrt(info)
        above = float(self.mass @ special.ndtr((shift - high * root) / sd)) if math.isfinite(high) else 0.0
        below = float(self.mass @ special.ndtr((low * root - shift) / sd)) if math.isfinite(low) else 0.0
        return above, below

    def advance(self, info: float, low: float, high: float) -> None:
        """The paths that stay inside (low, high) (Z scale) at ``info``, as the new grid."""
        step, root = info - self.info, math.sqrt(info)
        mean = self.drift * info
        a, b = max(low * root, mean - _TAILS * root), min(high * root, mean + _TAILS * root)
        if not a < b:  # no path stays open
            self.grid, self.mass, self.info = np.zeros(1), np.zeros(1), info
            return
        grid = np.linspace(a, b, self.points)
        sd = math.sqrt(step)
        density = _pdf((grid[:, None] - self.grid[None, :] - self.drift * step) / sd) @ self.mass / sd
        self.grid, self.mass, self.info = grid, density * self.weights * (b - a) / (self.points - 1), info


def crossings(
    info: list[float], low: list[float], high: list[float], drift: float = 0.0, points: int = _GRID
) -> tuple[np.ndarray, np.ndarray]:
    """P(the first crossing is at look k, above ``high[k]`` / below ``low[k]``), Z scale, with
    E[Z_k] = drift·√I_k (±inf: no boundary on that side); ``points`` per look's grid."""
    paths, above, below = _Paths(drift, points), [], []
    for k, (i, lo, hi) in enumerate(zip(info, low, high, strict=True)):
        up, down = paths.exits(i, lo, hi)
        above.append(up)
        below.append(down)
        if k < len(info) - 1:
            paths.advance(i, lo, hi)
    return np.array(above), np.array(below)


@functools.lru_cache(maxsize=512)
def spending_bounds(info: tuple[float, ...], spending: str, level: float, sides: int) -> tuple[float, ...]:
    """Each look's critical value c_k (Z scale) of a Lan–DeMets design at overall ``level``:
    two-sided (``sides`` = 2, |Z_k| ≥ c_k, half of each look's spending per side) or one-sided
    (``sides`` = 1, Z_k ≥ c_k), the last look spending what is left. Cached: a study's looks,
    spending and the few levels its correction asks for are the same at every look."""
    spend = SPENDING[spending]
    fractions = [i / info[-1] for i in info]
    # two-sided: each side spends f(t, level / 2), as gsDesign and ldbounds do (the same for the
    # Pocock type, which is linear in the level; the O'Brien–Fleming type's is the one-sided form)
    cumulative = [sides * float(spend(t, level / sides)) for t in fractions]
    cumulative[-1] = level
    paths, bounds, spent = _Paths(), [], 0.0
    for k, i in enumerate(info):
        target = max(cumulative[k] - spent, 1e-15)

        def excess(c: float, i=i, target=target) -> float:
            up, down = paths.exits(i, -c if sides == 2 else -math.inf, c)
            return up + down - target

        c = float(optimize.brentq(excess, 0.0, 40.0, xtol=1e-10)) if excess(40.0) < 0 < excess(0.0) else 40.0
        up, down = paths.exits(i, -c if sides == 2 else -math.inf, c)
        spent += up + down
        bounds.append(c)
        paths.advance(i, -c if sides == 2 else -math.inf, c)
    return tuple(bounds)


@functools.lru_cache(maxsize=4096)
def nominal_levels(info: tuple[float, ...], spending: str, level: float, sides: int) -> tuple[float, ...]:
    """Each look's nominal level: the level of a single test whose critical value is c_k
    (two-sided: 2(1 − Φ(c_k)); one-sided: 1 − Φ(c_k))."""
    bounds = spending_bounds(info, spending, level, sides)
    return tuple(float(sides * special.ndtr(-c)) for c in bounds)


# Simulated null studies for the t-tests' levels: with both signs of each path (one-sided), the
# level's Monte Carlo error is about 3e-4 at α = .05 (and the first look's is exact)
_T_PATHS = 200_000
_T_GENERATOR_SEED = 20261126  # fixed: every run reads the same levels
_T_FEWEST_CROSSINGS = 200  # a look spending less than this many paths' worth keeps the normal level


@functools.lru_cache(maxsize=8)
def _null_t_paths(seeds: tuple[int, ...]) -> np.ndarray:
    """The paired t statistic at each look (seeds per look ``seeds``) of ``_T_PATHS`` studies whose
    per-seed differences are i.i.d. N(0, 1): [paths, looks], float32. The t statistic under
    Δ = 0 does not depend on the differences' sd, so these serve every study of these looks."""
    rng = np.random.default_rng(_T_GENERATOR_SEED)
    looks = np.array(seeds) - 1
    chunks = []
    for size in np.diff(np.r_[0:_T_PATHS:50_000, _T_PATHS]):  # bounded memory at many seeds
        x = rng.standard_normal((int(size), seeds[-1]))
        n = looks + 1.0
        total, squares = np.cumsum(x, axis=1)[:, looks], np.cumsum(x * x, axis=1)[:, looks]
        mean = total / n
        sd = np.sqrt(np.maximum(squares - n * mean * mean, 1e-300) / (n - 1.0))
        chunks.append((mean / (sd / np.sqrt(n))).astype(np.float32))
    return np.concatenate(chunks)


@functools.lru_cache(maxsize=4096)
def t_nominal_levels(seeds: tuple[int, ...], spending: str, level: float, sides: int) -> tuple[float, ...]:
    """Each look's nominal level for the look's paired t-test (n_k − 1 degrees of freedom), such
    that the t-tests of all looks together spend the design's α as planned: look k's critical
    value is set on simulated null studies (:func:`_null_t_paths`) so that P(first crossing at
    look k) = f(t_k) − f(t_{k−1}), the same spending as :func:`spending_bounds`.

    Why not the normal boundaries' nominal levels (Jennison & Turnbull § 3.8): at a 3-seed first
    look (2 degrees of freedom) the looks' t statistics are less correlated than the normal
    recursion assumes, and together they crossed more often than planned — with the seeds 3, 5, …,
    11 and α = .05, 5.7 % (Pocock-type) and 5.4 % (O'Brien–Fleming-type) of 400,000 simulated null
    studies. With these levels the rate is α up to the simulation error (``tests/test_sequential.py``).
    The first look's level is exact (nothing before it); a look that spends less than
    ``_T_FEWEST_CROSSINGS`` paths' worth keeps the normal boundary's level (its α is negligible)."""
    paths = _null_t_paths(seeds)
    statistic = np.abs(paths) if sides == 2 else np.concatenate([paths, -paths])
    count = len(statistic)
    spend = SPENDING[spending]
    cumulative = [sides * float(spend(n / seeds[-1], level / sides)) for n in seeds]
    cumulative[-1] = level
    normal = nominal_levels(tuple(float(n) for n in seeds), spending, level, sides)
    still_open, spent, levels = np.ones(count, dtype=bool), 0.0, []
    for k, n in enumerate(seeds):
        target = max(cumulative[k] - spent, 0.0)
        if k == 0 or target * count < _T_FEWEST_CROSSINGS:  # the first look: the spending's share
            nominal = normal[k]
        else:
            values = np.sort(statistic[still_open, k])
            rank = min(round(target * count), len(values))
            nominal = float(sides * special.stdtr(n - 1, -float(values[-rank])))
        critical = float(-special.stdtrit(n - 1, nominal / sides)) if nominal > 0 else math.inf
        crossed = still_open & (statistic[:, k] >= critical)
        spent += float(crossed.sum()) / count
        still_open &= ~crossed
        levels.append(nominal)
    return tuple(levels)


def stagewise_estimate(
    info: tuple[float, ...],
    bounds: tuple[float, ...],
    look: int,
    z: float,
    seeds_scale: float,
    quantile: float = 0.5,
) -> float:
    """The θ at which P_θ(crossing the upper boundary before ``look`` (0-based), or reaching it
    with Z ≥ z) = ``quantile``, under the two-sided boundaries ``bounds``: the stage-wise ordering
    of Jennison & Turnbull § 8.4. ``quantile`` 1/2 gives the median-unbiased estimate after
    stopping at ``look`` with statistic ``z``; γ/2 and 1 − γ/2 the ends of its 1 − γ confidence
    interval (exact under the ordering, where the naive t interval of a look that stopped early
    covers less). ``seeds_scale`` turns θ (the drift per √information) into the metric's units
    (sd(d) for information in seeds). Stopping for equivalence is not in the ordering (it is
    non-binding: the boundaries ignore it)."""
    info = info[: look + 1]

    def above(theta: float) -> float:
        low = [-c for c in bounds[:look]] + [-math.inf]
        high = [*bounds[:look], z]
        up, _ = crossings(list(info), low, high, theta, _ESTIMATE_GRID)
        return float(up.sum()) - quantile

    root = math.sqrt(info[-1])
    guess = z / root
    lo, hi = guess - 10.0 / root, guess + 10.0 / root
    if not above(lo) < 0 < above(hi):
        return guess * seeds_scale
    return float(optimize.brentq(above, lo, hi, xtol=1e-6)) * seeds_scale


def median_unbiased(
    info: tuple[float, ...], bounds: tuple[float, ...], look: int, z: float, seeds_scale: float
) -> float:
    """The median-unbiased estimate of θ after stopping at ``look`` with statistic ``z``
    (:func:`stagewise_estimate` at 1/2)."""
    return stagewise_estimate(info, bounds, look, z, seeds_scale, 0.5)

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


# Paths of the estimate after stopping: its simulation error about 0.005 sd (√(¼ / paths) over the
# ordering's slope, ≥ 0.7 per sd at 3 seeds), against 0.3–0.6 sd of the estimate's own spread at
# 3–11 seeds; 13 ms an estimate with its interval
_ESTIMATE_PATHS = 20_000


@functools.lru_cache(maxsize=8)
def _null_mean_paths(seeds: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """The mean and the standard error of the mean at each look (seeds per look ``seeds``) of
    ``_ESTIMATE_PATHS`` studies whose per-seed differences are i.i.d. N(0, 1): two [paths, looks]
    arrays. A study at drift θ (in sd units) has the means ``mean + θ`` and the same errors."""
    rng = np.random.default_rng(_T_GENERATOR_SEED + 1)
    looks = np.array(seeds) - 1
    x = rng.standard_normal((_ESTIMATE_PATHS, seeds[-1]))
    n = looks + 1.0
    total, squares = np.cumsum(x, axis=1)[:, looks], np.cumsum(x * x, axis=1)[:, looks]
    mean = total / n
    sd = np.sqrt(np.maximum(squares - n * mean * mean, 1e-300) / (n - 1.0))
    return mean, sd / np.sqrt(n)


def mean_ordering_estimate(
    seeds: tuple[int, ...],
    nominal: tuple[float, ...],
    look: int,
    observed: float,
    quantiles: tuple[float, ...],
) -> list[float]:
    """After a sequential stop at ``look`` (0-based) with mean difference ``observed`` (in units of
    the sample sd of that look's differences), the θ (the same units) at which
    P_θ(the stopped study's t statistic against θ ≥ the observed one against θ) = q, for each q in
    ``quantiles`` (θ rising with q): the sample-mean ordering of Emerson & Fleming (1990; Jennison &
    Turnbull § 8.4), studentized, under the boundaries the looks actually read — each look's paired
    t-test at its two-sided ``nominal`` level on ``seeds`` seeds — with the stopping look's
    distribution simulated on null paths shifted by θ (:func:`_null_mean_paths`). q = 1/2 gives the
    median-unbiased estimate, share/2 and 1 − share/2 the ends of its 1 − share interval; with a
    single look they are the mean and its t interval.

    Why this ordering and not the stage-wise one of normal statistics with a known sd: the looks
    stop on t statistics, whose size at 3–5 seeds depends on the sample sd as much as on the mean,
    so a study that stops early has a small sd more often than a large mean, and the stage-wise
    ordering corrected for an inflation the t-tests do not cause — median error −0.07 to −0.16 sd
    after Pocock-type stops at Δ = 1–2 sd (600 studies each; with the t boundaries' levels in it
    still −0.04 to −0.15). Ordering by the studentized mean on t paths: within Monte-Carlo error of 0
    for both spendings, its interval covering 95–97 % (``benchmarks/calibration.py``). Stopping for
    equivalence is not in it (non-binding: the boundaries ignore it)."""
    thetas, share = _ordering(tuple(seeds), tuple(nominal), look, float(observed))
    # the first θ at which the share reaches q (the share rises from 0 to 1 with θ)
    return [float(thetas[min(int(np.searchsorted(share, q)), len(thetas) - 1)]) for q in quantiles]


@functools.lru_cache(maxsize=64)
def _ordering(
    seeds: tuple[int, ...], nominal: tuple[float, ...], look: int, observed: float
) -> tuple[np.ndarray, np.ndarray]:
    """P_θ(the ordering's event) of :func:`mean_ordering_estimate` as a step function of θ: its
    rising steps (sorted θ) and the share of paths in the event at each. A path at θ stops at the
    first look j where |mean_j + θ| ≥ c_j se_j, which holds off an interval of θ; so the θ at which
    it stops at look j form at most two intervals, and the event (its t statistic at that look ≥
    the observed one against θ: θ ≥ observed − t_j / √n) cuts each to one. Every path's event is a
    union of at most 2K intervals, whose ends, sorted, give P_θ at every θ at once (a root search
    recomputing every path's stop at each trial θ took 7× as long). Cached: the estimate and its
    interval read the same function."""
    mean, se = _null_mean_paths(seeds)
    critical = np.array(
        [
            special.stdtrit(n - 1, 1.0 - a / 2.0) if a > 0 else np.inf
            for n, a in zip(seeds, nominal, strict=True)
        ]
    )
    reach = critical * se  # stops at j: θ ≥ reach_j − mean_j or θ ≤ −reach_j − mean_j
    above, below = reach - mean, -reach - mean
    after = observed - mean / se / math.sqrt(seeds[look])  # the event at j: θ ≥ after_j
    starts, ends = [], []
    low = np.full(len(mean), -np.inf)  # still open before look j: θ in (low, high)
    high = np.full(len(mean), np.inf)
    last = len(seeds) - 1
    for j in range(len(seeds)):
        pieces = (
            [(low, high)]
            if j == last
            else [(low, np.minimum(high, below[:, j])), (np.maximum(low, above[:, j]), high)]
        )
        for a, b in pieces:
            a = np.maximum(a, after[:, j])
            kept = a < b
            starts.append(a[kept])
            ends.append(b[kept])
        low, high = np.maximum(low, below[:, j]), np.minimum(high, above[:, j])
    start, end = np.sort(np.concatenate(starts)), np.concatenate(ends)
    end = np.sort(end[np.isfinite(end)])
    # the share at each start: the intervals begun by then less those ended (it peaks at starts)
    share = (np.arange(1, len(start) + 1) - np.searchsorted(end, start, side="right")) / len(mean)
    thetas = start
    return thetas, np.maximum.accumulate(share)

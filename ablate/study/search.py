"""The search space of a study (``search:``): dimension types, the sampler and pruner, budgets.

Search trials tune each variant with the same budget before its seeds are trained
(:mod:`ablate.drive`); here is what a space is, how it is checked before any training, how many
trials a variant gets and in which order a grid is visited.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field

from ablate.schema import Strict, Vocabulary

if TYPE_CHECKING:  # pragma: no cover
    import optuna


def _bounds_problem(low: float, high: float, log: bool) -> str | None:
    if low > high:
        return f"low ({low}) is above high ({high})"
    if log and low <= 0:
        return f"a log range needs bounds > 0 (got low={low})"
    return None


class FloatRange(Strict):
    type: Literal["float"]
    low: float
    high: float
    log: bool = False
    step: float | None = Field(None, gt=0)

    def suggest(self, trial: optuna.Trial, key: str) -> float:
        return trial.suggest_float(key, self.low, self.high, step=self.step, log=self.log)

    def values(self) -> list[Any]:
        """Values that must all be valid: both bounds."""
        return [self.low, self.high]

    def grid_points(self) -> list[float]:
        """Every value a grid search visits (the check makes sure there is a step)."""
        count = int(round((self.high - self.low) / self.step)) + 1
        points = [self.low + i * self.step for i in range(count)]
        # A point a rounding error above high is kept; one past it (a step not dividing the range) is not.
        return [p for p in points if p <= self.high + 1e-12]

    def check(self, grid: bool) -> str | None:
        """What is wrong with this range (``grid``: the grid sampler visits it), or None."""
        problem = _bounds_problem(self.low, self.high, self.log)
        if problem is None and self.log and self.step is not None:
            problem = "a log range takes no step"
        if problem is None and grid and self.step is None:
            problem = "grid search over a float range needs a step"
        return problem


# An integer range this short is checked point by point before any training.
CHECKED_POINTS = 16


class IntRange(Strict):
    type: Literal["int"]
    low: int
    high: int
    log: bool = False
    step: int = Field(1, gt=0)

    def suggest(self, trial: optuna.Trial, key: str) -> int:
        return trial.suggest_int(key, self.low, self.high, step=self.step, log=self.log)

    def values(self) -> list[Any]:
        """Values that must all be valid: every one of a short range (``heads`` from 1 to 8: 3
        may not divide ``dim``), else both bounds."""
        points = range(self.low, self.high + 1, self.step)
        return list(points) if len(points) <= CHECKED_POINTS else [self.low, self.high]

    def grid_points(self) -> list[int]:
        return list(range(self.low, self.high + 1, self.step))

    def check(self, grid: bool) -> str | None:
        """What is wrong with this range, or None."""
        return _bounds_problem(self.low, self.high, self.log)


class Categorical(Strict):
    type: Literal["categorical"]
    choices: list[Any]

    def suggest(self, trial: optuna.Trial, key: str) -> Any:
        return trial.suggest_categorical(key, self.choices)

    def values(self) -> list[Any]:
        """Values that must all be valid: every choice."""
        return list(self.choices)

    def grid_points(self) -> list[Any]:
        return list(self.choices)

    def check(self, grid: bool) -> str | None:
        """What is wrong with these choices, or None."""
        return None if self.choices else "an empty categorical: give at least one choice"


Dimension = Annotated[FloatRange | IntRange | Categorical, Field(discriminator="type")]
SEARCH_ROOTS = ("model", "train")


def _optuna():
    """Optuna, imported when a search starts rather than whenever a study file is read."""
    import optuna

    return optuna


@dataclass(frozen=True)
class Sampler:
    """``make(seed)``: the Optuna sampler; ``grid``: every grid point is enqueued in a seeded
    order (:func:`grid_order`) instead of being sampled, so the budget defaults to the grid's size."""

    make: Callable[[int], optuna.samplers.BaseSampler]
    grid: bool = False


SAMPLERS: Vocabulary[Sampler] = Vocabulary(
    "sampler",
    {
        "tpe": Sampler(lambda seed: _optuna().samplers.TPESampler(seed=seed)),
        "random": Sampler(lambda seed: _optuna().samplers.RandomSampler(seed=seed)),
        # The points are enqueued: the sampler only fills what an enqueued point leaves open (nothing).
        "grid": Sampler(lambda seed: _optuna().samplers.RandomSampler(seed=seed), grid=True),
    },
)

# name → the pruner, given the number of training epochs (its largest resource).
PRUNERS: Vocabulary[Callable[[int], optuna.pruners.BasePruner]] = Vocabulary(
    "pruner",
    {
        "none": lambda epochs: _optuna().pruners.NopPruner(),
        "median": lambda epochs: _optuna().pruners.MedianPruner(n_warmup_steps=1),
        "hyperband": lambda epochs: _optuna().pruners.HyperbandPruner(min_resource=1, max_resource=epochs),
    },
)


class SearchSpec(Strict):
    """Hyper-parameter search per variant, before the seeds are trained (``trials: 0``: none)."""

    trials: int = Field(0, ge=0)  # budget PER VARIANT: every variant gets the same number of trials
    space: dict[str, Dimension] = {}  # dotted keys under model.* / train.*
    sampler: SAMPLERS.field = "tpe"
    pruner: PRUNERS.field = "none"
    seed: int | None = None  # training seed of search trials; default: the study's first seed

    @property
    def enabled(self) -> bool:
        return bool(self.space)

    @property
    def grid(self) -> bool:
        """Whether the sampler visits the grid of the space rather than sampling it."""
        return SAMPLERS[self.sampler].grid

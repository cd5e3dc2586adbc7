"""The search space of a study (``search:``): dimension types, the sampler and pruner, budgets.

Search trials tune each variant with the same budget before its seeds are trained
(:mod:`ablate.drive`); here is what a space is and how it is checked before any training.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

from pydantic import Field

from .errors import StudyError
from .schema import Strict

if TYPE_CHECKING:  # pragma: no cover
    from .study import Study
    from .studyfile import Locator



class FloatRange(Strict):
    type: Literal["float"]
    low: float
    high: float
    log: bool = False
    step: float | None = Field(None, gt=0)


class IntRange(Strict):
    type: Literal["int"]
    low: int
    high: int
    log: bool = False
    step: int = Field(1, gt=0)


class Categorical(Strict):
    type: Literal["categorical"]
    choices: list[Any]


Dimension = Annotated[Union[FloatRange, IntRange, Categorical], Field(discriminator="type")]
SEARCH_ROOTS = ("model", "train")


class SearchSpec(Strict):
    """Hyper-parameter search per variant, before the seeds are trained (``trials: 0``: none)."""

    trials: int = Field(0, ge=0)  # budget PER VARIANT: every variant gets the same number of trials
    space: dict[str, Dimension] = {}  # dotted keys under model.* / train.*
    sampler: Literal["tpe", "random", "grid"] = "tpe"
    pruner: Literal["none", "median", "hyperband"] = "none"
    seed: int | None = None  # training seed of search trials; default: the study's first seed

    @property
    def enabled(self) -> bool:
        return bool(self.space)


def search_values(dim: Any) -> list[Any]:
    """Values that must all be valid for a dimension: both bounds, or every choice."""
    return list(dim.choices) if isinstance(dim, Categorical) else [dim.low, dim.high]


def grid_points(dim: Any) -> list[Any]:
    """Every value a grid search visits on one dimension (ranges need a step)."""
    if isinstance(dim, Categorical):
        return list(dim.choices)
    if isinstance(dim, IntRange):
        return list(range(dim.low, dim.high + 1, dim.step))
    count = int(round((dim.high - dim.low) / dim.step)) + 1
    return [dim.low + i * dim.step for i in range(count) if dim.low + i * dim.step <= dim.high + 1e-12]


def check_search(where: Locator, study: Study) -> None:
    """Bad search spaces fail here, before any training: unknown keys, empty categoricals,
    inverted ranges, log ranges reaching 0, values a variant cannot take, a missing budget."""
    search = study.spec.search
    for key, dim in search.space.items():
        at = ("search", "space", key)
        root = key.split(".")[0]
        if root not in SEARCH_ROOTS or "." not in key:
            raise where.error(at, f"search keys are dotted model.* or train.* keys (e.g. train.lr, "
                                  f"model.ffn.mult), got '{key}'")
        if isinstance(dim, Categorical):
            if not dim.choices:
                raise where.error(at, "an empty categorical: give at least one choice")
        else:
            if dim.low > dim.high:
                raise where.error(at, f"low ({dim.low}) is above high ({dim.high})")
            if dim.log and dim.low <= 0:
                raise where.error(at, f"a log range needs bounds > 0 (got low={dim.low})")
            if isinstance(dim, FloatRange) and dim.log and dim.step is not None:
                raise where.error(at, "a log range takes no step")
            if search.sampler == "grid" and isinstance(dim, FloatRange) and dim.step is None:
                raise where.error(at, "grid search over a float range needs a step")
        if study.spec.match_params and key.startswith(f"model.{study.spec.matched_slot()}."):
            raise where.error(at, "this key is the knob match_params scales; search another key or drop match_params")
        for name in study.variants:
            for value in search_values(dim):
                try:
                    study.with_params(name, {key: value})
                except StudyError as exc:
                    raise where.error(at, f"{value!r} does not fit variant '{name}' ({exc})") from None
    if search.space and search.trials == 0 and search.sampler != "grid":
        raise where.error(("search", "trials"), "a search space needs a trial budget per variant (trials: N)")
    if search.trials and not search.space:
        raise where.error(("search", "space"), "search.trials is set but no space is given")



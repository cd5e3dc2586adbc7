"""A study's search trials: the seed they train with, the sampler and pruner its ``search:`` section
names, the budget per variant, and a grid's points in a seeded order."""

from __future__ import annotations

import itertools
import math
import random
from typing import TYPE_CHECKING, Any

from ablate.study.search import PRUNERS, SAMPLERS

if TYPE_CHECKING:  # pragma: no cover
    import optuna

    from ablate.study.load import Study


def search_seed(study: Study) -> int:
    """The seed search trials train with (and their sampler draws with)."""
    search = study.spec.search
    return search.seed if search.seed is not None else study.spec.seed_list[0]


def make_sampler(study: Study) -> optuna.samplers.BaseSampler:
    return SAMPLERS[study.spec.search.sampler].make(search_seed(study))


def make_pruner(study: Study) -> optuna.pruners.BasePruner:
    return PRUNERS[study.spec.search.pruner](study.spec.train.epochs)


def search_budget(study: Study) -> int:
    """Search trials per variant: ``trials``, or for a grid its size (at most ``trials`` if given)."""
    search = study.spec.search
    if not search.enabled:
        return 0
    if search.grid:
        size = math.prod(len(d.grid_points()) for d in search.space.values())
        return min(search.trials, size) if search.trials else size
    return search.trials


def grid_order(study: Study) -> list[dict[str, Any]]:
    """Grid points in a seeded random order (a budget below the grid's size samples it evenly)."""
    space = study.spec.search.space
    axes = [d.grid_points() for d in space.values()]
    points = [dict(zip(space, values, strict=True)) for values in itertools.product(*axes)]
    random.Random(study.spec.search.seed or 0).shuffle(points)
    return points

"""The search space: each dimension type suggests, enumerates its grid, names the values that
must all be valid and says what is wrong with it; budgets, the grid's order, and the sampler and
pruner vocabularies."""

from __future__ import annotations

import optuna
import pytest

from ablate.errors import StudyError
from ablate.study.load import load_study
from ablate.study.search import PRUNERS, SAMPLERS, Categorical, FloatRange, IntRange
from ablate.study.tuning import grid_order, make_pruner, make_sampler, search_budget


def _trial() -> optuna.Trial:
    return optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0)).ask()


def test_each_dimension_suggests_within_its_bounds():
    trial = _trial()
    lr = FloatRange(type="float", low=1e-4, high=1e-2, log=True).suggest(trial, "train.lr")
    dropout = FloatRange(type="float", low=0.0, high=0.4, step=0.2).suggest(trial, "model.dropout")
    blocks = IntRange(type="int", low=1, high=7, step=2).suggest(trial, "model.blocks")
    kind = Categorical(type="categorical", choices=["adam", "adamw"]).suggest(trial, "train.optimizer")
    assert 1e-4 <= lr <= 1e-2
    assert min(abs(dropout - p) for p in (0.0, 0.2, 0.4)) < 1e-9
    assert blocks in (1, 3, 5, 7) and kind in ("adam", "adamw")
    assert trial.params == {
        "train.lr": lr,
        "model.dropout": dropout,
        "model.blocks": blocks,
        "train.optimizer": kind,
    }
    dist = trial.distributions
    assert dist["train.lr"].log and dist["model.blocks"].step == 2
    assert dist["train.optimizer"].choices == ("adam", "adamw")


def test_grid_points_of_each_dimension():
    assert IntRange(type="int", low=2, high=9, step=3).grid_points() == [2, 5, 8]
    assert IntRange(type="int", low=4, high=4).grid_points() == [4]
    assert Categorical(type="categorical", choices=[0.1, "x", None]).grid_points() == [0.1, "x", None]
    # 0.3 is 0.30000000000000004 when reached in steps of 0.1: still the upper bound's point.
    points = FloatRange(type="float", low=0.0, high=0.3, step=0.1).grid_points()
    assert len(points) == 4 and points[-1] == pytest.approx(0.3)
    # A step that does not divide the range stops below high, never above it.
    assert FloatRange(type="float", low=0.0, high=1.0, step=0.6).grid_points() == [0.0, 0.6]
    assert FloatRange(type="float", low=0.5, high=0.5, step=0.1).grid_points() == [0.5]


def test_values_that_must_all_be_valid():
    assert FloatRange(type="float", low=0.1, high=0.9, step=0.1).values() == [0.1, 0.9]
    assert IntRange(type="int", low=1, high=8, step=7).values() == [1, 8]
    # A short integer range is checked point by point (heads 3 need not divide dim where 2 and 4 do).
    assert IntRange(type="int", low=1, high=4).values() == [1, 2, 3, 4]
    assert IntRange(type="int", low=1, high=1000).values() == [1, 1000]
    assert Categorical(type="categorical", choices=["pre", "post"]).values() == ["pre", "post"]


@pytest.mark.parametrize(
    "dimension",
    [{"type": "categorical", "choices": [2, 3]}, {"type": "int", "low": 2, "high": 4}],
)
def test_a_search_value_a_component_refuses_fails_before_training(write_study, dimension):
    path = write_study({"search": {"trials": 2, "space": {"model.attention.heads": dimension}}})
    with pytest.raises(StudyError) as exc:
        load_study(path)
    line = path.read_text().splitlines().index("    model.attention.heads:") + 1
    assert str(exc.value).startswith(
        f"{path}:{line}: search.space.model.attention.heads: 3 does not fit variant 'base' "
        f"(model.attention: softmax attention: model width dim=16 is not divisible by heads=3"
    )


@pytest.mark.parametrize(
    "dim, grid, problem",
    [
        (FloatRange(type="float", low=0.5, high=0.1), False, "low (0.5) is above high (0.1)"),
        (IntRange(type="int", low=3, high=1), False, "low (3) is above high (1)"),
        (
            FloatRange(type="float", low=0.0, high=1.0, log=True),
            False,
            "a log range needs bounds > 0 (got low=0.0)",
        ),
        (IntRange(type="int", low=0, high=8, log=True), False, "a log range needs bounds > 0 (got low=0)"),
        (FloatRange(type="float", low=0.1, high=1.0, log=True, step=0.1), False, "a log range takes no step"),
        (FloatRange(type="float", low=0.1, high=1.0), True, "grid search over a float range needs a step"),
        (
            Categorical(type="categorical", choices=[]),
            False,
            "an empty categorical: give at least one choice",
        ),
        (FloatRange(type="float", low=0.1, high=1.0), False, None),
        (FloatRange(type="float", low=0.1, high=1.0, step=0.3), True, None),
        (IntRange(type="int", low=1, high=4), True, None),
        (Categorical(type="categorical", choices=[1]), True, None),
    ],
)
def test_check_names_the_problem(dim, grid, problem):
    assert dim.check(grid=grid) == problem


def _space(**dims):
    return {"search": {"space": dims}}


LR = {"type": "categorical", "choices": [0.001, 0.002, 0.003]}
BATCH = {"type": "int", "low": 16, "high": 64, "step": 16}


@pytest.mark.parametrize(
    "search, budget",
    [
        ({}, 0),
        ({"trials": 5, "sampler": "tpe", "space": {"train.lr": LR}}, 5),
        ({"sampler": "grid", "space": {"train.lr": LR, "train.batch_size": BATCH}}, 12),
        ({"trials": 4, "sampler": "grid", "space": {"train.lr": LR, "train.batch_size": BATCH}}, 4),
        ({"trials": 50, "sampler": "grid", "space": {"train.lr": LR, "train.batch_size": BATCH}}, 12),
    ],
)
def test_search_budget(write_study, search, budget):
    assert search_budget(load_study(write_study({"search": search}))) == budget


def test_grid_order_is_a_seeded_shuffle_of_every_point(write_study):
    search = {"trials": 5, "sampler": "grid", "space": {"train.lr": LR, "train.batch_size": BATCH}}
    study = load_study(write_study({"search": search}))
    order = grid_order(study)
    every = {(lr, batch) for lr in LR["choices"] for batch in (16, 32, 48, 64)}
    assert len(order) == 12 and {(p["train.lr"], p["train.batch_size"]) for p in order} == every
    # A budget below the grid's size visits that many distinct points.
    visited = order[: search_budget(study)]
    assert len({tuple(p.items()) for p in visited}) == 5
    assert grid_order(load_study(write_study({"search": search}))) == order  # the same seed, the same order
    reseeded = grid_order(load_study(write_study({"search": {**search, "seed": 7}})))
    assert sorted(map(str, reseeded)) == sorted(map(str, order)) and reseeded != order


def test_samplers_and_pruners_are_built_from_their_vocabularies(write_study):
    assert list(SAMPLERS) == ["tpe", "random", "grid"] and list(PRUNERS) == ["none", "median", "hyperband"]
    built = {
        ("tpe", "none"): (optuna.samplers.TPESampler, optuna.pruners.NopPruner),
        ("random", "median"): (optuna.samplers.RandomSampler, optuna.pruners.MedianPruner),
        ("grid", "hyperband"): (optuna.samplers.RandomSampler, optuna.pruners.HyperbandPruner),
    }
    for (sampler, pruner), (sampler_cls, pruner_cls) in built.items():
        search = {"trials": 2, "sampler": sampler, "pruner": pruner, "space": {"train.lr": LR}}
        study = load_study(write_study({"search": search}))
        assert study.spec.search.grid == (sampler == "grid")
        assert isinstance(make_sampler(study), sampler_cls) and isinstance(make_pruner(study), pruner_cls)


@pytest.mark.parametrize(
    "key, given, message",
    [
        (
            "sampler",
            "tp",
            "search.sampler: unknown sampler 'tp'; did you mean 'tpe'? (known: 'tpe', 'random', 'grid')",
        ),
        (
            "pruner",
            "medain",
            "search.pruner: unknown pruner 'medain'; did you mean 'median'? "
            "(known: 'none', 'median', 'hyperband')",
        ),
    ],
)
def test_unknown_sampler_or_pruner_is_one_line_naming_the_key(write_study, key, given, message):
    path = write_study({"search": {"trials": 2, key: given, "space": {"train.lr": LR}}})
    with pytest.raises(StudyError) as exc:
        load_study(path)
    text = str(exc.value)
    assert len(text.splitlines()) == 1 and text.startswith(f"{path}:") and message in text, text

"""Trainer schedules: the per-epoch learning-rate schedule (``train.lr_schedule``: values per epoch,
checkpointed and resumed exactly), parameter groups with their own lr / weight decay
(``train.param_groups``), and the second training stage after early stopping
(``train.second_stage``: starts from the first stage's best or last weights, runs every
component's ``stage_end`` hook — fr_graph freezes its topology — and resumes exactly)."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
import torch
import yaml

import ablate.training.trainer
from ablate.drive.ledger import fingerprint
from ablate.errors import StudyError
from ablate.optim.schedules import build_optimizer, halving_after_two
from ablate.study.load import load_study
from ablate.study.spec import TrainSpec
from ablate.training.trainer import Checkpoint, train_trial
from ablate_plugins.graph_attention import FRGraphAttention

CPU = torch.device("cpu")


class Interrupt(BaseException):
    """Stands for a worker dying after an epoch (not an Exception: nothing catches it)."""


def _train(study, data, variant="base", checkpoint=None, stop_at=None, seen=None):
    def on_epoch(epoch, logged):
        if seen is not None:
            # the last model built is the trial's (a probe build counts its FLOPs first:
            # ablate.training.flops)
            seen.append((epoch, {k: v.clone() for k, v in model_of[-1].state_dict().items()}))
        if epoch == stop_at:
            raise Interrupt

    model_of: list = []
    real = ablate.training.trainer.seeded_model

    def keep(*args, **kwargs):
        model, generator = real(*args, **kwargs)
        model_of.append(model)
        return model, generator

    ablate.training.trainer.seeded_model = keep
    try:
        return train_trial(
            study, study.variants[variant], 3, data, CPU, on_epoch=on_epoch, checkpoint=checkpoint
        )
    finally:
        ablate.training.trainer.seeded_model = real


def _curve(result, key):
    return [v for _, k, v in sorted(result.curves) if k == key]


# ---------------------------------------------------------------------------------------
# learning-rate schedules


def test_type1_keeps_lr_for_two_epochs_then_halves_each_epoch(write_study):
    """Time-Series-Library's type1 as its loop applies it (adjust after each epoch with epoch + 1)."""
    study = load_study(write_study({"train": {"epochs": 5, "lr_schedule": "type1"}}))
    result = _train(study, study.task.load())
    lr = study.spec.train.lr
    assert _curve(result, "train.lr") == pytest.approx([lr, lr, lr / 2, lr / 4, lr / 8])
    assert [halving_after_two(k) for k in range(5)] == [1, 1, 0.5, 0.25, 0.125]


def test_cosine_follows_the_closed_form(write_study):
    study = load_study(write_study({"train": {"epochs": 4, "lr_schedule": "cosine"}}))
    result = _train(study, study.task.load())
    lr, epochs = study.spec.train.lr, 4
    expected = [lr * (1 + math.cos(math.pi * (e - 1) / epochs)) / 2 for e in range(1, epochs + 1)]
    assert _curve(result, "train.lr") == pytest.approx(expected, rel=1e-9)


def test_constant_logs_no_lr_and_old_fingerprints_hold(write_study):
    default = load_study(write_study())
    assert default.spec.train.later_options_at_default() == set(TrainSpec.LATER_OPTIONS)
    result = _train(default, default.task.load())
    assert not _curve(result, "train.lr") and not _curve(result, "train.stage")
    halving = load_study(write_study({"train": {"lr_schedule": "type1"}}, name="other.yaml"))
    later = {"param_groups", "second_stage", "micro_batches", "compile"}
    assert halving.spec.train.later_options_at_default() == later
    assert fingerprint(halving, "base") != fingerprint(default, "base")


def test_a_schedule_resumes_exactly(write_study, tmp_path):
    study = load_study(
        write_study({"train": {"epochs": 5, "lr_schedule": "type1"}, "model": {"dropout": 0.3}})
    )
    data = study.task.load()
    whole = _train(study, data)
    checkpoint = Checkpoint(tmp_path / "ck" / "base.pt", signature="sig", every_s=0)
    with pytest.raises(Interrupt):
        _train(study, data, checkpoint=checkpoint, stop_at=4)  # epochs 1-3 saved
    assert torch.load(checkpoint.path, weights_only=True)["scheduler"]["last_epoch"] == 3
    resumed = _train(study, data, checkpoint=checkpoint)
    assert resumed.resumed_from == 3
    assert resumed.curves == whole.curves and resumed.summary == whole.summary
    assert resumed.per_unit.equals(whole.per_unit)


# ---------------------------------------------------------------------------------------
# parameter groups


TABULAR = {
    "name": "tab",
    "task": {"kind": "tabular", "data": {"format": "synthetic", "rows": 400, "numeric": 3, "categorical": 1}},
    "model": {
        "dim": 16,
        "blocks": 1,
        "dropout": 0.1,
        "attention": {"kind": "softmax", "heads": 2},
        "ffn": {"kind": "reglu", "hidden": 32},
        "bias": [],
    },
    "variants": {"t2g": {"attention": {"kind": "fr_graph", "heads": 2}}},
    "train": {"epochs": 12, "batch_size": 64, "lr": 3e-3, "patience": 1, "second_stage": {"patience": 2}},
    "seeds": [0],
    "metrics": {"primary": "rmse"},
}


def _tabular(tmp_path: Path, **train) -> Path:
    spec = copy.deepcopy(TABULAR)
    spec["train"].update(train)
    spec["output"] = str(tmp_path / "runs")
    path = tmp_path / "tab.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _model(study, variant):
    data = study.task.load()
    model, _ = ablate.training.trainer.seeded_model(study, study.variants[variant], 0, data, CPU)
    return model


def test_param_groups_set_lr_and_decay_by_name_first_match_wins(tmp_path):
    groups = [
        {"params": r"topology\.col_", "lr": 0.01, "weight_decay": 0.0},
        {"params": r"^tokenizer\.|\.norm\.|\.bias$", "weight_decay": 0.0},
    ]
    study = load_study(_tabular(tmp_path, weight_decay=1e-3, param_groups=groups, optimizer="adamw"))
    model = _model(study, "t2g")
    names = {id(p): n for n, p in model.named_parameters()}
    built = build_optimizer(model, study.spec.train).param_groups
    assert [(g["lr"], g["weight_decay"]) for g in built] == [(3e-3, 1e-3), (0.01, 0.0), (3e-3, 0.0)]
    rest, columns, no_decay = ({names[id(p)] for p in g["params"]} for g in built)
    assert columns == {
        "backbone.blocks.0.attention.topology.col_head",
        "backbone.blocks.0.attention.topology.col_tail",
    }
    assert "backbone.blocks.0.attention.topology.bias" in no_decay and "tokenizer.weight" in no_decay
    assert all(not n.endswith(".bias") and "norm" not in n and "col_" not in n for n in rest)
    assert len(rest | columns | no_decay) == len(names)
    # A variant without the matched parameters: that group is left out.
    base = build_optimizer(_model(study, "base"), study.spec.train).param_groups
    assert [(g["lr"], g["weight_decay"]) for g in base] == [(3e-3, 1e-3), (3e-3, 0.0)]


def test_without_param_groups_the_optimizer_is_one_group_as_before(tmp_path):
    study = load_study(_tabular(tmp_path))
    model = _model(study, "base")
    (group,) = build_optimizer(model, study.spec.train).param_groups
    assert [id(p) for p in group["params"]] == [id(p) for p in model.parameters()]


# ---------------------------------------------------------------------------------------
# the second stage


def _stage_one_best(result) -> int:
    """The first stage's best epoch from the curves (strict improvement: the first minimum)."""
    stage_one = [(e, v) for e, k, v in sorted(result.curves) if k == "valid.rmse" and e in _stage(result, 1)]
    best = min(v for _, v in stage_one)
    return next(e for e, v in stage_one if v == best)


def _stage(result, number) -> list[int]:
    return [e for e, k, v in sorted(result.curves) if k == "train.stage" and v == number]


@pytest.mark.parametrize("start", ["best", "last"])
def test_second_stage_starts_from_the_first_stages_weights_and_fires_the_hook(tmp_path, monkeypatch, start):
    study = load_study(_tabular(tmp_path, second_stage={"patience": 2, "start": start}))
    data = study.task.load()
    hooks = []
    real = ablate.training.trainer.end_stage

    def spy(model, stage):
        (attention,) = [m for m in model.modules() if isinstance(m, FRGraphAttention)]
        frozen_before = attention.topology_frozen
        real(model, stage)
        hooks.append((stage, frozen_before, attention.topology_frozen, copy.deepcopy(model.state_dict())))

    monkeypatch.setattr(ablate.training.trainer, "end_stage", spy)
    seen: list = []
    result = _train(study, data, "t2g", seen=seen)
    ((stage, before, after, weights),) = hooks
    assert stage == 1 and not before and after  # the hook ran once and froze the topology
    first, second = _stage(result, 1), _stage(result, 2)
    assert first and second and first[-1] + 1 == second[0] and second[-1] == result.epochs
    assert len(second) >= 2 or result.epochs == study.spec.train.epochs  # the fresh patience
    snapshots = dict(seen)
    origin = _stage_one_best(result) if start == "best" else first[-1]
    for key, value in snapshots[origin].items():
        assert torch.equal(weights[key], value), key
    # The result is the best validation epoch over both stages.
    valid = {e: v for e, k, v in result.curves if k == "valid.rmse"}
    assert result.best_epoch == min(valid, key=lambda e: (valid[e], e))


def test_second_stage_resumes_exactly_across_the_stage_boundary(tmp_path):
    study = load_study(_tabular(tmp_path))
    data = study.task.load()
    whole = _train(study, data, "t2g")
    boundary = _stage(whole, 1)[-1]
    assert _stage(whole, 2), "the first stage must early-stop within the epochs for this test"
    checkpoint = Checkpoint(tmp_path / "ck" / "t2g.pt", signature="sig", every_s=0)
    with pytest.raises(Interrupt):
        _train(study, data, "t2g", checkpoint=checkpoint, stop_at=boundary + 1)
    assert torch.load(checkpoint.path, weights_only=True)["stage_ends"] == [boundary]
    resumed = _train(study, data, "t2g", checkpoint=checkpoint)
    assert resumed.resumed_from == boundary
    assert resumed.curves == whole.curves and resumed.summary == whole.summary
    assert resumed.best_epoch == whole.best_epoch and resumed.per_unit.equals(whole.per_unit)


# ---------------------------------------------------------------------------------------
# the study file


@pytest.mark.parametrize(
    "train, message",
    [
        ({"second_stage": {"patience": 3}}, "train: second_stage needs patience"),
        ({"lr_schedule": "type2"}, "unknown learning-rate schedule 'type2'; did you mean 'type1'?"),
        ({"param_groups": [{"params": "col_(", "lr": 0.01}]}, "not a regular expression"),
        ({"param_groups": [{"params": "x", "momentum": 0.9}]}, "momentum"),
        ({"second_stage": {"start": "first"}, "patience": 2}, "start"),
    ],
)
def test_bad_schedule_options_are_one_line_errors(write_study, train, message):
    with pytest.raises(StudyError) as info:
        load_study(write_study({"train": train}))
    assert message in str(info.value) and "\n" not in str(info.value).strip()


def test_schedule_options_are_in_the_json_schema():
    schema = json.dumps(TrainSpec.model_json_schema())
    assert all(name in schema for name in ("lr_schedule", "param_groups", "second_stage", "type1"))


# ---------------------------------------------------------------------------------------
# the seed studies that use them

STUDIES = Path(__file__).resolve().parents[1] / "studies"


@pytest.mark.data("etth1")
def test_duet_runs_every_horizon_with_the_published_schedule_and_widths():
    horizons = {}
    for path in sorted(STUDIES.glob("duet_etth1*.yaml")):
        study = load_study(path)
        horizons[study.task.options.horizon] = study
        assert study.spec.train.lr_schedule == "type1" and study.task.options.lookback == 96
    assert sorted(horizons) == [96, 192, 336, 720]
    assert {h: s.spec.model.dim for h, s in horizons.items()} == {96: 256, 192: 256, 336: 512, 720: 512}


@pytest.mark.data("california-housing")
def test_t2g_california_is_the_published_configuration_with_two_stages():
    study = load_study(STUDIES / "t2g_california.yaml")
    model, train = study.spec.model, study.spec.train
    assert (model.dim, model.blocks, model.norm.placement, model.final_norm) == (272, 3, "post", False)
    assert (train.lr, train.patience, train.second_stage.patience, train.batch_size) == (9.23e-5, 16, 16, 256)
    (columns, _) = train.param_groups
    assert (columns.lr, columns.weight_decay) == (0.01, 0.0)
    assert len(study.spec.seed_list) == 15  # the papers' 15 seeds


@pytest.mark.data("ml-1m-users2999")
def test_tisasrec_ml1m_compares_the_four_models_with_at_least_five_seeds():
    study = load_study(STUDIES / "tisasrec_ml1m.yaml")
    assert {"base", "tisasrec", "sasrec-mhc", "tisasrec-mhc"} <= set(study.variants)
    # the seed's own forms beside them (issue 37): its log-time-gap bias and its MHCLayer
    assert {"log-time-gap", "sasrec-mhc-layer", "tisasrec-mhc-layer"} <= set(study.variants)
    assert study.spec.sequential.initial >= 5 and study.task.options.max_len == 50
    assert study.variants["tisasrec-mhc"].attention.options.max_interval == 256

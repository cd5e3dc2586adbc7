"""Gradient norms before clipping (issue 32): the trainer's norm against one computed by hand,
the per-epoch curves ``train.grad_norm`` / ``train.grad_norm_max`` through a tiny study's MLflow
store into the report, and the report's table against hand-computed values."""

from __future__ import annotations

import copy
import math

import pandas as pd
import pytest
import torch

from ablate.report.gradnorms import grad_norm_elements, grad_norm_rows
from ablate.study.load import load_study
from ablate.tracking.results import load_results
from ablate.training.trainer import Trainer, grad_norm_curves


def _lm_study(write_study, clip: float | None):
    return load_study(
        write_study(
            replace={
                "task": {
                    "kind": "lm",
                    "data": {"format": "synthetic", "documents": 6, "words": 30},
                    "window": 16,
                },
                "model.bias": [{"kind": "rope"}],
                "model.dropout": 0.0,
                "metrics": {"primary": "bpb"},
                "train": {"epochs": 1, "batch_size": 8, "lr": 0.003, "grad_clip": clip},
            }
        )
    )


@pytest.mark.parametrize("clip", [None, 1e-3])
def test_the_norm_is_the_gradients_l2_norm_before_clipping(tmp_path, write_study, clip):
    study = _lm_study(write_study, clip)
    data = study.task.load()
    trainer = Trainer.start(study, study.variants["base"], 0, data, torch.device("cpu"))
    batch = next(iter(trainer.batches(data)))
    twin = copy.deepcopy(trainer.model)
    study.task.loss(twin, batch, study.loss, torch.Generator()).backward()
    by_hand = math.sqrt(
        sum(float((p.grad.double() ** 2).sum()) for p in twin.parameters() if p.grad is not None)
    )
    trainer.step(batch)
    assert float(trainer.grad_norm) == pytest.approx(by_hand, rel=1e-5)
    assert by_hand > 10 * 1e-3  # clipping at 1e-3 did cut these gradients: the norm is the one before


def test_epoch_curve_points_are_the_mean_and_the_max():
    assert grad_norm_curves([torch.tensor(1.0), torch.tensor(4.0), torch.tensor(1.0)]) == {
        "train.grad_norm": 2.0,
        "train.grad_norm_max": 4.0,
    }
    assert grad_norm_curves([]) == {}


def test_report_table_by_hand():
    # variant a: seeds 0 and 1, epochs 1-2; variant b: one seed with a spike at epoch 2.
    points = [
        ("a", 0, 1, 2.0, 3.0),
        ("a", 0, 2, 1.0, 1.5),
        ("a", 1, 1, 4.0, 5.0),
        ("a", 1, 2, 3.0, 3.5),
        ("b", 0, 1, 1.0, 2.0),
        ("b", 0, 2, 0.5, 6.0),
    ]
    rows = [(v, s, e, "train.grad_norm", m) for v, s, e, m, _ in points]
    rows += [(v, s, e, "train.grad_norm_max", x) for v, s, e, _, x in points]
    rows.append(("a", 0, 2, "valid.bpb", 9.0))  # other curves are ignored
    curves = pd.DataFrame(rows, columns=["variant", "seed", "epoch", "metric", "value"])
    table = grad_norm_rows(curves, ["b", "a"])
    # a: per-seed means 1.5 and 3.5 → 2.5 ± sd(1.5, 3.5) = 1.414; last epoch (1.0 + 3.0) / 2 = 2.0
    assert table[1] == ["a", "2.50 ± 1.41", "2.00", "5.00", "0 of 4"]
    assert table[0] == ["b", "0.750", "0.500", "6.00", "1 of 2"]  # 6.0 ≥ 10 × 0.5: a spike
    assert grad_norm_elements(curves[curves["metric"] == "valid.bpb"], ["a"]) == []


def test_a_tiny_study_logs_the_curves_and_its_report_shows_them(tmp_path, write_study, cli):
    study = write_study(
        patch={"train": {"grad_clip": 1.0}, "task": {"data": {"users": 40}}}, replace={"seeds": [0]}
    )
    code, _, err = cli("run", study, "--reports", tmp_path / "reports", "--quiet")
    assert code == 0, err
    loaded = load_results(f"sqlite:///{tmp_path}/runs/tiny/mlflow.db", "tiny")
    curves = loaded.curves
    norms = curves[curves["metric"] == "train.grad_norm"]
    peaks = curves[curves["metric"] == "train.grad_norm_max"]
    assert len(norms) == len(peaks) == 2 * 2  # variants × epochs
    merged = norms.merge(peaks, on=["variant", "seed", "epoch"])
    assert (merged["value_x"] > 0).all() and (merged["value_y"] >= merged["value_x"] - 1e-9).all()
    report = (tmp_path / "reports" / "tiny" / "report.md").read_text()
    assert "## Gradient norms (exploratory)" in report and "figures/grad_norms.png" in report
    assert (tmp_path / "reports" / "tiny" / "figures" / "grad_norms.png").stat().st_size > 0

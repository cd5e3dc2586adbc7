"""Trivial baselines (issue 36): each task's, against values computed here independently; the
protocol sentence; per-metric default margins; the 'differs' column naming option changes; the
baselines kept with the study's MLflow run, so that a report rebuilt from the store alone shows them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from numpy.lib.stride_tricks import sliding_window_view

from ablate.stats import ReportSettings
from ablate.study.load import load_study
from ablate.tasks import BASELINES_ARTIFACT
from ablate_plugins.forecast.options import ForecastOptions
from ablate_plugins.forecast.task import ForecastTask
from ablate_plugins.seqrec import SeqRecOptions, SeqRecTask
from ablate_plugins.tabular.options import TabularOptions
from ablate_plugins.tabular.task import TabularTask

HERE = Path(".")


def _seqrec(protocol: str = "full") -> tuple[SeqRecTask, object]:
    task = SeqRecTask(
        SeqRecOptions.model_validate(
            {
                "data": {
                    "format": "synthetic",
                    "users": 80,
                    "items": 40,
                    "min_len": 6,
                    "max_len": 12,
                    "seed": 3,
                },
                "protocol": protocol,
                "sampled_negatives": 20,
            }
        ),
        HERE,
    )
    return task, task.load()


def _popularity_ranks(data, candidates_of) -> np.ndarray:
    """0-based ranks of each user's test item by its count over every user's items before the test
    point (training and validation items), ties against the target, by loops."""
    counts = np.zeros(data.num_items + 1)
    for s in data.sequences:
        for item in s[:-1]:
            counts[item] += 1
    ranks = []
    for u, s in enumerate(data.sequences):
        target = s[-1]
        ranks.append(sum(counts[c] >= counts[target] for c in candidates_of(u, s)))
    return np.array(ranks, dtype=float)


def test_seqrec_popularity_full_ranking_by_hand():
    task, data = _seqrec()
    (found,) = task.baselines(data, ["ndcg@10", "hr@5", "mrr"])
    assert found.name == "popularity"

    def candidates(u, s):  # every item but padding, the history and the target itself
        return [i for i in range(1, data.num_items + 1) if i != s[-1] and i not in set(s[:-1])]

    rank = _popularity_ranks(data, candidates)
    assert found.values["hr@5"] == pytest.approx(np.mean(rank < 5))
    assert found.values["mrr"] == pytest.approx(np.mean(1 / (rank + 1)))
    assert found.values["ndcg@10"] == pytest.approx(np.mean(np.where(rank < 10, 1 / np.log2(rank + 2), 0)))
    assert found.values == task.baselines(data, ["ndcg@10", "hr@5", "mrr"])[0].values  # no seed
    assert "training and validation items" in found.about


def test_seqrec_popularity_ranks_against_the_variants_sampled_candidates():
    task, data = _seqrec("sampled")
    negatives = task.negatives(data, "test")  # what every variant is ranked against
    (found,) = task.baselines(data, ["hr@3", "full.hr@3"])
    rank = _popularity_ranks(data, lambda u, s: list(negatives[u]))
    assert found.values["hr@3"] == pytest.approx(np.mean(rank < 3))
    full = _popularity_ranks(data, lambda u, s: [i for i in range(1, data.num_items + 1) if i not in set(s)])
    assert found.values["full.hr@3"] == pytest.approx(np.mean(full < 3))
    text = task.protocol(["hr@3", "full.hr@3"])
    assert "20 items drawn" in text and "Ties count against the target" in text and "full ranking" in text


def test_forecast_baselines_by_hand():
    opts = ForecastOptions.model_validate(
        {"data": {"format": "synthetic", "channels": 3, "rows": 400, "period": 12, "seed": 1}, "lookback": 24}
        | {"horizon": 6}
    )
    task = ForecastTask(opts, HERE)
    series = task.load()
    found = {b.name: b.values for b in task.baselines(series, ["mse", "mae"])}
    assert list(found) == ["repeat-last", "window-mean", "seasonal-naive"]
    start, end = series.borders["test"]
    span = sliding_window_view(series.values[start:end].astype(np.float64), 24 + 6, axis=0)  # [b, c, 30]
    inputs, targets = span[..., :24], span[..., 24:]
    last = np.repeat(inputs[..., -1:], 6, axis=-1)
    assert found["repeat-last"]["mse"] == pytest.approx(((last - targets) ** 2).mean())
    assert found["repeat-last"]["mae"] == pytest.approx(np.abs(last - targets).mean())
    seasonal = inputs[..., 12:18]  # step h of the horizon: the value one period (12 rows) before it
    assert found["seasonal-naive"]["mse"] == pytest.approx(((seasonal - targets) ** 2).mean())
    assert found["seasonal-naive"]["mse"] < found["repeat-last"]["mse"]  # planted period 12
    assert "z-normalised scale" in task.protocol(["mse"]) and "70% / 10% / 20%" in task.protocol(["mse"])


def _tabular(task_type: str) -> tuple[TabularTask, object]:
    data = {"format": "synthetic", "task_type": task_type, "rows": 400, "seed": 2, "noise": 0.05}
    task = TabularTask(TabularOptions.model_validate({"data": data}), HERE)
    return task, task.load()


def test_tabular_classification_baselines():
    task, table = _tabular("multiclass")
    found = {b.name: b.values["accuracy"] for b in task.baselines(table, ["accuracy"])}
    train, test = table.splits["train"].y_raw.astype(int), table.splits["test"].y_raw.astype(int)
    majority = np.argmax(np.bincount(train))
    assert found["majority class"] == pytest.approx(np.mean(test == majority))
    assert found["logistic regression"] > found["majority class"] + 0.2  # a planted linear score
    assert task.default_margin("accuracy") == "2% of error"
    assert "highest logit" in task.protocol(["accuracy"])


def test_tabular_regression_baselines():
    task, table = _tabular("regression")
    found = {b.name: b.values for b in task.baselines(table, ["rmse", "mae"])}
    y_train, y_test = table.splits["train"].y_raw, table.splits["test"].y_raw
    assert found["training mean"]["rmse"] == pytest.approx(np.sqrt(np.mean((y_test - y_train.mean()) ** 2)))
    assert found["training mean"]["mae"] == pytest.approx(np.mean(np.abs(y_test - y_train.mean())))
    assert found["ridge"]["rmse"] < 0.7 * found["training mean"]["rmse"]
    assert task.default_margin("rmse") == "2%" and "original units" in task.protocol(["rmse"])


def test_margin_of_error_and_per_metric_defaults():
    s = ReportSettings(
        primary="accuracy",
        metrics=["accuracy", "rmse"],
        margins={"accuracy": "2% of error", "rmse": None},
        higher_is_better={"accuracy": True, "rmse": False},
    )
    # Adult: base 0.857; 2% of the mean would be ±0.0171, 2% of the error ±0.00286
    assert s.margin_for(0.857) == pytest.approx(0.02 * 0.143)
    assert s.margin_for(0.50, "rmse") == pytest.approx(0.01)  # not named: 2% of the mean
    assert (
        s.margin_words() == "2% of base's error (1 − mean)" and s.margin_words("rmse") == "2% of base's mean"
    )
    explicit = s.model_copy(update={"margin": 0.004})
    assert explicit.margin_for(0.857) == 0.004 and explicit.margin_for(0.5, "rmse") == 0.004
    stored = ReportSettings.from_json(s.model_dump_json())
    assert stored.margin_for(0.857) == pytest.approx(0.02 * 0.143)
    for bad in ("2", "2% of mean", "-1% of error"):
        with pytest.raises(ValueError, match="relative one"):
            ReportSettings(margin=bad)


def test_study_fills_each_metrics_default_margin_unless_the_file_sets_one(write_study):
    tabular = {
        "task": {"kind": "tabular", "data": {"format": "synthetic", "task_type": "binclass", "rows": 100}},
        "metrics": {"primary": "accuracy", "also": []},
        "variants": {"mlp": {"ffn": {"kind": "mlp", "mult": 2}}},
    }
    replace = {"task": tabular["task"], "metrics": tabular["metrics"], "model.bias": [], "train.loss": {}}
    settings = load_study(write_study(replace=replace)).report_settings()
    assert settings.margin is None and settings.margin_for(0.85) == pytest.approx(0.003)
    given = load_study(write_study(replace=replace | {"report": {"margin": "1%"}}, name="m.yaml"))
    assert given.report_settings().margin_for(0.85) == pytest.approx(0.0085)


def test_differs_names_option_changes(write_study):
    study = load_study(
        write_study(
            {
                "model": {"attention": {"heads": 4}},
                "variants": {
                    "one-head": {"attention": {"heads": 1}},
                    "post": {"norm": {"placement": "post"}},
                    "wide": {"dim": 32},
                },
            }
        )
    )
    base = study.variants["base"]
    assert study.variants["one-head"].differs_from(base) == "attention.heads: 4→1"
    assert study.variants["post"].differs_from(base) == "norm.placement: pre→post"
    assert study.variants["wide"].differs_from(base) == "dim: 16→32"
    assert study.variants["mlp"].differs_from(base) == "ffn: mlp(mult=2.0)"  # another kind: its label


def test_baselines_kept_with_the_run_and_rebuilt_from_the_store(write_study, cli, tmp_path):
    from ablate.drive.reference import fill_reference
    from ablate.tracking.results import load_results

    path = write_study({"train": {"epochs": 1}, "seeds": [0]}, replace={"variants": {}})
    code, _, err = cli("run", path)
    assert code == 0, err
    runs = tmp_path / "runs" / "tiny"
    (kept,) = runs.rglob(BASELINES_ARTIFACT)  # an artifact of the study's run
    stored = json.loads(kept.read_text())
    assert [b["name"] for b in stored["baselines"]] == ["popularity"] and "Leave-one-out" in stored[
        "protocol"
    ]
    value = f"{stored['baselines'][0]['values']['ndcg@10']:.4f}"
    about = stored["baselines"][0]["about"]
    assert "up to the test point (training and validation items)" in about
    row = f"| popularity † | trivial baseline: {about} | — | {value}"
    assert row in (runs / "report" / "report.md").read_text()
    # the store alone (no study file, no data) holds them
    uri = f"sqlite:///{runs / 'mlflow.db'}"
    assert load_results(uri, "tiny", curves=False).meta["reference"] == stored
    # a store without them (made before baselines were kept): computed from the data and kept
    kept.unlink()
    meta = load_results(uri, "tiny", curves=False).meta
    assert "reference" not in meta
    fill_reference(uri, load_study(path), meta)
    assert meta["reference"] == stored and json.loads(kept.read_text()) == stored


def test_plan_reads_each_metrics_default_margin():
    from ablate.commands.pilots import Pilot
    from ablate.commands.planning import assumptions
    from ablate.errors import AblateError

    s = ReportSettings(primary="accuracy", metrics=["accuracy"], margins={"accuracy": "2% of error"})
    with pytest.raises(AblateError, match="share of the baseline's error"):
        assumptions(s, None, "0.004", None)
    found = assumptions(s, None, None, Pilot("pilot.csv", 0.002, 4, "pooled", 0.857, None))
    assert found.margin == pytest.approx(0.02 * 0.143)
    plain = assumptions(ReportSettings(primary="ndcg@10", metrics=["ndcg@10"]), None, "3%", None)
    assert plain.margin == pytest.approx(0.02)  # 2% of a mean of 1: the default, in shares


def test_repeat_last_on_etth1_is_the_published_repeat_row(data_file):
    """ETTh1, lookback 96, horizon 96, the 12/4/4-month split: DLinear's paper (Zeng et al. 2023,
    Table 2, 'Repeat') reports MSE 1.295, MAE 0.713."""
    data = data_file("etth1").parent
    options = {"data": {"format": "csv", "path": "ETTh1.csv"}, "lookback": 96, "horizon": 96}
    task = ForecastTask(ForecastOptions.model_validate(options), data)
    found = {b.name: b.values for b in task.baselines(task.load(), ["mse", "mae"])}
    assert found["repeat-last"]["mse"] == pytest.approx(1.295, abs=0.001)
    assert found["repeat-last"]["mae"] == pytest.approx(0.713, abs=0.001)
    assert "seasonal-naive" in found and "12 months train" in task.protocol(["mse"])


def test_every_metric_has_its_default_margin_from_one_table():
    """Accuracy-like names (also inside a longer name) are judged on a share of the error, every
    other metric on a share of the mean; a study file's or a stored run's missing margin falls back
    to the same table, and so do tasks that set none of their own."""
    from ablate.margins import default_margin, wide_margin
    from ablate_plugins.seqrec.task import SeqRecTask

    for name in ("accuracy", "val_acc", "test/accuracy", "balanced_accuracy", "roc_auc", "f1"):
        assert default_margin(name) == "2% of error", name
    for name in ("ndcg@10", "hr@10", "mrr", "mse", "bpb", "loss", "access_rate"):
        assert default_margin(name) == "2%", name
    assert ReportSettings(primary="val_acc", metrics=["val_acc"]).margin_for(0.96) == pytest.approx(0.0008)
    assert SeqRecTask.default_margin(None, "ndcg@10") == "2%"
    assert wide_margin("accuracy", 0.0192, 0.96) == (pytest.approx(0.04), "its error (1 − mean)")
    assert wide_margin("accuracy", 0.0008, 0.96) is None and wide_margin("ndcg@10", 0.5, 0.3) is None

"""The forecast task: the CSV loader on the real ETT / illness files, the standard splits,
train-only normalisation, windows, the channel-token model, metrics, and end-to-end runs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from ablate.errors import DataError
from ablate.study.load import load_study
from ablate.training.trainer import train_trial
from ablate_plugins.forecast import (
    ForecastOptions,
    ForecastTask,
    read_csv,
    split_borders,
    window_errors,
)
from ablate_plugins.forecast.batches import collate, eval_batches, train_batches


def task_for(base: Path, **options) -> ForecastTask:
    return ForecastTask(ForecastOptions.model_validate(options), base)


# ---------------------------------------------------------------------------------------
# Loader and splits on the real files


def test_etth1_loads_with_the_standard_hourly_split(data_file):
    etth1 = data_file("etth1")
    series = task_for(
        etth1.parent, data={"format": "csv", "path": etth1.name}, lookback=96, horizon=96
    ).load()
    frame = pd.read_csv(etth1)
    assert (
        series.channels == list(frame.columns[1:]) == ["HUFL", "HULL", "MUFL", "MULL", "LUFL", "LULL", "OT"]
    )
    # 12 / 4 / 4 months of 30 days × 24 h; valid / test start one lookback early.
    assert series.borders == {"train": (0, 8640), "valid": (8544, 11520), "test": (11424, 14400)}
    assert [series.windows(s) for s in ("train", "valid", "test")] == [8640 - 191, 2880 - 95, 2880 - 95]
    # z-normalised with the first 8,640 rows' statistics only (population std, as StandardScaler)
    raw = frame.iloc[:, 1:].to_numpy()
    mean, std = raw[:8640].mean(0), raw[:8640].std(0)
    np.testing.assert_allclose(series.mean, mean)
    np.testing.assert_allclose(series.values[:8640].mean(0), 0, atol=1e-5)
    np.testing.assert_allclose(
        series.values, ((raw[:14400] - mean) / std).astype(np.float32), rtol=1e-5, atol=1e-5
    )
    assert not np.allclose(series.values[8640:].mean(0), 0, atol=1e-2)  # later rows are not re-centred


def test_ettm1_uses_the_same_span_at_15_minute_rows(data_file):
    borders = split_borders(len(pd.read_csv(data_file("ettm1"), usecols=[0])), "ett_minute", 96)
    assert borders == {"train": (0, 34560), "valid": (34464, 46080), "test": (45984, 57600)}


def test_illness_uses_70_10_20_by_time(data_file):
    illness = data_file("illness")
    raw, channels = read_csv(illness)
    assert raw.shape == (966, 7) and channels[-1] == "OT"
    borders = split_borders(len(raw), "ratio", 36)
    train, test = int(966 * 0.7), int(966 * 0.2)
    assert borders == {"train": (0, train), "valid": (train - 36, 966 - test), "test": (966 - test - 36, 966)}
    series = task_for(
        illness.parent, data={"format": "csv", "path": illness.name}, lookback=36, horizon=24
    ).load()
    assert series.windows("test") == test - 24 + 1


def test_windows_are_consecutive_rows_channel_major(data_file):
    etth1 = data_file("etth1")
    series = task_for(etth1.parent, data={"format": "csv", "path": etth1.name}, lookback=8, horizon=4).load()
    starts = np.array([0, 100, series.borders["test"][0]])
    batch = collate(series, starts)
    assert batch.inputs.shape == (3, 7, 8) and batch.targets.shape == (3, 7, 4)
    for row, s in enumerate(starts):
        np.testing.assert_array_equal(batch.inputs[row].numpy(), series.values[s : s + 8].T)
        np.testing.assert_array_equal(batch.targets[row].numpy(), series.values[s + 8 : s + 12].T)
    last = list(eval_batches(series, "test", 1000))[-1]
    assert (
        int(last.starts[-1]) + 8 + 4 == series.borders["test"][1]
    )  # the last target row is the split's last


def test_train_batches_cover_every_window_once_and_follow_the_generator():
    task = task_for(Path("."), data={"format": "synthetic", "rows": 400}, lookback=16, horizon=8)
    series = task.load()
    a = torch.cat([b.starts for b in train_batches(series, 32, torch.Generator().manual_seed(1))])
    b = torch.cat([b.starts for b in train_batches(series, 32, torch.Generator().manual_seed(1))])
    c = torch.cat([b.starts for b in train_batches(series, 32, torch.Generator().manual_seed(2))])
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert sorted(a.tolist()) == list(range(series.windows("train")))


@pytest.mark.parametrize(
    "text, line, words",
    [
        ("date,a,b\n2020-01-01,1,2\n2020-01-02,1\n", 3, "expected 3 fields"),
        ("date,a,b\n2020-01-01,1,2\n2020-01-02,1,x\n", 3, "'b': 'x' is not a number"),
        ("date,a,b\n2020-01-01,1,2\n2020-01-02,,3\n", 3, "'a': '' is not a number"),
        ("date,a,b\n2020-01-01,nan,2\n", 2, "not a finite number"),
        ("time,a\n1,2\n", 1, "no date column 'date'"),
    ],
)
def test_malformed_csv_names_file_and_line(tmp_path, text, line, words):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(DataError) as err:
        read_csv(path)
    assert str(err.value).startswith(f"{path}:{line}: ") and words in str(err.value)
    assert "\n" not in str(err.value)


def test_too_short_split_is_a_clear_error(tmp_path):
    with pytest.raises(DataError, match="too short for one window"):
        task_for(tmp_path, data={"format": "synthetic", "rows": 100}, lookback=96, horizon=96).load()


def test_bad_csv_fails_the_cli_with_one_line_and_exit_2(tmp_path, write_study, cli):
    (tmp_path / "bad.csv").write_text(
        "date,a,b\n" + "".join(f"t{i},{i},{i}\n" for i in range(300)) + "t,1,oops\n"
    )
    study = write_study(
        replace={
            "task": {
                "kind": "forecast",
                "data": {"format": "csv", "path": "bad.csv"},
                "lookback": 8,
                "horizon": 4,
            },
            "model.bias": [],
            "variants": {},
            "metrics": {"primary": "mse"},
            "train.loss": {"kind": "mse"},
        }
    )
    code, _, err = cli("run", study)
    assert code == 2 and "bad.csv:302: column 'b': 'oops' is not a number" in err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert "Traceback" not in err and len(errors) == 1


# ---------------------------------------------------------------------------------------
# Metrics and model


def test_window_errors_match_numpy():
    rng = np.random.default_rng(0)
    prediction, target = rng.normal(size=(5, 3, 7)), rng.normal(size=(5, 3, 7))
    errors = window_errors(prediction, target)
    for i in range(5):
        assert errors["mse"][i] == pytest.approx(
            np.mean([(p - t) ** 2 for p, t in zip(prediction[i].ravel(), target[i].ravel(), strict=False)])
        )
        assert errors["mae"][i] == pytest.approx(np.mean(np.abs(prediction[i] - target[i])))


def test_model_embeds_each_channel_window_and_heads_to_the_horizon(tmp_path):
    """With no blocks and an identity final norm replaced, the forecast is head(embed(x)) per channel,
    de-normalised per window (RevIN without affine parameters)."""
    from ablate.model.build import build_backbone

    study = load_study(_write(tmp_path, {"model": {"blocks": 0, "norm": {"kind": "none"}}}))
    task, series = study.task, study.task.load()
    ctx = study.build_context(study.variants["base"], task.max_len(series))
    model = task.build_model(build_backbone(study.variants["base"], ctx), ctx, series).eval()
    batch = collate(series, np.array([0, 5]))
    x = batch.inputs.double()
    mean, std = x.mean(-1, keepdim=True), torch.sqrt(x.var(-1, keepdim=True, unbiased=False) + 1e-5)
    w1, b1 = model.embed.weight.double(), model.embed.bias.double()
    w2, b2 = model.head.weight.double(), model.head.bias.double()
    expected = (((x - mean) / std) @ w1.T + b1) @ w2.T + b2
    torch.testing.assert_close(model(batch).double(), expected * std + mean, rtol=1e-4, atol=1e-4)


def test_channel_masked_sees_each_channels_lookback_window(tmp_path):
    # No attention.lookback: the window width comes from the task's lookback (16 in SMALL).
    study = load_study(_write(tmp_path, {"model": {"attention": {"kind": "channel_masked"}}}))
    task, series = study.task, study.task.load()
    seen = {}
    ctx = study.build_context(study.variants["base"], task.max_len(series))
    from ablate.model.build import build_backbone

    model = task.build_model(build_backbone(study.variants["base"], ctx), ctx, series)
    attention = model.backbone.blocks[0].attention
    assert attention.lookback == 16
    attention.register_forward_pre_hook(lambda m, args: seen.update(tokens=args[1]))
    batch = collate(series, np.array([3, 9]))
    model(batch)
    tokens = seen["tokens"]
    assert tokens.values.shape == (2, series.num_channels, 16) and not tokens.causal
    torch.testing.assert_close(tokens.values.mean(-1), torch.zeros(2, series.num_channels), atol=1e-5, rtol=0)


# ---------------------------------------------------------------------------------------
# Study level


SMALL = {
    "name": "fc",
    "task": {
        "kind": "forecast",
        "data": {"format": "synthetic", "channels": 3, "rows": 500, "seed": 0},
        "lookback": 16,
        "horizon": 8,
    },
    "model": {
        "dim": 16,
        "blocks": 1,
        "dropout": 0.0,
        "attention": {"kind": "softmax", "heads": 2},
        "ffn": {"kind": "mlp", "mult": 1},
        "bias": [],
    },
    "variants": {"none": {"attention": {"kind": "none"}}},
    "train": {"epochs": 3, "batch_size": 32, "lr": 3e-3, "loss": {"kind": "mse"}},
    "seeds": [0],
    "metrics": {"primary": "mse", "also": ["mae"]},
}


def deep_update(base: dict, patch: dict) -> dict:
    """Merge ``patch`` into ``base``; a component whose kind changes is replaced whole."""
    out = dict(base)
    for key, value in patch.items():
        old = out.get(key)
        same_kind = (
            isinstance(old, dict)
            and isinstance(value, dict)
            and value.get("kind", old.get("kind")) == old.get("kind")
        )
        out[key] = deep_update(old, value) if same_kind else value
    return out


def _write(tmp_path: Path, patch: dict | None = None) -> Path:
    spec = deep_update(SMALL, patch or {})
    spec["output"] = str(tmp_path / "runs")
    path = tmp_path / "fc.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.mark.parametrize(
    "attention",
    [
        {"kind": "softmax", "heads": 2},
        {"kind": "channel_masked", "heads": 2, "lookback": 16},
        {"kind": "fr_graph", "heads": 2},
        {"kind": "none"},
    ],
)
def test_trains_end_to_end_and_beats_predicting_the_last_window_mean(tmp_path, attention):
    study = load_study(_write(tmp_path, {"model": {"attention": attention}}))
    series = study.task.load()
    result = train_trial(study, study.variants["base"], 0, series, torch.device("cpu"))
    assert result.epochs == 3 and np.isfinite(result.summary["test.mse"])
    # per-window units, one per test window, averaging to the summary
    assert len(result.per_unit) == series.windows("test")
    assert result.per_unit["mse"].mean() == pytest.approx(result.summary["test.mse"], rel=1e-6)
    # a trivial forecaster: repeat each channel's window mean
    batch = collate(series, series.window_starts("test"))
    naive = batch.inputs.mean(-1, keepdim=True).expand_as(batch.targets).numpy()
    assert result.summary["test.mse"] < window_errors(naive, batch.targets.numpy())["mse"].mean()


def test_metrics_are_checked_and_lower_is_better(tmp_path, cli):
    task = task_for(tmp_path)
    assert task.check_metric("mse") is None and "expected mse or mae" in task.check_metric("ndcg@10")
    assert task.metric_higher_is_better("mse") is False
    code, _, err = cli("validate", _write(tmp_path, {"metrics": {"primary": "rmse"}}))
    assert code == 2 and "metrics.primary" in err and "rmse" in err


@pytest.mark.parametrize("kind", ["abs_pos", "rope", "rel_pos"])
def test_ordered_only_kinds_fail_validation_naming_forecast(tmp_path, cli, kind):
    code, _, err = cli("validate", _write(tmp_path, {"variants": {"pos": {"bias": [{"kind": kind}]}}}))
    assert code == 2 and "variants.pos.bias.0.kind" in err and kind in err and "forecast" in err
    assert "unordered" in err

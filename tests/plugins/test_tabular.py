"""The tabular task: loaders (the real FT-Transformer California split and declared CSVs with a
missing-value policy), train-only scaling, the feature tokenizer against its formula, heads and
metrics against numpy / sklearn, end-to-end runs, and the fr_graph per-epoch freeze hook."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from sklearn.metrics import accuracy_score, mean_absolute_error, mean_squared_error
from sklearn.preprocessing import QuantileTransformer

from ablate.errors import DataError
from ablate.model.build import build_backbone
from ablate.study.load import load_study
from ablate.training.trainer import train_trial
from ablate_plugins.graph_attention import FRGraphAttention
from ablate_plugins.tabular import FeatureTokenizer, TabularOptions, TabularTask
from ablate_plugins.tabular.batches import collate
from ablate_plugins.tabular.evaluation import predictions, row_values, summarise


def task_for(base: Path, **options) -> TabularTask:
    return TabularTask(TabularOptions.model_validate(options), base)


# ---------------------------------------------------------------------------------------
# FT-Transformer .npy layout, on the real California housing split


@pytest.fixture(scope="module")
def california_folder(data_file) -> Path:
    return data_file("california-housing")


@pytest.fixture(scope="module")
def california(california_folder):
    return task_for(california_folder.parent, data={"format": "npy", "path": california_folder.name}).load()


def test_california_loads_the_published_split(california, california_folder):
    info = json.loads((california_folder / "info.json").read_text())
    sizes = {s: len(california.splits[s]) for s in ("train", "valid", "test")}
    assert (
        sizes
        == {"train": info["train_size"], "valid": info["val_size"], "test": info["test_size"]}
        == {"train": 13209, "valid": 3303, "test": 4128}
    )
    assert california.numeric_names == info["N_cols"] and california.categorical_names == []
    assert california.task_type == "regression" and california.classes == 1 and california.cardinalities == []


def ft_quantile_reference(n_train: np.ndarray, noise: float) -> QuantileTransformer:
    """FT-Transformer's preprocessing: the quantile transform fitted on training features plus
    ``noise / max(std_j, noise)``-scaled standard normal draws from ``default_rng(0)``."""
    stds = np.std(n_train, axis=0, keepdims=True)
    draws = np.random.default_rng(0).standard_normal(n_train.shape)
    return QuantileTransformer(
        output_distribution="normal",
        n_quantiles=max(min(len(n_train) // 30, 1000), 10),
        subsample=10**9,
        random_state=0,
    ).fit(n_train + noise / np.maximum(stds, noise) * draws if noise else n_train)


def test_california_scaling_and_target_use_training_rows_only(california, california_folder):
    n_train, n_test = np.load(california_folder / "N_train.npy"), np.load(california_folder / "N_test.npy")
    y_train, y_test = np.load(california_folder / "y_train.npy"), np.load(california_folder / "y_test.npy")
    reference = ft_quantile_reference(n_train, 1e-3)  # the default quantile_noise
    np.testing.assert_allclose(
        california.splits["test"].numeric, reference.transform(n_test), rtol=1e-5, atol=1e-5
    )
    assert california.y_mean == pytest.approx(y_train.mean()) and california.y_std == pytest.approx(
        y_train.std()
    )
    np.testing.assert_allclose(
        california.splits["test"].y, (y_test - y_train.mean()) / y_train.std(), rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(california.splits["test"].y_raw, y_test, rtol=1e-6)
    # fitted on train: the test split is not re-standardised to mean 0
    assert abs(california.splits["test"].y.mean()) > 1e-3


def test_quantile_noise_zero_fits_on_the_raw_values_and_the_jitter_moves_tied_features(california_folder):
    """California has tied values (house age in whole years, capped incomes and ages): the
    published jitter spreads them over their quantiles, so the two fits differ there; noise 0 is
    the plain transform."""
    plain = task_for(
        california_folder.parent, data={"format": "npy", "path": california_folder.name}, quantile_noise=0.0
    ).load()
    n_train, n_test = (np.load(california_folder / f"N_{s}.npy") for s in ("train", "test"))
    np.testing.assert_allclose(
        plain.splits["test"].numeric,
        ft_quantile_reference(n_train, 0.0).transform(n_test),
        rtol=1e-5,
        atol=1e-5,
    )
    jittered = ft_quantile_reference(n_train, 1e-3).transform(n_test)
    moved = np.abs(plain.splits["test"].numeric - jittered).max(axis=0)
    # Median income (capped at 15.0001) and house age (whole years, capped at 52): well above rounding.
    assert moved[0] > 0.1 and moved[1] > 1e-2, moved


def test_missing_npy_folder_and_bad_info_are_clear(tmp_path):
    with pytest.raises(DataError, match="folder not found"):
        task_for(tmp_path, data={"format": "npy", "path": "nope"}).load()
    (tmp_path / "d").mkdir()
    (tmp_path / "d/info.json").write_text('{"task_type": "ranking"}')
    with pytest.raises(DataError, match="task_type must be"):
        task_for(tmp_path, data={"format": "npy", "path": "d"}).load()


# ---------------------------------------------------------------------------------------
# Declared CSV with a missing-value policy


def _csv(tmp_path: Path, rows: list[str]) -> Path:
    path = tmp_path / "t.csv"
    path.write_text("a,b,color,y\n" + "".join(r + "\n" for r in rows))
    return path


CSV_ROWS = [f"{i},{(i * 7) % 5},{'red' if i % 3 else 'blue'},{i * 0.5}" for i in range(40)]


def csv_task(tmp_path, rows, **data) -> TabularTask:
    _csv(tmp_path, rows)
    spec = {
        "format": "csv",
        "path": "t.csv",
        "target": "y",
        "task_type": "regression",
        "numeric": ["a", "b"],
        "categorical": ["color"],
        "missing": "error",
        "ratios": [0.5, 0.25, 0.25],
        **data,
    }
    return task_for(tmp_path, data=spec, scaling="standard")


def test_csv_split_standard_scaling_and_categories_fit_on_train(tmp_path):
    table = csv_task(tmp_path, CSV_ROWS).load()
    train, test = table.splits["train"], table.splits["test"]
    assert [len(table.splits[s]) for s in ("train", "valid", "test")] == [20, 10, 10]
    raw = np.array([[float(r.split(",")[0]), float(r.split(",")[1])] for r in CSV_ROWS])
    order = np.random.default_rng(0).permutation(40)
    mean, std = raw[order[:20]].mean(0), raw[order[:20]].std(0)
    np.testing.assert_allclose(test.numeric, (raw[order[30:]] - mean) / std, rtol=1e-5)
    assert table.cardinalities == [3]  # blue, red, + unseen
    colors = np.array([r.split(",")[2] for r in CSV_ROWS])[order[:20]]
    np.testing.assert_array_equal(
        train.categorical[:, 0], (colors == "red").astype(int)
    )  # sorted: blue 0, red 1


def test_missing_value_under_error_policy_names_file_line_and_column(tmp_path):
    rows = CSV_ROWS.copy()
    rows[4] = "4,,red,2.0"
    with pytest.raises(DataError) as err:
        csv_task(tmp_path, rows).load()
    assert str(err.value).startswith(f"{tmp_path / 't.csv'}:6: missing value in b")


def test_drop_and_impute_policies(tmp_path):
    rows = CSV_ROWS.copy()
    rows[0], rows[1], rows[2] = "NA,1,red,0.0", "1,2,,0.5", "2,?,red,1.0"
    dropped = csv_task(tmp_path, rows, missing="drop").load()
    assert sum(len(s) for s in dropped.splits.values()) == 37 and any("dropped" in n for n in dropped.notes)
    imputed = csv_task(tmp_path, rows, missing="impute").load()
    assert sum(len(s) for s in imputed.splits.values()) == 40
    assert all(np.isfinite(s.numeric).all() for s in imputed.splits.values())
    order = np.random.default_rng(0).permutation(40)
    where = {
        int(r): (s, i)
        for s in ("train", "valid", "test")
        for i, r in enumerate(
            order[{"train": slice(0, 20), "valid": slice(20, 30), "test": slice(30, 40)}[s]]
        )
    }
    split, i = where[0]  # row 0 had no 'a': filled with the training mean, which scales to 0 exactly
    assert imputed.splits[split].numeric[i, 0] == pytest.approx(0.0, abs=1e-6)
    assert imputed.splits["train"].numeric[:, 0].mean() == pytest.approx(0.0, abs=1e-6)
    split, i = where[1]  # missing colour → a category of its own (known only if the row is in train)
    assert imputed.cardinalities == [4]  # blue, red, missing, unseen
    assert imputed.splits[split].categorical[i, 0] in (0, 3)  # "\x00missing" sorts first; unseen is 3


def test_missing_target_is_never_filled_in(tmp_path):
    rows = CSV_ROWS.copy()
    rows[3] = "3,1,red,"
    with pytest.raises(DataError, match=r"t.csv:5: the target is missing"):
        csv_task(tmp_path, rows, missing="impute").load()


@pytest.mark.parametrize("row, words", [("3,x,red,1.0", "column 'b': 'x' is not a number")])
def test_non_number_names_file_line(tmp_path, row, words):
    rows = CSV_ROWS.copy()
    rows[7] = row
    with pytest.raises(DataError) as err:
        csv_task(tmp_path, rows).load()
    assert str(err.value).startswith(f"{tmp_path / 't.csv'}:9: ") and words in str(err.value)


def test_undeclared_column_and_declaration_errors(tmp_path):
    with pytest.raises(DataError, match=r"t.csv:1: declared column\(s\) zz not in the header"):
        csv_task(tmp_path, CSV_ROWS, numeric=["a", "zz"]).load()
    with pytest.raises(Exception, match="missing"):  # the policy must be declared
        TabularOptions.model_validate(
            {
                "data": {
                    "format": "csv",
                    "path": "t.csv",
                    "target": "y",
                    "task_type": "regression",
                    "numeric": ["a"],
                }
            }
        )


def test_bad_csv_fails_the_cli_with_one_line_and_exit_2(tmp_path, write_study, cli):
    rows = CSV_ROWS.copy()
    rows[10] = "10,3,red,oops"
    _csv(tmp_path, rows)
    study = write_study(
        replace={
            "task": {
                "kind": "tabular",
                "data": {
                    "format": "csv",
                    "path": "t.csv",
                    "target": "y",
                    "task_type": "regression",
                    "numeric": ["a", "b"],
                    "categorical": ["color"],
                    "missing": "error",
                },
            },
            "model.bias": [],
            "variants": {},
            "metrics": {"primary": "rmse"},
            "train.loss": {},
        }
    )
    code, _, err = cli("run", study)
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and "t.csv:12: column 'y': 'oops' is not a number" in errors[0]
    assert "Traceback" not in err


# ---------------------------------------------------------------------------------------
# Tokenizer, head, metrics


def test_feature_tokenizer_matches_the_formula():
    torch.manual_seed(0)
    tok = FeatureTokenizer(numeric=3, cardinalities=[2, 4], dim=5).double()
    x = torch.randn(4, 3, dtype=torch.float64)
    c = torch.tensor([[0, 3], [1, 0], [1, 2], [0, 1]])
    out = tok(x, c)
    assert out.shape == (4, 3 + 2 + 1, 5)
    W, B, E = tok.weight.detach(), tok.bias.detach(), tok.categories.weight.detach()
    for r in range(4):
        for j in range(3):
            torch.testing.assert_close(out[r, j], x[r, j] * W[1 + j] + B[j])
        torch.testing.assert_close(out[r, 3], E[int(c[r, 0])] + B[3])
        torch.testing.assert_close(out[r, 4], E[2 + int(c[r, 1])] + B[4])  # offset = cardinality of feature 0
        torch.testing.assert_close(out[r, 5], W[0])  # readout, last: weight row 0, no bias


def test_predictions_and_metrics_match_sklearn():
    rng = np.random.default_rng(0)
    out = rng.normal(size=(50, 1))
    y = rng.normal(3.0, 2.0, size=50)
    pred = predictions(out, "regression", 3.0, 2.0)
    np.testing.assert_allclose(pred, out[:, 0] * 2.0 + 3.0)
    values = row_values(pred, y, "regression")
    summary = summarise(values, ["rmse", "mae"])
    assert summary["rmse"] == pytest.approx(math.sqrt(mean_squared_error(y, pred)))
    assert summary["mae"] == pytest.approx(mean_absolute_error(y, pred))
    labels = rng.integers(0, 3, size=50)
    logits = rng.normal(size=(50, 3))
    acc = summarise(row_values(predictions(logits, "multiclass", 0, 1), labels, "multiclass"), ["accuracy"])
    assert acc["accuracy"] == pytest.approx(accuracy_score(labels, logits.argmax(1)))
    binary = rng.integers(0, 2, size=50)
    logit = rng.normal(size=(50, 1))
    acc = summarise(row_values(predictions(logit, "binclass", 0, 1), binary, "binclass"), ["accuracy"])
    assert acc["accuracy"] == pytest.approx(accuracy_score(binary, 1 / (1 + np.exp(-logit[:, 0])) > 0.5))


def test_metric_names_follow_the_task_type(tmp_path, california_folder):
    assert task_for(tmp_path).check_metric("rmse") is None
    assert "expected accuracy" in task_for(
        tmp_path, data={"format": "synthetic", "task_type": "binclass"}
    ).check_metric("rmse")
    california = task_for(california_folder.parent, data={"format": "npy", "path": california_folder.name})
    assert california.check_metric("accuracy") and california.check_metric("rmse") is None
    assert not california.metric_higher_is_better("rmse") and task_for(tmp_path).metric_higher_is_better(
        "accuracy"
    )


# ---------------------------------------------------------------------------------------
# End to end on synthetic data


SMALL = {
    "name": "tab",
    "task": {"kind": "tabular", "data": {"format": "synthetic", "rows": 500, "numeric": 3, "categorical": 2}},
    "model": {
        "dim": 16,
        "blocks": 1,
        "dropout": 0.0,
        "attention": {"kind": "softmax", "heads": 2},
        "ffn": {"kind": "reglu", "hidden": 32},
        "bias": [],
    },
    "train": {"epochs": 6, "batch_size": 64, "lr": 3e-3},
    "seeds": [0],
    "metrics": {"primary": "rmse", "also": ["mae"]},
}


def _write(tmp_path: Path, task_data: dict | None = None, model: dict | None = None, **top) -> Path:
    spec = json.loads(json.dumps(SMALL))
    spec["task"]["data"].update(task_data or {})
    spec["model"].update(model or {})
    spec.update(top)
    spec["output"] = str(tmp_path / "runs")
    path = tmp_path / "tab.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


SOFTMAX, FR_GRAPH = {"kind": "softmax", "heads": 2}, {"kind": "fr_graph", "heads": 2}


@pytest.mark.parametrize(
    "task_type, metric, attention",
    [
        ("regression", "rmse", SOFTMAX),
        ("regression", "rmse", FR_GRAPH),
        ("binclass", "accuracy", SOFTMAX),
        ("multiclass", "accuracy", FR_GRAPH),
    ],
)
def test_trains_end_to_end_and_beats_the_constant_predictor(tmp_path, task_type, metric, attention):
    study = load_study(
        _write(tmp_path, {"task_type": task_type}, {"attention": attention}, metrics={"primary": metric})
    )
    table = study.task.load()
    result = train_trial(study, study.variants["base"], 0, table, torch.device("cpu"))
    test = table.splits["test"]
    assert len(result.per_unit) == len(test) and sorted(result.per_unit["unit"]) == sorted(test.rows)
    if task_type == "regression":
        constant = math.sqrt(np.mean((test.y_raw - table.splits["train"].y_raw.mean()) ** 2))
        assert result.summary["test.rmse"] < 0.8 * constant
        assert math.sqrt(result.per_unit["rmse"].mean()) == pytest.approx(result.summary["test.rmse"])
    else:
        majority = np.bincount(table.splits["train"].y).argmax()
        assert result.summary["test.accuracy"] > np.mean(test.y == majority) + 0.1


@pytest.mark.parametrize("attention", [SOFTMAX, FR_GRAPH], ids=["softmax", "fr_graph"])
@pytest.mark.parametrize("placement", ["pre", "post"])
def test_the_final_block_computes_the_readout_alone_and_agrees_with_the_full_forward(
    tmp_path, attention, placement
):
    """The readout is the last token and the final block runs only it (FT-Transformer's and
    T2G-Former's last layer, [CLS] query only): the head's input equals the readout token of
    every block run in full."""
    model_options = {
        "attention": attention,
        "blocks": 2,
        "norm": {"kind": "layernorm", "placement": placement},
    }
    study = load_study(_write(tmp_path, model=model_options))
    table = study.task.load()
    variant = study.variants["base"]
    ctx = study.build_context(variant, study.task.max_len(table))
    model = study.task.build_model(build_backbone(variant, ctx), ctx, table).double().eval()
    batch = collate(table.splits["train"], np.arange(32))
    x = model.tokenizer(batch.numeric.double(), batch.categorical)
    tokens = model.token_context(*x.shape[:2], x.device)
    assert tokens.readout[:, -1].all() and tokens.readout.sum() == len(x)
    assert tokens.positions[0].tolist() == [1, 2, 3, 4, 5, 0]  # the readout keeps column 0
    full = model.backbone(x, tokens)  # [b, n, d]: every token through every block
    torch.testing.assert_close(model(batch), model.head(full[:, -1]))


def test_ordered_only_and_missing_feature_kinds_fail_validation_naming_tabular(tmp_path, cli):
    code, _, err = cli("validate", _write(tmp_path, variants={"pos": {"bias": [{"kind": "abs_pos"}]}}))
    assert code == 2 and "variants.pos.bias.0.kind" in err and "abs_pos" in err and "tabular" in err
    code, _, err = cli(
        "validate", _write(tmp_path, variants={"cm": {"attention": {"kind": "channel_masked"}}})
    )
    assert code == 2 and "channel_masked" in err and "values" in err and "tabular" in err


# ---------------------------------------------------------------------------------------
# fr_graph: freeze after k epochs through the task's per-epoch hook


def _built(tmp_path: Path, **fr_options):
    study = load_study(_write(tmp_path, model={"attention": {"kind": "fr_graph", "heads": 2, **fr_options}}))
    table = study.task.load()
    variant = study.variants["base"]
    ctx = study.build_context(variant, study.task.max_len(table))
    return study, table, study.task.build_model(build_backbone(variant, ctx), ctx, table)


def test_fr_graph_freezes_after_k_epochs_and_its_topology_stops_moving(tmp_path):
    study, table, model = _built(tmp_path, freeze_after=2)
    attention = next(m for m in model.modules() if isinstance(m, FRGraphAttention))
    study.task.on_epoch_end(model, 1)
    assert not attention.topology_frozen
    study.task.on_epoch_end(model, 2)
    assert attention.topology_frozen
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    batch = collate(table.splits["train"], np.arange(64))
    for _ in range(2):
        optimizer.zero_grad(set_to_none=True)
        study.task.loss(model, batch, study.loss, torch.Generator()).backward()
        optimizer.step()
    moved = {k for k, v in model.named_parameters() if not torch.equal(v, before[k])}
    assert moved and not any(".topology." in k for k in moved)


def test_train_loop_calls_the_epoch_hook_every_epoch(tmp_path, monkeypatch):
    study, table, _ = _built(tmp_path, freeze_after=1)
    calls = []
    monkeypatch.setattr(type(study.task), "on_epoch_end", lambda self, model, epoch: calls.append(epoch))
    train_trial(study, study.variants["base"], 0, table, torch.device("cpu"))
    assert calls == list(range(1, study.spec.train.epochs + 1))


def test_fr_graph_topology_lr_mult_acts_as_an_adam_learning_rate(tmp_path):
    """Initialised 1/mult smaller, the column embeddings under Adam(lr) follow the same
    directions as unscaled ones under Adam(mult × lr): the topology stays identical."""
    mult, lr = 8.0, 0.01
    tops = []
    for scale, rate in ((mult, lr), (1.0, lr * mult)):
        torch.manual_seed(0)
        _, table, model = _built(tmp_path, topology_lr_mult=scale)
        topology = next(m for m in model.modules() if isinstance(m, FRGraphAttention)).topology
        optimizer = torch.optim.Adam([topology.col_head], lr=rate, eps=1e-12)
        slots = torch.arange(6).expand(2, 6)
        for _ in range(5):  # a loss through the straight-through topology (sigmoid gradient)
            optimizer.zero_grad(set_to_none=True)
            (topology(slots, None) * torch.linspace(-1, 1, 36).view(6, 6)).sum().backward()
            optimizer.step()
        tops.append(torch.nn.functional.normalize(topology.col_head.detach(), dim=-1))
    torch.testing.assert_close(tops[0], tops[1], rtol=1e-4, atol=1e-5)

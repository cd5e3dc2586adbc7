"""End to end: a tiny study through the CLI — Optuna, MLflow, report — and its resume; and every
variant's shapes and size checked before any training (:mod:`ablate.study.sizes`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import optuna
import pandas as pd
import pytest
import torch
from mlflow import MlflowClient
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend

from ablate.errors import StudyError
from ablate.model.build import build_backbone
from ablate.study import sizes
from ablate.study.load import load_study
from ablate.tracking.results import load_results
from ablate.training.preflight import trained_sizes

STUDIES = sorted((Path(__file__).resolve().parents[1] / "studies").glob("*.yaml"))


@pytest.mark.heavy
def test_run_writes_tracking_and_report(write_study, cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    study = write_study()
    code, out, err = cli("run", study, "--quiet")
    assert code == 0, err
    report_dir = tmp_path / "runs" / "tiny" / "report"
    assert f"report: {report_dir / 'report.html'}" in out.replace("\n", "")
    for name in ("report.md", "report.html", "results.csv"):
        assert (report_dir / name).is_file(), name
    results = pd.read_csv(report_dir / "results.csv")
    pairs = sorted(zip(results.variant, results.seed, strict=True))
    assert pairs == [("base", 0), ("base", 1), ("mlp", 0), ("mlp", 1)]
    assert results["test.ndcg@10"].between(0, 1).all()
    assert (results["params"] > 0).all() and (results["tokens_per_s"] > 0).all()

    # MLflow: one parent, one child per trial, tags, per-epoch metrics, per-user artifact.
    uri = f"sqlite:///{tmp_path / 'runs' / 'tiny' / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("tiny")
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if r.data.tags.get("ablate.role") == "study"]
    children = [r for r in runs if r.data.tags.get("ablate.role") == "trial"]
    assert len(parents) == 1 and len(children) == 4
    for run in children:
        tags = run.data.tags
        assert tags["mlflow.parentRunId"] == parents[0].info.run_id
        assert tags["component.attention"] == "softmax"
        assert tags["component.ffn"] in ("pointwise", "mlp(mult=2.0)")
        assert run.info.status == "FINISHED"
        history = client.get_metric_history(run.info.run_id, "valid.ndcg_at_10")  # MLflow allows no "@"
        assert sorted(m.step for m in history) == [1, 2]  # the curve alone: no extra point at step 0
    loaded = load_results(uri, "tiny")
    assert len(loaded.units) == 4 * 120  # every synthetic user, every trial
    # The results' validation figure is the restored best state's (best.valid.*), not the last epoch's,
    # and equals the curve's point at the best epoch.
    for run in children:
        history = client.get_metric_history(run.info.run_id, "valid.ndcg_at_10")
        best = client.get_metric_history(run.info.run_id, "best.valid.ndcg_at_10")
        row = loaded.results.set_index("run_id").loc[run.info.run_id]
        assert len(best) == 1 and row["valid.ndcg@10"] == best[0].value
        assert best[0].value == next(m.value for m in history if m.step == row["best_epoch"])
    assert sorted(loaded.curves.epoch.unique()) == [1, 2]
    assert set(loaded.units.columns) >= {"variant", "seed", "unit", "ndcg@10", "hr@10"}

    # Optuna: one complete trial per (variant, seed).
    ostudy = optuna.load_study(
        study_name="tiny",
        storage=JournalStorage(JournalFileBackend(str(tmp_path / "runs" / "tiny" / "optuna.journal"))),
    )
    keys = sorted(
        (t.user_attrs["variant"], t.user_attrs["seed"])
        for t in ostudy.trials
        if t.state == optuna.trial.TrialState.COMPLETE
    )
    assert keys == [("base", 0), ("base", 1), ("mlp", 0), ("mlp", 1)]

    # Running again retrains nothing; `ablate report` rebuilds from the store alone.
    code, out, err = cli("run", study, "--quiet")
    assert code == 0 and "4 trial(s) were already complete" in err
    assert len(client.search_runs([exp.experiment_id])) == 5
    (report_dir / "report.html").unlink()
    code, out, err = cli("report", "--experiment", "tiny", "--tracking-uri", uri)
    assert code == 0 and (report_dir / "report.html").is_file()  # runs/<experiment>/report here
    code, out, err = cli("report", study, "--reports", tmp_path / "paper")  # e.g. the committed reports/
    assert code == 0 and (tmp_path / "paper" / "tiny" / "report.html").is_file()

    code, out, _ = cli("status", study)
    assert code == 0 and "base" in out and "mlp" in out


@pytest.mark.heavy
def test_changed_settings_are_not_mixed_with_old_trials(write_study, cli, tmp_path, monkeypatch):
    """Re-running after editing what trials were trained with refuses to mix the two versions;
    adding a variant keeps the finished trials and trains only the new one."""
    monkeypatch.chdir(tmp_path)
    code, _, err = cli("run", write_study({"train": {"epochs": 1}, "seeds": [0]}), "--quiet")
    assert code == 0, err
    code, _, err = cli("run", write_study({"train": {"epochs": 2}, "seeds": [0]}), "--quiet")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "different settings" in err and "base" in err and "mlp" in err and "--output" in err
    code, _, err = cli(
        "run",
        write_study({"train": {"epochs": 1}, "seeds": [0], "variants": {"wide": {"dim": 32}}}),
        "--quiet",
    )
    assert code == 0, err
    assert "2 trial(s) were already complete" in err
    results = pd.read_csv(tmp_path / "runs" / "tiny" / "report" / "results.csv")
    assert sorted(results.variant) == ["base", "mlp", "wide"]


def test_results_take_validation_from_the_restored_best_state_not_the_last_epoch(tmp_path):
    from ablate.tracking.store import Tracker

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = Tracker(uri, "best", artifact_root=tmp_path / "artifacts")
    parent = tracker.study_run("best", {}, {})
    run = tracker.start_trial(parent, "base-0", {"variant": "base", "seed": "0"}, {})
    for epoch, value in ((1, 0.50), (2, 0.30)):  # best at epoch 1, the last epoch worse
        tracker.log_metrics(run, {"valid.ndcg@10": value, "train.loss": 1.0 / epoch}, step=epoch)
    tracker.finish_trial(
        run, {"valid.ndcg@10": 0.50, "test.ndcg@10": 0.40}, pd.DataFrame({"unit": [1], "ndcg@10": [0.4]})
    )
    loaded = load_results(uri, "best")
    row = loaded.results.iloc[0]
    assert row["valid.ndcg@10"] == 0.50 and row["test.ndcg@10"] == 0.40
    curve = loaded.curves[loaded.curves.metric == "valid.ndcg@10"]
    assert sorted(zip(curve.epoch, curve.value, strict=False)) == [(1, 0.50), (2, 0.30)]


# -- shapes and sizes, before any training -------------------------------------------------


@pytest.mark.parametrize("path", STUDIES, ids=lambda p: p.stem)
def test_the_size_estimate_counts_the_backbone_exactly(path):
    """The backbone built on the meta device with one block, that block counted as often as the
    variant has blocks, gives the built backbone's parameters: the estimate follows ablate.model.build."""
    study = load_study(path, check_files=False)
    for variant in study.variants.values():
        ctx = study.build_context(variant, 30)
        built = build_backbone(variant, ctx)
        counted = sizes.backbone_parameters(variant, ctx)
        assert counted == sum(p.numel() for p in built.parameters()), variant.name


def test_trained_sizes_count_the_whole_model(write_study):
    study = load_study(write_study())
    data = study.task.load()
    found = trained_sizes(study, data)
    for name, variant in study.variants.items():
        ctx = study.build_context(variant, study.task.max_len(data))
        model = study.task.build_model(build_backbone(variant, ctx), ctx, data)
        assert found[name].parameters == sum(p.numel() for p in model.parameters())
        assert 0 < found[name].activations < 10**9 and found[name].fits()


def test_meta_builds_skip_weight_fills_and_stay_fast():
    """Initialisers on the meta device do nothing: torch's fallbacks for some would import its
    compiler (1–2 s of every `ablate validate`)."""
    code = (
        "import sys, torch; from ablate.study.sizes import on_meta\n"
        "with on_meta(): e = torch.nn.Embedding(5, 3); torch.nn.init.trunc_normal_(e.weight)\n"
        "assert e.weight.is_meta and 'torch._dynamo' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["model.attention.heads=3"],
            "model.attention: softmax attention: model width dim=16 is not divisible",
        ),
        (["model.dim=2e9"], "model.dim: 2000000000 gives ≈ 2.4e19 parameters"),
        # the base fits (6.0e10 parameters: 960 GB); its variant with a wider FFN does not
        (["model.dim=1e5"], "study.yaml:29: variants.mlp.dim: 100000 gives ≈ 8.0e10 parameters"),
        (["model.blocks=1e9"], "model.blocks: 1000000000 gives ≈ 1.7e12 parameters"),
        (["train.batch_size=1e9"], "train.batch_size: variant 'base': 1000000000 gives ≈ 2,752 parameters"),
        (["variants.mlp.ffn.mult=1e11"], "variants.mlp.ffn: ≈ 5.3e13 parameters"),
    ],
)
def test_a_model_past_the_limit_is_refused_naming_the_key(write_study, overrides, message):
    with pytest.raises(StudyError) as exc:
        load_study(write_study(), overrides=overrides)
    assert message in str(exc.value)
    assert "over the limit of 1 TB" in str(exc.value) or "divisible" in message


def test_the_tokens_and_the_task_are_blamed_once_the_data_are_known(write_study):
    study = load_study(write_study(), overrides=["task.max_len=1e9"])  # the backbone alone fits
    with pytest.raises(
        StudyError, match=r"override task.max_len=1e9: task.max_len: variant 'base': 1000000000 tok"
    ):
        trained_sizes(study, study.task.load())
    study = load_study(write_study())
    variant = study.variants["base"]
    ctx = study.build_context(variant, 16)
    _, problem = sizes.oversized(variant, ctx, 64, task_parameters=lambda ctx: 10**12)
    assert problem is not None and problem.key == ("task",) and "embedding and head" in problem.message


def test_validate_reads_the_data_and_shows_each_size(write_study, cli):
    code, out, err = cli("validate", write_study())
    assert code == 0, err
    assert "parameters, ≈" in out and "data: users 120" in out


def test_a_grid_points_problem_is_reported_at_its_axis(write_study):
    path = write_study({"grid": {"attention.heads": [1, 3], "ffn.kind": ["pointwise"]}})
    with pytest.raises(StudyError) as exc:
        load_study(path)
    line = path.read_text().splitlines().index("  attention.heads:") + 1
    assert str(exc.value).startswith(f"{path}:{line}: grid.attention.heads: grid point 'attention.heads=3,")


def test_preflight_runs_one_forward_pass_and_leaves_no_trace(write_study):
    """A shape only a forward pass meets (rope's head width is the attention's) fails before any
    training; the check leaves the global random state and the jagged kernels' probe untouched."""
    from ablate import jagged
    from ablate.training.preflight import preflight

    study = load_study(write_study({"variants": {"odd": {"dim": 15, "attention": {"heads": 3}}}}))
    data = study.task.load()
    before = torch.get_rng_state()
    assert set(preflight(study, data)) == {"base", "mlp", "odd"}
    assert torch.equal(torch.get_rng_state(), before)
    study = load_study(
        write_study({"variants": {"odd": {"dim": 15, "attention": {"heads": 3}, "bias": [{"kind": "rope"}]}}})
    )
    probed = "HAVE_FBGEMM" in vars(jagged)
    with pytest.raises(
        StudyError, match=r"study.yaml:\d+: variants.odd: a training step fails: rope: .* is 5 \(odd\)"
    ):
        preflight(study, data)
    assert ("HAVE_FBGEMM" in vars(jagged)) == probed

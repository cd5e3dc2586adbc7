"""End to end: a tiny study through the CLI — Optuna, MLflow, report — and its resume."""

from __future__ import annotations

import optuna
import pandas as pd
from mlflow import MlflowClient
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend

from ablate.results import load_results


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
        assert sorted(m.step for m in history if m.step > 0) == [1, 2]
    loaded = load_results(uri, "tiny")
    assert len(loaded.units) == 4 * 120  # every synthetic user, every trial
    # The results' validation figure is the restored best state's (step 0), not the last epoch's.
    for run in children:
        history = client.get_metric_history(run.info.run_id, "valid.ndcg_at_10")
        final = [m.value for m in history if m.step == 0]
        row = loaded.results.set_index("run_id").loc[run.info.run_id]
        assert len(final) == 1 and row["valid.ndcg@10"] == final[0]
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
    from ablate.track import Tracker

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

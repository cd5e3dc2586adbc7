"""Tracking hygiene: the study's MLflow run ends FINISHED / FAILED / KILLED and is reopened by a
resumed run; the report and the resolved study are attached to it; parameters are flattened with
plain values; runs carry the ablate version and the study's git commit; Optuna's final trials show
(variant, seed) as parameters; the data summary, CPU time and how costs were measured reach the
report's inputs."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import optuna
import pandas as pd
import pytest
import torch
import yaml
from mlflow import MlflowClient
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend

import ablate
import ablate.drive.execution as execution
from ablate import drive, stopping
from ablate.study.load import load_study
from ablate.tasks import BASELINES_ARTIFACT
from ablate.tracking.names import PARAM_VALUE_CHARS, flat_params
from ablate.tracking.results import load_results
from ablate.tracking.store import provenance
from ablate.training.trainer import Checkpoint, TrialFailed, train_trial

FAST = {"train": {"epochs": 1}, "seeds": [0], "report": {"calibration": 0, "bootstrap": 200}}
REPORT_FILES = {"report.md", "report.html", "results.csv", "comparisons.csv", "table.tex"}


def _client(tmp_path: Path, name: str = "tiny") -> tuple[MlflowClient, str]:
    client = MlflowClient(f"sqlite:///{tmp_path / 'runs' / name / 'mlflow.db'}")
    return client, client.get_experiment_by_name(name).experiment_id


def _runs(tmp_path: Path, role: str) -> list:
    client, exp = _client(tmp_path)
    return client.search_runs([exp], f"tags.`ablate.role` = '{role}'")


def _parent(tmp_path: Path):
    (parent,) = _runs(tmp_path, "study")
    return parent


def _artifacts(client: MlflowClient, run_id: str, path: str | None = None) -> set[str]:
    found = set()
    for item in client.list_artifacts(run_id, path):
        found |= _artifacts(client, run_id, item.path) if item.is_dir else {item.path}
    return found


def test_a_finished_study_closes_its_run_with_the_report_and_the_study_attached(cli, write_study, tmp_path):
    study_file = write_study(FAST)
    code, _, err = cli("run", study_file, "--quiet")
    assert code == 0, err
    client, exp = _client(tmp_path)
    parent = _parent(tmp_path)
    assert parent.info.status == "FINISHED"
    assert _artifacts(client, parent.info.run_id) == {
        "study.resolved.yaml",
        BASELINES_ARTIFACT,  # the task's trivial baselines and protocol, for a report without the data
        *(f"report/{name}" for name in REPORT_FILES),
    }
    local = client.download_artifacts(parent.info.run_id, "study.resolved.yaml", str(tmp_path / "dl"))
    resolved = yaml.safe_load(Path(local).read_text())
    assert resolved == load_study(study_file).spec.model_dump(mode="json")
    assert resolved["train"]["epochs"] == 1 and resolved["model"]["attention"] == {
        "kind": "softmax",
        "heads": 1,
    }

    # Provenance on the parent and on every trial; the study lives outside any git repository here.
    trials = _runs(tmp_path, "trial")
    for run in (parent, *trials):
        assert run.data.tags["ablate.version"] == ablate.__version__
        assert "ablate.git_commit" not in run.data.tags and "ablate.git_dirty" not in run.data.tags
    # The parent's parameters, flattened too.
    assert parent.data.params["task.kind"] == "seqrec" and parent.data.params["task.data.users"] == "120"
    assert parent.data.params["seeds"] == "[0]" and parent.data.params["metrics.primary"] == "ndcg@10"
    summary = json.loads(parent.data.tags["ablate.data_summary"])
    assert summary["users"] == 120 and summary["test units"] == 120 and summary["items"] == 60

    # Trial parameters: one plain value per setting, component defaults resolved.
    params = next(r for r in trials if r.data.tags["variant"] == "mlp").data.params
    assert "model" not in params and "train.loss" not in params
    expected = {
        "variant": "mlp",
        "seed": "0",
        "model.dim": "16",
        "model.attention.kind": "softmax",
        "model.attention.heads": "1",
        "model.ffn.kind": "mlp",
        "model.ffn.mult": "2.0",
        "model.norm.placement": "pre",
        "model.bias.0.kind": "abs_pos",
        "train.lr": "0.003",
        "train.betas": "[0.9, 0.98]",
        "train.loss.kind": "bce",
        "train.vary.init": "true",
        "train.device": "auto",
    }
    assert {k: params.get(k) for k in expected} == expected
    assert not [v for v in params.values() if v.startswith(("{'", "[{"))]  # no Python reprs, no JSON objects

    # The report's inputs: meta and CPU time.
    loaded = load_results(f"sqlite:///{tmp_path / 'runs' / 'tiny' / 'mlflow.db'}", "tiny")
    meta = loaded.meta
    assert meta["ablate_version"] == ablate.__version__ and "git_commit" not in meta
    assert meta["data_summary"] == summary
    assert yaml.safe_load(meta["resolved_study"]) == resolved
    assert "CPU time" in meta["cost_note"] and "wall time" in meta["cost_note"]
    assert (loaded.results["cpu_s"] > 0).all() and (loaded.results["wall_s"] > 0).all()

    # Optuna: the final trials show (variant, seed) as parameters (optuna-dashboard's views).
    final = optuna.load_study(
        study_name="tiny",
        storage=JournalStorage(JournalFileBackend(str(tmp_path / "runs" / "tiny" / "optuna.journal"))),
    )
    complete = [t for t in final.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(complete) == 2
    assert all(
        t.params == {"variant": t.user_attrs["variant"], "seed": t.user_attrs["seed"]} for t in complete
    )

    # A rerun with nothing to train leaves the run FINISHED and the report attached again.
    code, _, err = cli("run", study_file, "--quiet")
    assert code == 0 and "already complete" in err
    assert _parent(tmp_path).info.status == "FINISHED" and len(_runs(tmp_path, "trial")) == 2


def test_failed_trials_close_the_run_failed_and_a_retry_reopens_it(cli, write_study, tmp_path, monkeypatch):
    study_file = write_study(FAST)
    real = execution.train_trial

    def failing(study, variant, *args, **kwargs):
        if variant.name == "mlp":
            raise TrialFailed("loss became nan at epoch 1")
        return real(study, variant, *args, **kwargs)

    monkeypatch.setattr(execution, "train_trial", failing)
    code, _, err = cli("run", study_file, "--quiet")
    assert code == 1 and "failed" in err
    assert _parent(tmp_path).info.status == "FAILED"

    statuses = []
    monkeypatch.setattr(execution, "train_trial", real)
    seen = drive.Reporter.trial
    monkeypatch.setattr(
        drive.Reporter,
        "trial",
        lambda self, *a: (statuses.append(_parent(tmp_path).info.status), seen(self, *a))[1],
    )
    study = load_study(study_file)
    summary = drive.run_study(study, drive.Stores.for_study(study), retry_failed=True)
    assert summary.finished == 1 and statuses == ["RUNNING"]  # reopened while the retried trial trained
    assert _parent(tmp_path).info.status == "FINISHED"


class _StopAfterFirstEpoch(drive.Reporter):
    def epoch(self, epoch, logged):
        stopping.request()  # as SIGTERM / Ctrl-C would: the trial stops at its next safe point


def test_an_interrupted_study_is_killed_then_reopened_and_finished(write_study, tmp_path):
    study = load_study(write_study({**FAST, "train": {"epochs": 2}}))
    stores = drive.Stores.for_study(study)
    with stopping.stop_signals(), pytest.raises(KeyboardInterrupt):
        drive.run_study(study, stores, _StopAfterFirstEpoch())
    assert _parent(tmp_path).info.status == "KILLED"
    killed = [r for r in _runs(tmp_path, "trial") if r.info.status == "KILLED"]
    assert len(killed) == 1 and killed[0].data.tags["ablate.failure"] == "interrupted"

    summary = drive.run_study(study, stores)
    assert summary.finished == 2
    assert _parent(tmp_path).info.status == "FINISHED" and len(_runs(tmp_path, "study")) == 1


def test_flat_params_are_plain_dotted_and_within_mlflows_limits():
    flat = flat_params(
        {
            "model": {
                "attention": {"kind": "softmax", "heads": 2},
                "bias": [{"kind": "alibi"}, {"kind": "t5"}],
            },
            "train": {"loss": {"kind": "bce", "negatives": 3}, "betas": [0.9, 0.98], "grad_clip": None},
            "search.model.dropout": 0.1,
            "valid.ndcg@10": 1,
            "odd key: {x}": True,
            "long": "x" * 2000,
            "empty": {},
        }
    )
    assert flat == {
        "model.attention.kind": "softmax",
        "model.attention.heads": "2",
        "model.bias.0.kind": "alibi",
        "model.bias.1.kind": "t5",
        "train.loss.kind": "bce",
        "train.loss.negatives": "3",
        "train.betas": "[0.9, 0.98]",
        "train.grad_clip": "null",
        "search.model.dropout": "0.1",
        "valid.ndcg_at_10": "1",
        "odd key_ _x_": "true",
        "long": "x" * (PARAM_VALUE_CHARS - 1) + "…",
        "empty": "{}",
    }


def test_provenance_names_the_commit_of_the_repository_holding_the_study(tmp_path):
    code = {k for k in provenance(tmp_path / "study.yaml") if not k.startswith("ablate.env.")}
    assert code == {"ablate.version"}  # not a repository (the machine's conditions: tests/test_provenance.py)

    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "start")
    study = tmp_path / "study.yaml"
    study.write_text("name: x\n")
    head = subprocess.run(
        ["git", "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    tags = provenance(study)
    assert tags["ablate.git_commit"] == head and tags["ablate.git_dirty"] == "true"  # the study is untracked
    git("add", "study.yaml")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "study")
    tags = provenance(study)
    assert tags["ablate.git_dirty"] == "false" and tags["ablate.git_commit"] != head
    study.write_text("name: y\n")
    assert provenance(study)["ablate.git_dirty"] == "true"


def test_a_checkpoint_written_before_cpu_time_was_measured_still_resumes(write_study, tmp_path):
    study = load_study(write_study({"train": {"epochs": 2}}))
    data = study.task.load()
    checkpoint = Checkpoint(tmp_path / "ck.pt", signature="sig", every_s=0)

    def stop(epoch, logged):
        if epoch == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train_trial(
            study, study.variants["base"], 0, data, torch.device("cpu"), on_epoch=stop, checkpoint=checkpoint
        )
    state = torch.load(checkpoint.path, weights_only=True)
    assert state["epoch"] == 1 and state["cpu_s"] > 0
    del state["cpu_s"]  # as an older version wrote it
    torch.save(state, checkpoint.path)
    resumed = train_trial(study, study.variants["base"], 0, data, torch.device("cpu"), checkpoint=checkpoint)
    assert resumed.resumed_from == 1 and resumed.cpu_s > 0 and resumed.costs()["cpu_s"] == resumed.cpu_s


def test_each_task_summarises_its_data(tmp_path):
    from ablate_plugins.forecast.options import ForecastOptions
    from ablate_plugins.forecast.task import ForecastTask
    from ablate_plugins.seqrec.options import SeqRecOptions
    from ablate_plugins.seqrec.task import SeqRecTask
    from ablate_plugins.tabular.options import TabularOptions
    from ablate_plugins.tabular.task import TabularTask

    seqrec = SeqRecTask(
        SeqRecOptions.model_validate({"data": {"format": "synthetic", "users": 50, "items": 30}}), tmp_path
    )
    data = seqrec.load()
    summary = seqrec.data_summary(data)
    assert summary["users"] == 50 and summary["items"] == data.num_items
    assert summary["interactions"] == data.num_interactions
    assert summary["valid units"] == summary["test units"] == 50 and 0 < summary["train units"] <= 50
    assert summary["mean sequence length"] == pytest.approx(data.num_interactions / 50, abs=0.01)

    forecast = ForecastTask(
        ForecastOptions.model_validate(
            {"data": {"format": "synthetic", "rows": 400}, "lookback": 16, "horizon": 8}
        ),
        tmp_path,
    )
    series = forecast.load()
    summary = forecast.data_summary(series)
    assert summary["channels"] == series.num_channels and summary["timesteps"] == 400
    assert [summary[f"{s} windows"] for s in ("train", "valid", "test")] == [
        series.windows(s) for s in ("train", "valid", "test")
    ]

    tabular = TabularTask(
        TabularOptions.model_validate(
            {"data": {"format": "synthetic", "rows": 200, "task_type": "multiclass"}}
        ),
        tmp_path,
    )
    table = tabular.load()
    summary = tabular.data_summary(table)
    assert sum(summary[f"{s} rows"] for s in ("train", "valid", "test")) == 200
    assert summary["numeric features"] == 4 and summary["categorical features"] == 2
    assert summary["target"] == f"multiclass ({table.classes} classes)"


def test_a_store_made_again_after_its_folder_was_deleted_is_written_in_the_same_process(tmp_path):
    """A notebook runs a study, deletes its output folder and runs it again: the new store is
    written, not the deleted file MLflow kept an engine on ("attempt to write a readonly
    database")."""
    from ablate.tracking.store import Tracker

    uri = f"sqlite:///{tmp_path / 'out' / 'mlflow.db'}"
    first = Tracker(uri, "exp")
    first.client.create_run(first.experiment_id, run_name="before")
    shutil.rmtree(tmp_path / "out")
    again = Tracker(uri, "exp")
    assert again.created  # the experiment is made again, in the new file
    run = again.client.create_run(again.experiment_id, run_name="after")
    again.client.set_terminated(run.info.run_id, "FINISHED")
    names = [r.info.run_name for r in MlflowClient(uri).search_runs([again.experiment_id])]
    assert names == ["after"]


def test_a_trials_curve_is_sent_in_batches_and_whole_by_its_end(tmp_path, monkeypatch):
    """Curve points: at most one request per interval from a run's start; the rest with the
    trial's final numbers (or its failure): every point of every curve in MLflow at the end; a
    trial's artifacts written without reading its run back."""
    from ablate.tracking import curves
    from ablate.tracking.store import Tracker, read_units

    monkeypatch.setattr(curves, "METRICS_PER_BATCH", 7)  # a final request over the limit is cut
    tracker = Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "exp", artifact_root=tmp_path / "artifacts")
    parent = tracker.study_run("study", {}, {})
    requests = []
    real = tracker.client.log_batch
    monkeypatch.setattr(
        tracker.client, "log_batch", lambda run_id, **kw: requests.append(kw) or real(run_id, **kw)
    )
    finished = tracker.start_trial(parent, "finished", {}, {})
    failed = tracker.start_trial(parent, "failed", {}, {})
    requests.clear()
    for step in range(1, 11):
        tracker.log_metrics(finished, {"train.loss": 1.0 / step}, step=step)
        tracker.log_metrics(failed, {"train.loss": 2.0 / step}, step=step)
    assert requests == []  # the runs just started: every point waits for the interval
    tracker.curves.every_s = 0.0  # an interval passed: the next point is sent with those waiting
    tracker.log_metrics(finished, {"train.loss": 0.05}, step=11)
    assert [len(r["metrics"]) for r in requests] == [7, 4]
    tracker.curves.every_s = 60.0
    tracker.log_metrics(finished, {"train.loss": 0.04}, step=12)
    from mlflow.tracking._tracking_service.client import TrackingServiceClient

    reads = []
    real_get = TrackingServiceClient.get_run
    monkeypatch.setattr(
        TrackingServiceClient, "get_run", lambda self, r: reads.append(r) or real_get(self, r)
    )
    tracker.attach_text(finished, '{"lr": 0.1}', "trained_with.json")
    tracker.finish_trial(finished, {"test.acc": 0.9}, pd.DataFrame({"unit": [1, 2], "acc": [0.8, 1.0]}))
    assert reads == []  # the artifacts' location came with the run's creation
    tracker.fail_trial(failed, "loss became nan at epoch 11")
    client = MlflowClient(tracker.uri)
    assert [m.step for m in client.get_metric_history(finished, "train.loss")] == list(range(1, 13))
    assert [m.value for m in client.get_metric_history(failed, "train.loss")] == [
        2.0 / s for s in range(1, 11)
    ]
    assert client.get_run(finished).data.metrics["test.acc"] == 0.9
    assert json.loads(
        Path(client.download_artifacts(finished, "trained_with.json", str(tmp_path))).read_text()
    ) == {"lr": 0.1}
    assert read_units(client, client.get_run(finished))["acc"].tolist() == [0.8, 1.0]
    assert client.get_run(failed).data.tags["ablate.failure"] == "loss became nan at epoch 11"
    assert client.get_run(failed).info.status == "FAILED"
    assert not tracker.curves.pending

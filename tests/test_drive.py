"""The driver at full strength: search per variant, parameter matching, failures, OOM retry,
status, bad search spaces and storage URLs, exit statuses, folders checked before training."""

from __future__ import annotations

import math

import optuna
import pandas as pd
import pytest
import torch
from mlflow import MlflowClient
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend

import ablate.drive as drive
import ablate.drive.execution as execution
from ablate.study.load import load_study

COMPLETE = optuna.trial.TrialState.COMPLETE


def _storage(tmp_path, name="tiny"):
    return JournalStorage(JournalFileBackend(str(tmp_path / "runs" / name / "optuna.journal")))


def _mlflow(tmp_path, name="tiny"):
    client = MlflowClient(f"sqlite:///{tmp_path / 'runs' / name / 'mlflow.db'}")
    return client, client.get_experiment_by_name(name).experiment_id


@pytest.mark.parametrize(
    "space, expected",
    [
        ({"model.ffn.nope": {"type": "int", "low": 1, "high": 2}}, "does not fit variant 'base'"),
        ({"train.nope": {"type": "float", "low": 0.1, "high": 0.2}}, "unknown key"),
        ({"seeds": {"type": "int", "low": 1, "high": 2}}, "dotted model.* or train.* keys"),
        ({"train.lr": {"type": "categorical", "choices": []}}, "an empty categorical"),
        (
            {"train.lr": {"type": "float", "low": 0.0, "high": 0.01, "log": True}},
            "a log range needs bounds > 0",
        ),
        ({"train.lr": {"type": "float", "low": 0.1, "high": 0.01}}, "is above high"),
        (
            {"model.norm.placement": {"type": "categorical", "choices": ["pre", "middle"]}},
            "'middle' does not fit variant",
        ),
        # pointwise has no mult
        ({"model.ffn.mult": {"type": "float", "low": 1.0, "high": 2.0}}, "does not fit variant 'base'"),
    ],
)
def test_bad_search_spaces_fail_before_training(cli, write_study, tmp_path, space, expected):
    study = write_study({"search": {"trials": 2, "space": space}})
    for command in ("validate", "run"):
        code, _, err = cli(command, study, "--quiet") if command == "run" else cli(command, study)
        assert code == 2, err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
        assert "search.space" in err and expected in err, err
    assert not (tmp_path / "runs").exists()  # nothing was trained or even created


def test_search_budget_needs_a_space_and_a_space_needs_a_budget(cli, write_study):
    code, _, err = cli("validate", write_study({"search": {"trials": 2}}))
    assert code == 2 and "search.space" in err
    code, _, err = cli(
        "validate",
        write_study({"search": {"space": {"train.lr": {"type": "float", "low": 0.001, "high": 0.01}}}}),
    )
    assert code == 2 and "search.trials" in err and "budget per variant" in err


def test_search_per_variant_then_best_params_over_seeds(cli, write_study, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    space = {
        "train.lr": {"type": "float", "low": 0.001, "high": 0.01, "log": True},
        "model.dropout": {"type": "categorical", "choices": [0.0, 0.3]},
    }
    study = write_study(
        {
            "search": {"trials": 3, "sampler": "random", "pruner": "median", "space": space},
            "train": {"epochs": 2},
            "report": {"calibration": 0, "bootstrap": 200},
        }
    )
    code, out, err = cli("run", study, "--quiet")
    assert code == 0, err

    storage = _storage(tmp_path)
    best = {}
    for variant in ("base", "mlp"):
        search = optuna.load_study(study_name=f"tiny.search.{variant}", storage=storage)
        counted = [t for t in search.trials if t.state in (COMPLETE, optuna.trial.TrialState.PRUNED)]
        assert sorted(t.user_attrs["slot"] for t in counted) == [0, 1, 2]  # the same budget per variant
        for t in counted:
            assert 0.001 <= t.params["train.lr"] <= 0.01 and t.params["model.dropout"] in (0.0, 0.3)
        best[variant] = search.best_trial.params
        values = [t.value for t in search.trials if t.state == COMPLETE]
        assert search.best_trial.value == max(values)  # ndcg: higher is better
    final = optuna.load_study(study_name="tiny", storage=storage)
    keys = sorted(
        (t.user_attrs["variant"], t.user_attrs["seed"]) for t in final.trials if t.state == COMPLETE
    )
    assert keys == [("base", 0), ("base", 1), ("mlp", 0), ("mlp", 1)]

    client, exp = _mlflow(tmp_path)
    finals = client.search_runs([exp], "tags.`ablate.role` = 'trial' and attributes.status = 'FINISHED'")
    assert len(finals) == 4
    for run in finals:  # each final trial trained with its variant's best searched parameters
        wanted = best[run.data.tags["variant"]]
        assert math.isclose(float(run.data.params["train.lr"]), wanted["train.lr"])
        assert float(run.data.params["search.model.dropout"]) == wanted["model.dropout"]
        assert float(run.data.params["model.dropout"]) == wanted["model.dropout"]  # flattened
    assert len(client.search_runs([exp], "tags.`ablate.role` = 'search'")) == 6
    report = (tmp_path / "runs" / "tiny" / "report" / "report.md").read_text()
    assert "## Searched parameters" in report and "train.lr" in report

    # A rerun trains nothing: searches and finals are complete.
    code, _, err = cli("run", study, "--quiet")
    assert code == 0 and "4 trial(s) were already complete" in err
    assert len(client.search_runs([exp], "tags.`ablate.role` = 'search'")) == 6


def test_grid_search_visits_every_point_once(cli, write_study, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    study = write_study(
        {
            "search": {
                "sampler": "grid",
                "space": {
                    "train.lr": {"type": "categorical", "choices": [0.002, 0.004]},
                    "model.dropout": {"type": "float", "low": 0.0, "high": 0.2, "step": 0.2},
                },
            },
            "train": {"epochs": 1},
            "seeds": [0],
        },
        replace={"variants": {}},
    )
    code, _, err = cli("run", study, "--quiet")
    assert code == 0, err
    search = optuna.load_study(study_name="tiny.search.base", storage=_storage(tmp_path))
    points = sorted(
        (t.params["train.lr"], round(t.params["model.dropout"], 6))
        for t in search.trials
        if t.state == COMPLETE
    )
    assert points == [(0.002, 0.0), (0.002, 0.2), (0.004, 0.0), (0.004, 0.2)]


def _ffn_params(d: int, hidden: int) -> int:
    return 2 * d * hidden + hidden + d  # Linear(d, k) + Linear(k, d), with biases


def test_match_params_scales_the_declared_width_knob(cli, write_study, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    study_file = write_study(
        {
            "match_params": True,
            "seeds": [0],
            "train": {"epochs": 1},
            "variants": {"mlp": {"ffn": {"kind": "mlp", "mult": 4}}},
        }
    )
    code, _, err = cli("run", study_file, "--quiet")
    assert code == 0, err
    client, exp = _mlflow(tmp_path)
    runs = {r.data.tags["variant"]: r for r in client.search_runs([exp], "tags.`ablate.role` = 'trial'")}
    d = 16
    # The base's pointwise FFN is d → d → d: an MLP matches it exactly at hidden width d.
    base_params = int(runs["base"].data.params["match.base_params"])
    mlp = runs["mlp"].data.params
    assert int(mlp["match.base_params"]) == base_params
    assert int(mlp["match.before"]) - base_params == _ffn_params(d, 4 * d) - _ffn_params(d, d)
    assert abs(int(mlp["match.params"]) - base_params) <= 0.02 * base_params
    assert round(float(mlp["match.model.ffn.mult"]) * d) == d
    assert mlp["model.ffn.mult"] == mlp["match.model.ffn.mult"]  # the model trained with the matched width
    report = (tmp_path / "runs" / "tiny" / "report" / "report.md").read_text()
    assert "## Parameter matching" in report and "model.ffn.mult" in report


def test_match_params_without_a_knob_is_one_line(cli, write_study, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    study = write_study(
        {
            "match_params": True,
            "seeds": [0],
            "train": {"epochs": 1},
            "variants": {"no-ffn": {"ffn": {"kind": "none"}}},
        }
    )
    code, _, err = cli("run", study, "--quiet")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "no-ffn" in err and "declares no width option" in err


@pytest.mark.heavy
def test_nan_loss_and_crash_fail_alone_and_are_reported(cli, write_study, tmp_path, monkeypatch):
    """A diverging variant and a crashing trial are recorded as failed with their reason; the
    other trials finish; status and the report show the failures."""
    monkeypatch.chdir(tmp_path)
    from ablate_plugins.ffn import MLPFFN

    task_cls = type(load_study(write_study()).task)
    real_loss, real_train = task_cls.loss, execution.train_trial

    def diverging(self, model, batch, loss, generator):
        value = real_loss(self, model, batch, loss, generator)
        return value * float("nan") if any(isinstance(m, MLPFFN) for m in model.modules()) else value

    def crashing(study, variant, seed, *args, **kwargs):
        if variant.name == "base" and seed == 1:
            raise ValueError("boom in a component")
        return real_train(study, variant, seed, *args, **kwargs)

    monkeypatch.setattr(task_cls, "loss", diverging)
    monkeypatch.setattr(execution, "train_trial", crashing)
    study = write_study({"report": {"calibration": 0, "bootstrap": 200}})
    code, _, err = cli("run", study, "--quiet")
    assert code == 1
    assert "mlp seed 0: loss became nan at epoch 1" in err
    assert "base seed 1: ValueError: boom in a component" in err

    final = optuna.load_study(study_name="tiny", storage=_storage(tmp_path))
    states = {
        (t.user_attrs["variant"], t.user_attrs["seed"]): (t.state.name, t.user_attrs.get("failure"))
        for t in final.trials
    }
    assert states == {
        ("base", 0): ("COMPLETE", None),
        ("base", 1): ("FAIL", "ValueError: boom in a component"),
        ("mlp", 0): ("FAIL", "loss became nan at epoch 1"),
        ("mlp", 1): ("FAIL", "loss became nan at epoch 1"),
    }
    code, out, _ = cli("status", study)
    assert code == 0
    assert "failed: mlp seed 1: loss became nan at epoch 1" in out
    assert "failed: base seed 1: ValueError: boom" in out
    row = next(line for line in out.splitlines() if line.strip("│ ").startswith("mlp"))
    assert [c.strip() for c in row.strip("│").split("│")] == ["mlp", "0", "0", "2", "0"]
    report = (tmp_path / "runs" / "tiny" / "report" / "report.md").read_text()
    assert "## Failed trials" in report and "loss became nan at epoch 1" in report

    # A rerun leaves failures alone (exit 1 again, nothing retrained) unless asked to retry.
    monkeypatch.setattr(task_cls, "loss", real_loss)
    monkeypatch.setattr(execution, "train_trial", real_train)
    code, _, err = cli("run", study, "--quiet")
    assert code == 1 and "1 trial(s) were already complete" in err
    code, _, err = cli("run", study, "--quiet", "--retry-failed")
    assert code == 0, err
    code, out, _ = cli("status", study)
    assert "4/4 trials done" in out and "finished" in out


def test_out_of_memory_retries_once_at_half_batch_size(cli, write_study, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    real_train = execution.train_trial
    batches: list[tuple[str, int]] = []

    def tight_memory(study, variant, seed, *args, **kwargs):
        batch = study.spec.train.batch_size
        batches.append((variant.name, batch))
        limit = 32 if variant.name == "base" else 0  # base fits at half the batch; mlp never fits
        if batch > limit:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real_train(study, variant, seed, *args, **kwargs)

    monkeypatch.setattr(execution, "train_trial", tight_memory)
    code, _, err = cli("run", write_study({"seeds": [0], "train": {"epochs": 1}}), "--quiet")
    assert code == 1
    assert batches == [("base", 64), ("base", 32), ("mlp", 64), ("mlp", 32)]
    assert "mlp seed 0: out of memory at batch size 32 (after a retry at half the batch size)" in err
    final = optuna.load_study(study_name="tiny", storage=_storage(tmp_path))
    base = next(t for t in final.trials if t.user_attrs["variant"] == "base")
    assert base.state == COMPLETE and base.user_attrs["oom_retry_batch_size"] == 32
    client, exp = _mlflow(tmp_path)
    run = client.get_run(base.user_attrs["mlflow_run_id"])
    assert run.data.tags["ablate.oom_retry"] == "batch size 32"


def test_status_counts_and_eta(cli, write_study, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, _ = cli("status", write_study())
    assert code == 0 and "not started (4 trials planned)" in out
    study = load_study(write_study({"train": {"epochs": 1}, "seeds": [0]}))
    stores = drive.Stores.for_study(study)
    drive.run_study(study, stores)
    # Two more seeds: 2 trials done, 4 left; ETA = 4 × mean wall time of the finished ones.
    study = load_study(write_study({"train": {"epochs": 1}, "seeds": [0, 1, 2]}))
    drive.prepare(study, stores)
    rows = drive.progress(study, stores)
    assert {v: (r.done, r.running, r.failed, r.left) for v, r in rows.items()} == {
        "base": (1, 0, 0, 2),
        "mlp": (1, 0, 0, 2),
    }
    walls = [w for r in rows.values() for w in r.walls]
    assert len(walls) == 2 and drive.eta_seconds(rows) == pytest.approx(4 * sum(walls) / 2)
    # Checkpointed trials count as their unfinished share: base seed 1 at 1 of 4 epochs, mlp seed 2
    # at 3 of 4 (a search slot's name parses too; an unrelated file is ignored).
    saved = {
        "base-seed1": {"epoch": 1, "epochs": 4},
        "mlp-search2": {"epoch": 3, "epochs": 4},
        "notes": {"epoch": 1, "epochs": 2},
    }
    fractions = drive.checkpointed_fractions(saved)
    assert fractions == {"base": [0.25], "mlp": [0.75]}
    assert drive.eta_seconds(rows, fractions) == pytest.approx(3 * sum(walls) / 2)
    code, out, _ = cli("status", write_study({"train": {"epochs": 1}, "seeds": [0, 1, 2]}))
    assert code == 0 and "2/6 trials done" in out and "ETA: " in out


def test_eta_leaves_copied_trials_walls_out_once_one_is_trained():
    """Copied trials (``--reuse``) bring their donors' wall times, another machine's or day's:
    the ETA uses them only while no trial has been trained here."""
    rows = {
        "base": drive.VariantStatus(done=3, left=1, walls=[100.0], copied_walls=[1000.0, 1000.0]),
        "mlp": drive.VariantStatus(done=1, left=2, copied_walls=[500.0]),
    }
    assert drive.eta_seconds(rows) == pytest.approx(3 * 100.0)
    rows["base"].walls.clear()
    assert drive.eta_seconds(rows) == pytest.approx(3 * (1000.0 + 1000.0 + 500.0) / 3)


def test_unreachable_storage_is_one_line(cli, write_study, tmp_path):
    study = write_study()
    url = "postgresql://ablate:secret@127.0.0.1:9/nothing"
    code, _, err = cli("worker", study, "--storage", url, "--quiet")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "cannot reach the Optuna storage postgresql://ablate:***@127.0.0.1:9/nothing" in err
    assert "secret" not in err and "connection" in err.lower()  # the driver's own reason, e.g. refused
    assert not (tmp_path / "runs").exists()  # nothing created before the storage answered


def test_results_frame_carries_failures(write_study, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    from ablate.tracking.results import load_results

    def crashing(*args, **kwargs):
        raise RuntimeError("kernel exploded\nsecond line")

    monkeypatch.setattr(execution, "train_trial", crashing)
    study = load_study(write_study({"seeds": [0]}, replace={"variants": {}}))
    summary = drive.run_study(study, drive.Stores.for_study(study))
    assert summary.failed == [("base", 0, "RuntimeError: kernel exploded")]
    client, exp = _mlflow(tmp_path)
    assert client.get_experiment(exp)  # the store exists even with no finished trial
    loaded = load_results(f"sqlite:///{tmp_path / 'runs' / 'tiny' / 'mlflow.db'}", "tiny")
    assert loaded.results.empty
    assert loaded.failures.to_dict("records") == [
        {"variant": "base", "seed": 0, "reason": "RuntimeError: kernel exploded"}
    ]
    assert isinstance(loaded.failures, pd.DataFrame)


def test_unreachable_tracking_server_is_one_line(cli, write_study, tmp_path):
    code, _, err = cli("worker", write_study(), "--tracking-uri", "http://127.0.0.1:9", "--quiet")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: cannot reach MLflow tracking server http://127.0.0.1:9")
    assert not (tmp_path / "runs" / "tiny" / "mlflow.db").exists()


def test_tracking_calls_retry_while_sqlite_is_locked(monkeypatch):
    """Workers share one MLflow SQLite file: a call that meets 'database is locked' is retried;
    any other error is raised at once."""
    from ablate.tracking import store as track

    monkeypatch.setattr(track.time, "sleep", lambda s: None)

    class Flaky:
        calls = 0

        def log_batch(self, run_id):
            Flaky.calls += 1
            if Flaky.calls < 3:
                raise RuntimeError("(sqlite3.OperationalError) database is locked")
            return f"logged {run_id}"

        def broken(self):
            Flaky.calls += 1
            raise RuntimeError("no such table: runs")

    client = track._Retrying(Flaky())
    assert client.log_batch("r1") == "logged r1" and Flaky.calls == 3
    Flaky.calls = 0
    with pytest.raises(RuntimeError, match="no such table"):
        client.broken()
    assert Flaky.calls == 1

    class Dropped:  # a busy tracking server broke the connection mid-answer (32 workers, issue 56)
        calls = 0

        def log_batch(self, run_id):
            Dropped.calls += 1
            if Dropped.calls < 2:
                raise RuntimeError("API request failed with exception ('Connection broken: IncompleteRead')")
            return f"logged {run_id}"

    assert track._Retrying(Dropped()).log_batch("r2") == "logged r2" and Dropped.calls == 2


def test_precision_auto_is_bf16_on_cuda_only_and_bf16_casts_cpu_matmuls():
    from ablate.training.trainer import training_autocast, trains_in_bf16

    a, b = torch.randn(4, 8), torch.randn(8, 3)
    with training_autocast("auto", torch.device("cpu")):
        assert (a @ b).dtype == torch.float32
    with training_autocast("fp32", torch.device("cpu")):
        assert (a @ b).dtype == torch.float32
    with training_autocast("bf16", torch.device("cpu")):
        assert (a @ b).dtype == torch.bfloat16
    assert trains_in_bf16("auto", torch.device("cuda")) and not trains_in_bf16("fp32", torch.device("cuda"))


def test_every_trial_failing_exits_1_and_says_so_in_one_line(cli, write_study, tmp_path, monkeypatch):
    """No finished trial means no report: `run` lists the failures and ends with one line, exit
    status 1 (the README's 'trials failed'), and so does `report`; `status` still shows them."""
    monkeypatch.chdir(tmp_path)

    def crashing(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(execution, "train_trial", crashing)
    study = write_study({"seeds": [0]})
    store = f"sqlite:///{tmp_path / 'runs' / 'tiny' / 'mlflow.db'}"
    line = (
        f"error: no finished trials for 'tiny' in {store} (2 failed; `ablate run --retry-failed` trains "
        f"them again), so no report"
    )
    code, _, err = cli("run", study, "--quiet")
    assert code == 1 and "Traceback" not in err
    assert [e for e in err.splitlines() if e.startswith("error:")] == [line]
    assert "failed base seed 0: RuntimeError: boom" in err and "failed mlp seed 0: RuntimeError: boom" in err
    code, _, err = cli("report", study)
    assert code == 1 and err.strip() == line
    code, out, _ = cli("status", study)
    assert code == 0 and "failed: base seed 0: RuntimeError: boom" in out


@pytest.mark.parametrize("statuses, code", [((-9, 0), 1), ((2, 2), 2), ((130, 1), 1)])
def test_a_worker_that_crashed_fails_the_run(cli, write_study, tmp_path, monkeypatch, statuses, code):
    """`run --workers N`: a worker killed or crashed ends the run with status 1 (resume by running
    again); workers that all met bad input (and said so) end it with 2."""
    import subprocess

    monkeypatch.chdir(tmp_path)
    real = subprocess.Popen
    ended = iter(statuses)

    class Ended:  # a worker process that has already exited
        def __init__(self, cmd, **kwargs):
            self.returncode = next(ended)

        def poll(self):
            return self.returncode

        def wait(self, timeout=None):
            return self.returncode

        def terminate(self):
            pass

    def popen(cmd, **kwargs):
        return Ended(cmd, **kwargs) if "worker" in cmd else real(cmd, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", popen)
    got, _, err = cli("run", write_study({"seeds": [0]}), "--workers", "2", "--quiet")
    crashed = [s for s in statuses if s not in (0, 1)]
    assert got == code and "Traceback" not in err
    assert f"error: {len(crashed)} of 2 workers exited with status {crashed[0]}; run the study again" in err


def test_a_stop_while_the_data_loads_ends_the_run_with_130(cli, write_study, tmp_path, monkeypatch):
    """SIGTERM's handler is in place before the data is read or generated, so a loader's check
    point (`stopping.check`) ends the run there: status 130 and the line saying how to resume."""
    import os
    import signal
    import time

    from ablate import stopping

    monkeypatch.chdir(tmp_path)
    study = write_study({"seeds": [0]})
    task_cls = type(load_study(study).task)
    calls = []

    def slow_load(self):
        calls.append(signal.getsignal(signal.SIGTERM))
        assert calls[-1] not in (signal.SIG_DFL, signal.SIG_IGN, None)  # else SIGTERM would end pytest
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(500):  # a loader's loop over rows or users
            stopping.check()
            time.sleep(0.01)
        raise AssertionError("the stop request was not seen")

    monkeypatch.setattr(task_cls, "load", slow_load)
    before = signal.getsignal(signal.SIGTERM)
    code, _, err = cli("run", study, "--quiet")
    assert calls and code == 130 and "Traceback" not in err, err
    assert f"interrupted: trials in flight are re-queued; `ablate run {study}` resumes" in err
    assert signal.getsignal(signal.SIGTERM) is before  # the caller's handler is back


@pytest.mark.parametrize("workers", ["1", "2"])
def test_bad_data_stops_a_new_study_before_any_store_is_created(cli, write_study, tmp_path, workers):
    """A study that never ran reads its data before it creates its stores: a bad data file is one
    line and exit 2 with no MLflow or Optuna store left behind (nor their schemas' cost paid)."""
    (tmp_path / "u.data").write_text("1\t2\t3\t4\n1\t3\tx\t5\n")
    data = {"format": "movielens", "path": str(tmp_path / "u.data")}
    code, _, err = cli("run", write_study(replace={"task.data": data}), "--workers", workers, "--quiet")
    assert code == 2 and "got rating 'x', which is not a number" in err and len(err.splitlines()) == 1, err
    output = tmp_path / "runs" / "tiny"
    assert not (output / "mlflow.db").exists() and not (output / "optuna.journal").exists()


def test_storage_and_tracking_values_that_name_a_store(tmp_path):
    from ablate.drive.stores import storage_problem
    from ablate.tracking.store import tracking_problem

    for good in (
        "postgresql://ablate:secret@db-host/ablate",
        "postgresql+psycopg://u@h:5432/db",
        f"sqlite:///{tmp_path}/optuna.db",
        str(tmp_path / "shared.journal"),
        str(tmp_path / "optuna_journal_storage.log"),
        "relative.journal",
    ):
        assert storage_problem(good) is None, good
    for bad, why in (
        ("notaurl", "not a storage URL or journal file"),
        ("runs/x/optuna.db", "not a storage URL or journal file"),  # a SQLite file needs sqlite:///
        ("localhost:5432/db", "not a storage URL or journal file"),
        ("postgres://u@h/db", "unknown database kind 'postgres'"),
        ("http://host:5000", "unknown database kind 'http'"),
        ("sqlite://", "in-memory"),
        ("sqlite:///:memory:", "in-memory"),
    ):
        assert why in (storage_problem(bad) or ""), bad
    for good in ("http://host:5000", "https://h", "sqlite:///x/mlflow.db", "postgresql://u@h/mlflow"):
        assert tracking_problem(good) is None
    assert "not a tracking URI" in tracking_problem("notaurl")
    assert "not a tracking URI" in tracking_problem("runs/tiny/mlflow.db")


def test_folder_problem_names_what_is_in_the_way(tmp_path):
    from ablate.drive import folder_problem

    (tmp_path / "afile").write_text("x")
    assert folder_problem(tmp_path / "new" / "deeper") is None
    assert not (tmp_path / "new").exists()  # the probe creates nothing
    assert folder_problem(tmp_path) is None and list(tmp_path.iterdir()) == [tmp_path / "afile"]
    assert folder_problem(tmp_path / "afile") == f"{tmp_path / 'afile'} is a file, not a folder"
    assert folder_problem(tmp_path / "afile" / "x" / "y") == (
        f"{tmp_path / 'afile'} is a file, not a folder, so {tmp_path / 'afile' / 'x' / 'y'} cannot be made"
    )
    assert "file name too long" in folder_problem(tmp_path / ("n" * 300))


def test_read_only_output_and_report_folders_stop_before_training(cli, write_study, tmp_path, monkeypatch):
    """A folder the user may not write in (simulated: root, as CI runs, writes in a folder whatever
    its permission bits; tests/test_corpus_runs.py also covers /sys, which even root cannot)."""
    import errno
    import tempfile

    import ablate.study.folders

    monkeypatch.chdir(tmp_path)
    locked = tmp_path / "locked"
    locked.mkdir()
    real = tempfile.TemporaryFile

    def refuse_locked(*args, dir=None, **kwargs):  # noqa: A002 - tempfile's own keyword
        if dir is not None and str(dir).startswith(str(locked)):
            raise PermissionError(errno.EACCES, "Permission denied", str(dir))
        return real(*args, dir=dir, **kwargs)

    monkeypatch.setattr(ablate.study.folders.tempfile, "TemporaryFile", refuse_locked)
    study = write_study({"seeds": [0]})
    code, _, err = cli("run", study, "--output", str(locked / "runs"), "--quiet")
    assert code == 2 and err.strip() == (
        f"error: --output {locked / 'runs'}: cannot write in {locked}: permission denied"
    )
    code, _, err = cli("run", study, "--reports", str(locked), "--quiet")
    assert code == 2
    assert err.strip() == f"error: --reports {locked}: cannot write in {locked}: permission denied"
    assert not (tmp_path / "runs" / "tiny" / "checkpoints").exists()


def test_the_output_key_is_named_with_its_line(cli, write_study, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("x")
    study = write_study(replace={"output": "afile/runs"})
    line = next(i for i, text in enumerate(study.read_text().splitlines(), 1) if text.startswith("output:"))
    code, _, err = cli("run", study, "--quiet")
    assert code == 2 and err.strip() == (
        f"error: {study}:{line}: output: {tmp_path / 'afile'} is a file, not a folder, so "
        f"{tmp_path / 'afile' / 'runs'} cannot be made"
    )

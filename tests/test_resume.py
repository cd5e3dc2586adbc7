"""Kill real `ablate` processes with SIGKILL at named points (during training, evaluation,
tracking, and between MLflow and Optuna); every (variant, seed) ends COMPLETE exactly once in
Optuna and FINISHED exactly once in MLflow, and nothing finished is retrained."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys

import optuna
from mlflow import MlflowClient
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend

from ablate.faults import KILL_ENV

PLANNED = sorted((v, s) for v in ("base", "mlp") for s in (0, 1))
COMPLETE = optuna.trial.TrialState.COMPLETE


def _optuna(out):
    storage = JournalStorage(JournalFileBackend(str(out / "optuna.journal")))
    return optuna.load_study(study_name="tiny", storage=storage).trials


def _runs(out, status=None):
    client = MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
    exp = client.get_experiment_by_name("tiny")
    flt = "tags.`ablate.role` = 'trial'" + (f" and attributes.status = '{status}'" if status else "")
    return client.search_runs([exp.experiment_id], flt, max_results=1000)


def _key(t):
    return t.user_attrs["variant"], t.user_attrs["seed"]


def _complete(out) -> dict:
    return {_key(t): t.user_attrs["mlflow_run_id"] for t in _optuna(out) if t.state == COMPLETE}


def test_killed_at_every_point_resumes_exactly_once(write_study, tmp_path, cli):
    study = write_study(
        {"train": {"epochs": 1}, "seeds": [0, 1], "report": {"calibration": 0, "bootstrap": 200}}
    )
    out = tmp_path / "runs" / "tiny"
    cmd = [
        sys.executable,
        "-m",
        "ablate.cli",
        "run",
        str(study),
        "--quiet",
        "--reports",
        str(tmp_path / "reports"),
    ]
    kept: dict = {}
    # Each run finishes some trials, then dies at the named point of a later one.
    for point in ("train@2", "evaluate@2", "track@2", "tell@1"):
        env = {**os.environ, KILL_ENV: point}
        proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == -signal.SIGKILL, (point, proc.returncode, proc.stderr[-2000:])
        complete = _complete(out)
        assert all(kept[k] == complete[k] for k in kept), point  # nothing finished was retrained
        code, status, _ = cli("status", study)  # the dead run's trial is left, not running
        rows = [
            [c.strip() for c in line.strip("│").split("│")]
            for line in status.splitlines()
            if line.startswith("│")
        ]
        assert code == 0 and [r[2] for r in rows] == ["0", "0"], status
        assert sum(int(r[1]) for r in rows) == len(complete) and sum(int(r[4]) for r in rows) == 4 - len(
            complete
        )
        kept = complete
        if point.startswith("tell"):
            # The worst moment: MLflow has the result, Optuna does not know it.
            finished = {(r.data.tags["variant"], int(r.data.tags["seed"])) for r in _runs(out, "FINISHED")}
            assert len(finished - set(complete)) == 1
    assert len(kept) == 3  # each run finished one trial before dying; the last one only died

    rerun = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    assert f"{len(kept)} trial(s) were already complete" in rerun.stderr

    trials = _optuna(out)
    complete = collections.Counter(_key(t) for t in trials if t.state == COMPLETE)
    assert sorted(complete) == PLANNED and set(complete.values()) == {1}  # each exactly once in Optuna
    for key, run_id in kept.items():
        assert _complete(out)[key] == run_id
    finished = collections.Counter(
        (r.data.tags["variant"], int(r.data.tags["seed"])) for r in _runs(out, "FINISHED")
    )
    assert sorted(finished) == PLANNED and set(finished.values()) == {1}  # ... and in MLflow
    assert {r.info.run_id for r in _runs(out, "FINISHED")} == {
        t.user_attrs["mlflow_run_id"] for t in trials if t.state == COMPLETE
    }
    assert _runs(out, "RUNNING") == []
    killed = _runs(out, "KILLED")
    assert len(killed) == 4 and all(r.data.tags["ablate.failure"] == "interrupted" for r in killed)
    interrupted = [t for t in trials if t.state == optuna.trial.TrialState.FAIL]
    assert len(interrupted) == 4 and all(t.user_attrs["failure"] == "interrupted" for t in interrupted)
    print(
        f"\nkill-and-resume: {len(PLANNED)} planned, killed 4 times (train, evaluate, track, tell); "
        f"Optuna COMPLETE {sum(complete.values())} ({len(complete)} distinct keys), FAIL/interrupted "
        f"{len(interrupted)}; MLflow FINISHED {sum(finished.values())} ({len(finished)} distinct), "
        f"KILLED {len(killed)}, RUNNING 0; {len(kept)} trials kept from before the kills, none retrained"
    )

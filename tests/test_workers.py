"""Parallel workers: N processes on one host sharing the journal file; workers reporting to a real
`mlflow server` on loopback, as on many machines (no shared file system: artifacts go through the
server), on the journal and with 3 workers on a real PostgreSQL server (one killed mid-trial and
re-queued by Optuna's heartbeat). Every (variant, seed) is trained exactly once; none is lost; the
study's MLflow run is closed by the worker that ends the study."""

from __future__ import annotations

import collections
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import optuna
import pytest
from mlflow import MlflowClient
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend

from ablate.faults import KILL_ENV

COMPLETE, FAIL = optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL
FAST_REPORT = {"calibration": 0, "bootstrap": 200}  # the report is not under test here


def _ablate(*args: str, env: dict | None = None, cwd=None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "ablate.commands.cli", *map(str, args)],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _check_exactly_once(trials, runs, planned) -> dict:
    complete = collections.Counter(
        (t.user_attrs["variant"], t.user_attrs["seed"]) for t in trials if t.state == COMPLETE
    )
    finished = collections.Counter(
        (r.data.tags["variant"], int(r.data.tags["seed"])) for r in runs if r.info.status == "FINISHED"
    )
    assert sorted(complete) == planned and set(complete.values()) == {1}, complete
    assert sorted(finished) == planned and set(finished.values()) == {1}, finished
    assert not [
        t for t in trials if t.state in (optuna.trial.TrialState.RUNNING, optuna.trial.TrialState.WAITING)
    ]
    assert not [r for r in runs if r.info.status == "RUNNING"]
    return {
        "complete": sum(complete.values()),
        "finished": sum(finished.values()),
        "failed": sum(t.state == FAIL for t in trials),
        "killed_runs": sum(r.info.status == "KILLED" for r in runs),
        "workers": len({r.data.tags["ablate.worker"] for r in runs if r.info.status == "FINISHED"}),
    }


def _key_less_or_duplicate(trial, trials) -> bool:
    """A bookkeeping failure never stands for a key that is not also completed elsewhere."""
    key = (trial.user_attrs.get("variant"), trial.user_attrs.get("seed"))
    if trial.user_attrs["failure"] == "nothing queued":
        return key == (None, None)
    return any(t.state == COMPLETE and (t.user_attrs["variant"], t.user_attrs["seed"]) == key for t in trials)


def _trial_runs(tracking_uri: str, name: str) -> list:
    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name(name)
    return client.search_runs([exp.experiment_id], "tags.`ablate.role` = 'trial'", max_results=1000)


def _study_runs(tracking_uri: str, name: str) -> list:
    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name(name)
    return client.search_runs([exp.experiment_id], "tags.`ablate.role` = 'study'")


@pytest.fixture
def mlflow_server(tmp_path):
    """`mlflow server` on a free loopback port (SQLite backend, artifacts proxied by the server, as
    the README sets one up for many machines); its URL. Killed at the end."""
    folder = tmp_path / "mlflow-server"
    folder.mkdir()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    log = folder / "server.log"
    with open(log, "w") as sink:
        server = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port)]
            + ["--workers", "1", "--backend-store-uri", f"sqlite:///{folder / 'mlflow.db'}"]
            + ["--artifacts-destination", str(folder / "artifacts")],
            cwd=folder,
            # As the README starts it: without MLflow 3's 7 GenAI job processes (2 s of CPU each to start).
            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: the server and its workers stop together
        )
    try:
        deadline = time.monotonic() + 240  # the server imports slowly on a loaded machine
        while True:
            if server.poll() is not None:
                pytest.fail(f"mlflow server exited with {server.returncode}: {log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=5):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"mlflow server did not answer in 240 s: {log.read_text()[-2000:]}")
                time.sleep(0.5)
        yield url
    finally:  # killed: its store is this test's to throw away (SIGTERM's shutdown took 3.8 s)
        try:
            os.killpg(server.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        server.wait(timeout=30)


@pytest.mark.heavy
def test_workers_report_to_an_mlflow_tracking_server(write_study, tmp_path, mlflow_server, cli):
    """Two workers sharing a journal queue report to the server: each (variant, seed) FINISHED
    once, one study run, closed FINISHED by the worker that ended the study; the resolved study
    and, once `ablate report` wrote it, the report are attached to it through the server."""
    name = "served"
    study = write_study({"name": name, "train": {"epochs": 1}, "seeds": [0, 1, 2], "report": FAST_REPORT})
    queue = tmp_path / "queue"
    common = ["worker", study, "--storage", queue / "optuna.journal", "--output", queue, "--quiet"]
    workers = [_ablate(*common, "--tracking-uri", mlflow_server, cwd=tmp_path) for _ in range(2)]
    for worker in workers:
        _, err = worker.communicate(timeout=600)
        assert worker.returncode == 0, err[-2000:]

    trials = optuna.load_study(
        study_name=name, storage=JournalStorage(JournalFileBackend(str(queue / "optuna.journal")))
    ).trials
    planned = sorted((v, s) for v in ("base", "mlp") for s in (0, 1, 2))
    counts = _check_exactly_once(trials, _trial_runs(mlflow_server, name), planned)
    assert counts["complete"] == counts["finished"] == 6
    (parent,) = _study_runs(mlflow_server, name)
    assert parent.info.status == "FINISHED"

    code, _, err = cli(  # in this process: nothing here is about processes
        "report", "--experiment", name, "--tracking-uri", mlflow_server, "--reports", tmp_path / "reports"
    )
    assert code == 0, err[-2000:]
    assert (tmp_path / "reports" / name / "report.html").is_file()
    client = MlflowClient(mlflow_server)
    attached = {a.path for a in client.list_artifacts(parent.info.run_id)}
    attached |= {a.path for a in client.list_artifacts(parent.info.run_id, "report")}
    assert {"study.resolved.yaml", "report/report.html", "report/table.tex"} <= attached
    # Nothing was written beside the workers: the artifacts live where the server keeps them.
    assert not (queue / "artifacts").exists() and (tmp_path / "mlflow-server" / "artifacts").is_dir()


@pytest.mark.heavy
def test_local_workers_share_one_queue(write_study, tmp_path):
    """A worker dies mid-trial; `ablate run --workers 2` re-queues its trial (its lock file is
    free) and the two workers share the rest, each trial once."""
    study = write_study({"train": {"epochs": 1}, "seeds": [0, 1, 2], "report": FAST_REPORT})
    out = tmp_path / "runs" / "tiny"
    dead = _ablate("worker", study, "--quiet", env={KILL_ENV: "train@1"}, cwd=tmp_path)
    dead.communicate(timeout=300)
    assert dead.returncode == -signal.SIGKILL
    run = _ablate("run", study, "--workers", 2, "--quiet", "--reports", tmp_path / "reports", cwd=tmp_path)
    _, err = run.communicate(timeout=600)
    assert run.returncode == 0, err
    assert (tmp_path / "reports" / "tiny" / "report.html").is_file()

    trials = optuna.load_study(
        study_name="tiny", storage=JournalStorage(JournalFileBackend(str(out / "optuna.journal")))
    ).trials
    counts = _check_exactly_once(
        trials,
        _trial_runs(f"sqlite:///{out / 'mlflow.db'}", "tiny"),
        sorted((v, s) for v in ("base", "mlp") for s in (0, 1, 2)),
    )
    assert counts["failed"] == 1 and counts["killed_runs"] == 1  # the dead worker's trial, re-run once
    assert counts["workers"] == 2  # both workers trained trials
    assert not list((out / "workers").iterdir())  # every worker's lock file is gone


@pytest.mark.heavy
@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL])
def test_stopping_the_run_stops_its_workers(write_study, tmp_path, stop):
    """`kill` on `ablate run --workers 2` stops both workers (`kill -9`: through the parent-death
    signal they asked for); their trials are recorded as interrupted (re-queued by the next run),
    none is left running, and the study's MLflow run ends KILLED. (A stop request that landed in a
    finaliser used to be dropped, and the worker trained on: tests/test_stopping.py.)"""
    study = write_study({"train": {"epochs": 400}, "seeds": [0, 1], "report": FAST_REPORT})
    out = tmp_path / "runs" / "tiny"
    run = subprocess.Popen(
        [sys.executable, "-m", "ablate.commands.cli", "run", str(study), "--workers", "2", "--quiet"],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # its own process group: cleaned up whatever happens
    try:
        _stop(run, out, stop)
    finally:
        try:
            os.killpg(run.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _stop(run: subprocess.Popen, out: Path, stop: signal.Signals) -> None:
    journal = out / "optuna.journal"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # both workers in a trial
        if journal.exists() and len(_running(journal)) == 2:
            break
        time.sleep(0.5)
    assert len(_running(journal)) == 2
    workers = [int(p.name.rsplit("-", 2)[1]) for p in (out / "workers").iterdir()]
    assert len(workers) == 2
    run.send_signal(stop)
    assert run.wait(timeout=90) != 0
    if stop == signal.SIGTERM:  # `ablate run` waits for its workers to record their trials
        assert not any(_alive(pid) for pid in workers)
    deadline = time.monotonic() + 90  # their clean-up writes share the stores: allow for contention
    while time.monotonic() < deadline and any(_alive(pid) for pid in workers):
        time.sleep(0.2)
    assert not any(_alive(pid) for pid in workers)
    trials = optuna.load_study(
        study_name="tiny", storage=JournalStorage(JournalFileBackend(str(journal)))
    ).trials
    assert not _running(journal)
    assert sorted(t.user_attrs.get("failure") for t in trials if t.state == FAIL) == ["interrupted"] * 2
    # The last worker to record its trial found none running: it closed the study's run as stopped.
    assert [r.info.status for r in _study_runs(f"sqlite:///{out / 'mlflow.db'}", "tiny")] == ["KILLED"]


def _running(journal) -> list:
    try:
        study = optuna.load_study(study_name="tiny", storage=JournalStorage(JournalFileBackend(str(journal))))
    except KeyError:  # the study is not created yet
        return []
    return study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped by its parent) counts as gone
        return "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()
    except FileNotFoundError:
        return False


def _postgres_url() -> str:
    url = os.environ.get("ABLATE_TEST_POSTGRES")
    if not url:
        if os.environ.get("ABLATE_REQUIRE_POSTGRES"):
            pytest.fail(
                "ABLATE_REQUIRE_POSTGRES is set but ABLATE_TEST_POSTGRES (a postgresql:// URL) is not"
            )
        pytest.skip("no PostgreSQL server: set ABLATE_TEST_POSTGRES=postgresql://… (.ci/run starts one)")
    return url


@pytest.fixture
def postgres_url() -> str:
    return _postgres_url()


@pytest.mark.heavy
def test_three_workers_on_postgresql(write_study, tmp_path, postgres_url, mlflow_server):
    """(``postgres_url`` first: without PostgreSQL the test skips before the server starts.)"""
    url = postgres_url
    name = f"pg-{uuid.uuid4().hex[:8]}"
    study = write_study({"name": name, "train": {"epochs": 1}, "seeds": [0, 1, 2]})
    tracking = mlflow_server  # one tracking server the workers share, as on many machines
    common = [
        "worker",
        study,
        "--storage",
        url,
        "--tracking-uri",
        tracking,
        "--quiet",
        "--heartbeat",
        1,
        "--grace",
        4,
    ]
    workers = [
        _ablate(*common, env={KILL_ENV: "train@1"} if i == 0 else None, cwd=tmp_path) for i in range(3)
    ]
    results = [(w.communicate(timeout=600), w.returncode) for w in workers]
    assert results[0][1] == -signal.SIGKILL, [r[0][1][-1500:] for r in results]  # died inside its first trial
    for (_out, err), code in results[1:]:
        assert code == 0, err

    storage = optuna.storages.RDBStorage(url)
    try:
        trials = optuna.load_study(study_name=name, storage=storage).trials
        counts = _check_exactly_once(
            trials, _trial_runs(tracking, name), sorted((v, s) for v in ("base", "mlp") for s in (0, 1, 2))
        )
        failed = [t for t in trials if t.state == FAIL]
        # Without a cross-host lock two workers can race for the last queued trial; the loser's ask()
        # makes a fresh trial, which it closes as bookkeeping ("nothing queued" / "duplicate").
        raced = [t for t in failed if t.user_attrs.get("failure") in ("nothing queued", "duplicate")]
        assert all(_key_less_or_duplicate(t, trials) for t in raced)
        stale = [t for t in failed if t.number not in {r.number for r in raced}]
        assert len(stale) == 1 and "failure" not in stale[0].user_attrs  # failed by the heartbeat, not by us
        retried = [t for t in trials if t.system_attrs.get("failed_trial") == stale[0].number]
        # Optuna's heartbeat callback re-queues the stale trial; failing it and re-queuing are two
        # steps, and another worker's sync in between queues the key itself (lower number) — then the
        # callback's copy steps aside as a duplicate. Either way the key completes exactly once
        # (_check_exactly_once above).
        assert len(retried) == 1
        assert retried[0].state == COMPLETE or retried[0].user_attrs.get("failure") == "duplicate"
        stale_key = (stale[0].user_attrs["variant"], stale[0].user_attrs["seed"])
        assert [
            t.state
            for t in trials
            if t.state == COMPLETE and (t.user_attrs.get("variant"), t.user_attrs.get("seed")) == stale_key
        ] == [COMPLETE]
        assert counts["killed_runs"] == 1 and counts["workers"] == 2
        assert [r.info.status for r in _study_runs(tracking, name)] == ["FINISHED"]
        print(
            f"\npostgresql, 3 workers (one SIGKILLed in its first trial): {len(trials)} Optuna trials, "
            f"{counts['complete']} COMPLETE for 6 planned keys (each once), 1 FAIL (stale heartbeat) "
            f"re-queued (key completed once), {len(raced)} closed as lost queue races; "
            f"MLflow FINISHED {counts['finished']}, KILLED "
            f"{counts['killed_runs']}; trained by {counts['workers']} surviving workers"
        )
    finally:
        optuna.delete_study(study_name=name, storage=storage)

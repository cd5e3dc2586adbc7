"""Kill real `ablate` processes with SIGKILL at named points (during training, evaluation,
tracking, and between MLflow and Optuna); every (variant, seed) ends COMPLETE exactly once in
Optuna and FINISHED exactly once in MLflow, and nothing finished is retrained. A journal record
cut off mid-write is repaired; SIGTERM while the data is generated stops the run at once."""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import threading
import time

import optuna
import pytest
from mlflow import MlflowClient
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from sigterm import sigterm_at  # tests/sigterm.py, on sys.path

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


@pytest.mark.heavy
def test_killed_at_every_point_resumes_exactly_once(write_study, tmp_path, cli):
    study = write_study(
        {"train": {"epochs": 1}, "seeds": [0, 1], "report": {"calibration": 0, "bootstrap": 200}}
    )
    out = tmp_path / "runs" / "tiny"
    cmd = [
        sys.executable,
        "-m",
        "ablate.commands.cli",
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

    code, _, err = cli(*cmd[3:])  # the rerun in this process (only the killed ones need their own)
    assert code == 0, err
    assert f"{len(kept)} trial(s) were already complete" in err

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


@pytest.mark.heavy
def test_a_record_cut_off_mid_write_is_removed_and_the_run_goes_on(write_study, tmp_path, cli, monkeypatch):
    """A crash in the middle of a journal write leaves its last record without a newline: the next
    run removes it (keeping the file as it was), says so in one line, and never appends to it."""
    monkeypatch.chdir(tmp_path)
    study = write_study(
        {"train": {"epochs": 1}, "seeds": [0], "report": {"calibration": 0, "bootstrap": 200}}
    )
    out = tmp_path / "runs" / "tiny"
    journal = out / "optuna.journal"
    code, _, err = cli("run", study, "--quiet")
    assert code == 0, err
    whole = journal.read_bytes()
    start = whole.rstrip(b"\n").rfind(b"\n") + 1  # of the last record
    cut = whole[: start + (len(whole) - start) // 2]
    journal.write_bytes(cut)

    code, _, err = cli("run", study, "--quiet")
    assert code == 0 and "Traceback" not in err, err
    (backup,) = out.glob("optuna.journal.corrupt-*")
    assert backup.read_bytes() == cut
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert warnings == [
        f"warning: {journal}: its last record was cut off by a crash mid-write; removed it "
        f"({len(cut) - start} bytes), the file as it was is kept as {backup.name}"
    ]
    repaired = journal.read_bytes()
    assert repaired.startswith(whole[:start]) and repaired.endswith(b"\n")
    assert all(json.loads(line) for line in repaired.splitlines())
    complete = collections.Counter(_key(t) for t in _optuna(out) if t.state == COMPLETE)
    assert sorted(complete) == [("base", 0), ("mlp", 0)] and set(complete.values()) == {1}
    code, _, err = cli("run", study, "--quiet")  # nothing left to repair or train
    assert code == 0 and "warning:" not in err and "2 trial(s) were already complete" in err


def test_a_record_being_written_is_left_to_its_writer(tmp_path):
    """Writers append under Optuna's journal lock: a tail without a newline seen while another
    process holds it is a write in progress, which the check waits out instead of cutting."""
    from optuna.storages.journal import JournalFileSymlinkLock

    from ablate.drive.journal import check_journal

    journal = tmp_path / "optuna.journal"
    head = b'{"op_code":0,"worker_id":"w","study_name":"tiny","directions":[2]}\n'
    journal.write_bytes(head + b'{"op_code":0,"worker_id":"w",')
    lock = JournalFileSymlinkLock(str(journal))
    lock.acquire()
    checking = threading.Thread(target=check_journal, args=(journal,))
    checking.start()
    time.sleep(0.5)
    assert checking.is_alive()  # waiting for the writer's lock
    with open(journal, "ab") as handle:
        handle.write(b'"study_name":"other","directions":[2]}\n')
    lock.release()
    checking.join(10)
    assert not checking.is_alive()
    assert not list(tmp_path.glob("*.corrupt-*")) and journal.read_bytes().count(b"\n") == 2


def test_sigterm_while_a_large_data_set_is_generated_stops_within_seconds(write_study, tmp_path):
    """`kill` of a run that is still generating its data (400k synthetic users, ~20 s) ends it
    within seconds, with status 130 and the usual line, before any trial starts: a new study reads
    its data before it creates its stores, so none is left behind."""
    study = write_study({"task": {"data": {"users": 400_000}}, "seeds": [0]}, replace={"variants": {}})
    output = tmp_path / "runs" / "tiny"
    code, took, err = sigterm_at("load", ["run", str(study), "--quiet"], tmp_path)
    assert code == 130 and took < 10, (code, took, err[-2000:])
    assert f"interrupted: trials in flight are re-queued; `ablate run {study}` resumes" in err
    assert "Traceback" not in err
    assert not (output / "optuna.journal").exists() and not (output / "mlflow.db").exists()  # never started

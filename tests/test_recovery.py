"""A store lost beside the other (issue 40, item 4): caught at start in one line with the way
back, `status` saying what `run` says; a lost journal rebuilt from the tracking records
(`--rebuild-queue`), its finished trials kept, not retrained."""

from __future__ import annotations

import errno
import resource
import shutil

import pytest


@pytest.mark.heavy
def test_a_lost_journal_or_tracking_store_is_one_line_and_the_journal_is_rebuilt(
    cli, write_study, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    study = write_study(
        {"train": {"epochs": 1}, "report": {"calibration": 0, "bootstrap": 100}}, replace={"seeds": [0]}
    )
    assert cli("run", study, "--quiet")[0] == 0
    output = tmp_path / "runs" / "tiny"
    kept = tmp_path / "kept"
    shutil.copytree(output, kept)

    (output / "optuna.journal").unlink()
    for command in (("run", study, "--quiet"), ("status", study)):
        code, _, err = cli(*command)
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert "optuna.journal is missing, but" in err and "holds 2 finished trial(s) of 'tiny'" in err
        assert "--rebuild-queue" in err
    code, out, err = cli("run", study, "--quiet", "--rebuild-queue")
    assert code == 0, err
    assert "rebuilt: 2 finished trial(s) of the queue from the tracking records" in err
    assert "resumed: 2 trial(s) were already complete and were not retrained" in err
    code, out, _ = cli("status", study)
    assert code == 0 and "2/2 trials done" in out and "finished" in out
    code, _, err = cli("run", study, "--quiet", "--rebuild-queue")
    assert code == 2 and "nothing to rebuild" in err

    shutil.rmtree(output)
    shutil.copytree(kept, output)
    (output / "mlflow.db").unlink()
    for command in (("run", study, "--quiet"), ("status", study)):
        code, _, err = cli(*command)
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert "mlflow.db is missing, but" in err and "holds 2 finished trial(s)" in err
    assert not (output / "mlflow.db").exists()  # nothing created in its place

    for lost, holder in (("optuna.journal", "mlflow.db"), ("mlflow.db", "optuna.journal")):
        shutil.rmtree(output)
        shutil.copytree(kept, output)
        (output / lost).write_bytes(b"")  # a disk that filled, a copy cut short
        for command in (("run", study, "--quiet"), ("status", study)):
            code, _, err = cli(*command)
            assert code == 2 and len(err.strip().splitlines()) == 1, err
            assert f"{lost} is empty (0 bytes), but {output / holder} holds" in err, err
        assert (output / lost).stat().st_size == 0  # nothing trained or created over it


@pytest.mark.parametrize("failure", ["os", "size limit"])
def test_a_store_failing_mid_run_is_one_line_and_the_run_resumes(
    cli, write_study, tmp_path, monkeypatch, failure
):
    """An I/O error (a full or read-only disk) as a trial is recorded, or the disk refusing writes
    while a trial trains: one line, exit status 1, the trials finished before it kept; the same
    command then resumes and trains the rest. The size limit is a real one (each write past a
    file's first byte refused, as on a full disk): the error came through MLflow's own session,
    which logged 90 lines of it, and the trial used to be recorded as failed, never retrained."""
    from ablate.drive import execution

    monkeypatch.chdir(tmp_path)
    study = write_study(
        {"train": {"epochs": 1}, "report": {"calibration": 0, "bootstrap": 100}}, replace={"seeds": [0]}
    )
    step = "finish" if failure == "os" else "train"
    real, calls = getattr(execution.Execution, step), []

    def failing(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # the second trial: the first one is kept
            if failure == "os":
                raise OSError(errno.EIO, "Input/output error", str(tmp_path / "runs" / "tiny" / "mlflow.db"))
            soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
            resource.setrlimit(resource.RLIMIT_FSIZE, (1, hard))  # Python ignores SIGXFSZ: EFBIG
            try:
                return real(self, *args, **kwargs)
            finally:
                resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(execution.Execution, step, failing)
    code, _, err = cli("run", study, "--quiet")
    assert code == 1 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    # Past the size limit, whichever write meets it first says so: MLflow's SQLite session (its
    # per-epoch curve, before curves were sent in batches) or a file (an artifact, a checkpoint).
    expected = (
        ["Input/output error"] if failure == "os" else ["OperationalError: disk I/O error", "File too large"]
    )
    assert any(text in err for text in expected), err
    assert "stopped (what finished is kept; rerun resumes)" in err
    monkeypatch.setattr(execution.Execution, step, real)
    code, _, err = cli("run", study, "--quiet")
    assert code == 0 and "resumed: 1 trial(s) were already complete" in err, err
    assert "failed" not in err, err


def test_a_bug_still_shows_its_traceback(cli, write_study, monkeypatch):
    """Only a store's or the disk's failure is turned into one line: a programming error is not."""
    from ablate.drive import execution

    monkeypatch.setattr(execution.Execution, "finish", lambda *a, **k: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        cli("run", write_study({"train": {"epochs": 1}}, replace={"seeds": [0], "variants": {}}), "--quiet")


def test_a_stale_lock_naming_a_journal_that_is_gone_is_removed_not_spun_on(tmp_path, capsys):
    """Optuna's journal lock is a link to the journal; one a crash left behind after the journal
    was removed made every later open spin a core forever. It is removed, with one line."""
    import threading

    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    from ablate.drive.journal import check_journal

    journal = tmp_path / "optuna.journal"
    lock = tmp_path / "optuna.journal.lock"
    lock.symlink_to(journal)  # dangling: the journal is gone
    check_journal(journal)
    assert not lock.is_symlink()
    assert "a stale lock a crash left, naming a journal that is gone; removed it" in capsys.readouterr().err

    opened = threading.Thread(
        target=lambda: JournalStorage(JournalFileBackend(str(journal))).create_new_study([]), daemon=True
    )
    opened.start()
    opened.join(20)
    assert not opened.is_alive()  # the store opens and writes: no lock left to wait on

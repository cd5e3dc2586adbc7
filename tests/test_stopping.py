"""SIGTERM and Ctrl-C ask a run to stop; it stops at the next safe point. A stop asked for while
Python runs a finaliser is not lost (a handler that raised there was dropped as "Exception
ignored", and the worker trained on)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from sigterm import sigterm_at  # tests/sigterm.py, on sys.path

from ablate import stopping


def _deliver(sig: signal.Signals) -> None:
    os.kill(os.getpid(), sig)
    for _ in range(10_000):  # Python runs the handler at one of these bytecodes
        pass


def test_a_signal_asks_for_a_stop_that_the_next_safe_point_raises():
    with stopping.stop_signals():
        stopping.check()  # nothing asked yet
        _deliver(signal.SIGTERM)  # the handler raises nothing ...
        assert stopping.requested()
        with pytest.raises(KeyboardInterrupt):  # ... the safe point does
            stopping.check()
        _deliver(signal.SIGTERM)  # a second SIGTERM (e.g. the parent-death one) changes nothing
        with pytest.raises(KeyboardInterrupt):  # a second Ctrl-C stops at once
            _deliver(signal.SIGINT)
    assert not stopping.requested()  # cleared on the way out


def test_a_stop_asked_for_inside_a_finaliser_is_not_lost():
    class Finalised:
        def __del__(self):
            _deliver(signal.SIGTERM)  # the handler runs inside __del__, where a raise is dropped

    with stopping.stop_signals():
        Finalised()
        with pytest.raises(KeyboardInterrupt):
            stopping.check()


def test_the_callers_handlers_come_back():
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    with stopping.stop_signals():
        assert signal.getsignal(signal.SIGTERM) is not before[0]
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def test_sleep_ends_when_a_stop_is_asked_for():
    with stopping.stop_signals():
        start = time.monotonic()
        stopping.sleep(0.2)  # a whole sleep without a request
        assert time.monotonic() - start >= 0.2
        previous = signal.signal(signal.SIGALRM, lambda *_: stopping.request())
        signal.setitimer(signal.ITIMER_REAL, 0.05)  # in 50 ms SIGALRM's handler asks for the stop
        try:
            start = time.monotonic()
            with pytest.raises(KeyboardInterrupt):
                stopping.sleep(30)
            assert time.monotonic() - start < 5
        finally:
            signal.signal(signal.SIGALRM, previous)


@pytest.mark.heavy
def test_ctrl_c_stops_a_run_that_the_next_run_resumes(write_study, tmp_path):
    """Ctrl-C in `ablate run`: exit status 130 and one line saying how to go on; the trial in
    flight is recorded as interrupted (which the next run re-queues), none is left running."""
    study = write_study(
        {"train": {"epochs": 400}, "seeds": [0], "report": {"calibration": 0, "bootstrap": 200}},
        replace={"variants": {}},
    )
    journal = tmp_path / "runs" / "tiny" / "optuna.journal"
    run = subprocess.Popen(
        [sys.executable, "-m", "ablate.commands.cli", "run", str(study), "--quiet"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not _trials(journal, optuna.trial.TrialState.RUNNING):
            time.sleep(0.2)
        time.sleep(1.0)  # into training
        run.send_signal(signal.SIGINT)
        _, err = run.communicate(timeout=60)
    finally:
        run.kill()
    assert run.returncode == 130
    assert f"interrupted: trials in flight are re-queued; `ablate run {study}` resumes" in err
    assert [t.user_attrs["failure"] for t in _trials(journal, optuna.trial.TrialState.FAIL)] == [
        "interrupted"
    ]
    assert not _trials(journal, optuna.trial.TrialState.RUNNING)


def _trials(journal, state) -> list:
    try:
        study = optuna.load_study(study_name="tiny", storage=JournalStorage(JournalFileBackend(str(journal))))
    except (KeyError, FileNotFoundError):
        return []
    return study.get_trials(deepcopy=False, states=(state,))


@pytest.mark.heavy
def test_sigterm_while_the_report_is_written_stops_it(cli, write_study, tmp_path, monkeypatch):
    """Writing a report has safe points too (between calibration studies, between figures): a
    `kill` while a finished study's report is written ends it within seconds with status 130,
    where it used to be ignored until the report was done."""
    monkeypatch.chdir(tmp_path)
    # Three seeds: the report's calibration simulates studies of this shape (none with one seed).
    trained = {"train": {"epochs": 1}, "report": {"calibration": 0}}
    study = write_study(trained, replace={"seeds": [0, 1, 2], "variants": {"mlp": {"ffn": {"kind": "mlp"}}}})
    assert cli("run", study, "--quiet")[0] == 0
    code, took, err = sigterm_at(
        "report", ["run", str(study), "--quiet", "report.calibration=100000"], tmp_path
    )
    assert code == 130 and took < 10, (code, took, err[-2000:])
    assert "interrupted:" in err and "Traceback" not in err


def test_a_stop_while_a_large_study_is_read_for_its_report_ends_the_reading(monkeypatch):
    """Reading the trials back is the report's longest stretch for a large study (hundreds of runs:
    30 s deaf to SIGTERM); each trial is a safe point now."""
    from types import SimpleNamespace

    from ablate.tracking import results

    runs = [
        SimpleNamespace(
            data=SimpleNamespace(tags={"variant": "base", "seed": str(seed)}, params={}),
            info=SimpleNamespace(run_id=f"run{seed}"),
        )
        for seed in range(500)
    ]
    store = SimpleNamespace(client=None, trial_runs=lambda **_: runs)
    monkeypatch.setattr(results, "_open", lambda *_: store)
    read = []

    def metrics(client, run, keys):
        read.append(run)
        stopping.request()  # SIGTERM arrives while the first trial is read
        return {"test.acc": 0.5}, []

    monkeypatch.setattr(results, "trial_metrics", metrics)
    try:
        with pytest.raises(KeyboardInterrupt):
            results.load_results("sqlite:///unused.db", "big")
    finally:
        stopping._requested.clear()
    assert len(read) == 1


def _catches_sigterm(pid: int) -> bool:
    """Whether process ``pid`` has a handler of its own for SIGTERM (Linux's SigCgt mask)."""
    with open(f"/proc/{pid}/status") as status:
        caught = next(line for line in status if line.startswith("SigCgt:")).split()[1]
    return bool(int(caught, 16) >> (signal.SIGTERM - 1) & 1)


def test_sigterm_while_the_command_starts_is_one_line_and_status_130(tmp_path):
    """The `ablate` command imports torch for seconds before any command runs; a `kill` then ends
    it with one line and 130, as Ctrl-C, not silently with 143 (the default's 128 + 15)."""
    ablate = Path(sys.executable).with_name("ablate")
    run = subprocess.Popen(
        [ablate, "report", "nothing.yaml"], cwd=tmp_path, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not _catches_sigterm(run.pid):
            time.sleep(0.005)
        run.send_signal(signal.SIGTERM)  # while it imports: the study file is not read yet
        _, err = run.communicate(timeout=60)
    finally:
        run.kill()
    assert run.returncode == 130 and err.splitlines() == [
        "interrupted: `ablate` stopped while it started; it had done nothing"
    ], err[-2000:]


def test_a_stop_in_a_command_without_a_line_of_its_own_is_one_line_and_status_130(
    cli, write_study, monkeypatch
):
    """`ablate report` rebuilding a report when SIGTERM (now a stop, as Ctrl-C) or Ctrl-C comes:
    one line naming the command, 130 — where Typer exited 130 without a word. The caller's
    SIGTERM handler is back after."""
    from ablate.commands import reporting

    def stopped(*_args):
        stopping.request()  # SIGTERM arrives while the report is rebuilt
        stopping.check()  # its next safe point

    monkeypatch.setattr(reporting, "rebuild_report", stopped)
    before = signal.getsignal(signal.SIGTERM)
    code, _, err = cli("report", write_study())
    assert code == 130 and err.splitlines() == ["interrupted: `ablate report` stopped before it finished"]
    assert signal.getsignal(signal.SIGTERM) is before

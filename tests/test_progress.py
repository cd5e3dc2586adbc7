"""Progress that works in logs: with stderr not a terminal, one plain line per finished trial,
written as the trial ends; in a terminal, bars with an ETA and the same line left above them."""

from __future__ import annotations

import io
import re
import subprocess
import sys
import time

import pandas as pd
import pytest
from mlflow import MlflowClient
from rich.console import Console

from ablate.commands import console
from ablate.commands.progress import BarReporter
from ablate.study.load import load_study
from ablate.training.trainer import TrialResult

LINE = re.compile(
    r"trial (\d)/(\d) done: (base|mlp) seed (\d)  ndcg@10 0\.\d{4}  wall \d+\.\d s  (\d) left"
    r"(  ETA \d+m\d\ds)?"
)
KEYS = [("base", "0"), ("base", "1"), ("mlp", "0"), ("mlp", "1")]


def _read_lines(cmd: list[str]) -> tuple[int, list[tuple[float, str]]]:
    """Run ``cmd`` with stderr a pipe; each stderr line with the time it arrived."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines = [(time.monotonic(), line.rstrip("\n")) for line in proc.stderr]
    return proc.wait(timeout=600), lines


def _trial_lines(lines: list[tuple[float, str]]) -> list[tuple[float, re.Match]]:
    return [(t, LINE.fullmatch(text)) for t, text in lines if text.startswith("trial ")]


@pytest.mark.heavy
def test_a_log_gets_one_line_per_trial_as_it_finishes(write_study):
    study = write_study()
    code, lines = _read_lines([sys.executable, "-m", "ablate.commands.cli", "run", str(study)])
    ended = time.monotonic()
    assert code == 0, lines
    trials = _trial_lines(lines)
    assert all(m for _, m in trials), [text for _, text in lines]
    assert [(m[1], m[2], m[5]) for _, m in trials] == [(str(k), "4", str(4 - k)) for k in range(1, 5)]
    assert sorted((m[3], m[4]) for _, m in trials) == KEYS
    assert all(m[6] for _, m in trials[:-1]) and not trials[-1][1][6]  # an ETA while trials are left
    # Written as each trial ends, not all at once when the run ends: the report written after the
    # last trial takes seconds (a trial of this tiny study can take a quarter of one).
    arrived = [t for t, _ in trials]
    assert ended - arrived[0] > 1.0, (arrived, ended)
    text = "\n".join(text for _, text in lines)
    assert "\x1b[" not in text and "━" not in text  # no bars, no terminal control codes in a log


@pytest.mark.heavy
def test_the_parent_of_workers_follows_the_store(write_study, tmp_path):
    study = write_study()
    cmd = [sys.executable, "-m", "ablate.commands.cli", "run", str(study), "train.epochs=1", "--workers", "2"]
    code, lines = _read_lines(cmd)
    assert code == 0, lines
    trials = _trial_lines(lines)
    assert all(m for _, m in trials), [text for _, text in lines]
    assert sorted((m[3], m[4]) for _, m in trials) == KEYS
    assert [m[1] for _, m in trials] == ["1", "2", "3", "4"]
    # The workers trained the overridden study, as the parent planned it (its own: tiny.epochs_1).
    client = MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'tiny.epochs_1' / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("tiny.epochs_1").experiment_id])
    trained = [r for r in runs if r.data.tags.get("ablate.role") == "trial"]
    assert len(trained) == 4 and {r.data.params["train.epochs"] for r in trained} == {"1"}


def _result(ndcg: float, wall: float) -> TrialResult:
    summary = {"valid.ndcg@10": ndcg + 0.01, "test.ndcg@10": ndcg, "valid.hr@10": 0.5, "test.hr@10": 0.5}
    return TrialResult(summary=summary, per_unit=pd.DataFrame(), wall_s=wall)


@pytest.mark.parametrize("terminal", [True, False])
def test_reporter_lines_and_the_eta_on_the_trial_bar(write_study, monkeypatch, terminal):
    shown = io.StringIO()
    monkeypatch.setattr(console, "err", Console(file=shown, force_terminal=terminal, width=150))
    study = load_study(write_study())
    with console.progress_bars(quiet=False) as bars:
        reporter = BarReporter(study, bars, quiet=False)
        reporter.study(total=4, done=0)
        reporter.trial("base · search 1/2", 0, 2)  # a search trial: a line, the trial bar stays
        reporter.finished("base · search 1/2", 0, _result(0.2, 1.0))
        reporter.trial("base", 0, 2)
        reporter.epoch(1, {"valid.ndcg@10": 0.1})
        reporter.finished("base", 0, _result(0.25, 4.0))
        trial_bar = bars.tasks[reporter.log.task]
        assert trial_bar.completed == 1 and trial_bar.fields["eta"] == "ETA 0m12s"  # 4 s × 3 left
        reporter.trial("mlp", 1, 2)
        reporter.failed("mlp", 1, "RuntimeError: boom")
    lines = [re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", line) for line in shown.getvalue().splitlines()]
    assert "search trial done: base · search 1/2  valid ndcg@10 0.2100  wall 1.0 s" in lines
    assert "trial 1/4 done: base seed 0  ndcg@10 0.2500  wall 4.0 s  3 left  ETA 0m12s" in lines
    assert "trial 2/4 failed: mlp seed 1: RuntimeError: boom  2 left  ETA 0m08s" in lines
    assert any("ETA 0m08s" in line and "trials" in line for line in lines) == terminal  # the bar's column


def test_quiet_shows_nothing(write_study, monkeypatch):
    shown = io.StringIO()
    monkeypatch.setattr(console, "err", Console(file=shown, force_terminal=True))
    with console.progress_bars(quiet=True) as bars:
        reporter = BarReporter(load_study(write_study()), bars, quiet=True)
        reporter.study(total=4, done=0)
        reporter.trial("base", 0, 2)
        reporter.finished("base", 0, _result(0.25, 4.0))
    assert shown.getvalue() == ""

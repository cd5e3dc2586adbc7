"""The researcher's own code under faults (issue 59, items 2 and 4): a callable runs in a process of
its own — a non-finite metric, ``sys.exit``, ``os._exit`` and an import-time ``argparse`` each fail
their trial once with the reason, and SIGTERM reaches a callable that hangs; ``validate``, ``status``
and ``plan`` read a study's callable without running it, refuse the standard library's and say
which file ``ablate run`` would import."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import pytest

from tests.sigterm import sigterm_at

SCRIPT = """
import argparse, math, os, pathlib, signal, sys, time

# A script that parses its own arguments at import (it has none: ablate's would fail it).
ARGS = argparse.ArgumentParser().parse_args()
pathlib.Path(__file__).with_name("imported").touch()


def train(config, seed, reporter):
    mode = config["mode"]
    if mode == "hang":
        pathlib.Path(__file__).with_name("pid").write_text(str(os.getpid()))
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        reporter.report(1, {"valid.acc": 0.5})
        while True:
            time.sleep(0.1)
    if mode == "exit":
        sys.exit(0)
    if mode == "hard_exit":
        os._exit(0)
    value = {"nan": math.nan, "inf": math.inf}.get(mode, 0.5 + seed / 100)
    return {"acc": value}
"""

STUDY = """
name: faults
task: {kind: function, callable: "train.py:train"}
model: {config: {mode: plain}}
variants:
  nan: {config: {mode: nan}}
  inf: {config: {mode: inf}}
  exit: {config: {mode: exit}}
  hard_exit: {config: {mode: hard_exit}}
seeds: [0]
metrics: {primary: acc}
"""


def write_study(folder: Path, study: str = STUDY) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.py").write_text(SCRIPT)
    (folder / "study.yaml").write_text(study)
    return folder / "study.yaml"


def test_each_fault_fails_its_trial_once_and_the_report_is_written(tmp_path, cli):
    study = write_study(tmp_path / "s")
    code, out, err = cli("run", study, "--output", tmp_path / "out")
    assert code == 1, err  # some trials failed
    reasons = {
        "nan": "metric 'valid.acc' is nan, not a finite number",
        "inf": "metric 'valid.acc' is inf, not a finite number",
        "exit": "the training code called sys.exit(0) before it returned its metrics",
        "hard_exit": "the training code's process exited with status 0 before it returned its metrics",
    }
    for variant, reason in reasons.items():
        lines = [line for line in err.splitlines() if line.startswith(f"failed {variant} seed 0:")]
        assert len(lines) == 1 and reason in lines[0], err
    results = pd.read_csv(tmp_path / "out" / "report" / "results.csv")
    assert list(results["variant"]) == ["base"] and results["test.acc"].tolist() == [0.5]
    assert (tmp_path / "out" / "report" / "report.md").is_file()


def test_reading_a_study_runs_none_of_its_code(tmp_path, cli):
    study = write_study(tmp_path / "s")
    code, out, err = cli("validate", study)
    assert code == 0, err
    said = f"`ablate run` imports {tmp_path / 's' / 'train.py'}; validate, status, plan and report do not"
    assert "".join(said.split()) in "".join(out.split())
    for command in (("status", study, "--output", tmp_path / "out"), ("plan", study)):
        cli(*command)
    assert not (tmp_path / "s" / "imported").exists()


def test_a_standard_library_callable_is_refused_and_a_missing_name_found_without_importing(tmp_path, cli):
    study = write_study(tmp_path / "s", STUDY.replace("train.py:train", "os:system"))
    code, out, err = cli("validate", study)
    assert code == 2 and "study.yaml:3: task.callable: 'os:system' is in Python's standard library" in err
    write_study(tmp_path / "s", STUDY.replace("train.py:train", "train.py:other"))
    code, out, err = cli("validate", study)
    assert code == 2 and f"{tmp_path / 's' / 'train.py'} defines no 'other'" in err
    outside = write_study(tmp_path / "elsewhere")
    write_study(tmp_path / "s", STUDY.replace("train.py:train", f"{outside.parent / 'train.py'}:train"))
    code, out, err = cli("validate", study)
    assert code == 0 and f"runs {outside.parent / 'train.py'}, outside the study's folder" in err
    assert not (tmp_path / "s" / "imported").exists() and not (outside.parent / "imported").exists()


@pytest.mark.heavy
def test_sigterm_reaches_a_callable_that_ignores_it(tmp_path):
    hangs = "name: hangs\ntask: {kind: function, callable: train.py:train}\nmodel: {config: {mode: hang}}\n"
    study = write_study(tmp_path, hangs + "seeds: [0]\nmetrics: {primary: acc}\n")
    code, took, err = sigterm_at("train", ["run", str(study), "--quiet"], tmp_path)
    assert code != 0 and took < 30, err
    pid = int((tmp_path / "pid").read_text())
    try:
        os.kill(pid, 0)
        gone = Path(f"/proc/{pid}/status").read_text().find("State:\tZ") >= 0  # a zombie has ended
    except ProcessLookupError:
        gone = True
    assert gone, f"the callable's process {pid} outlived the run"

"""`ablate run --launcher slurm`: the jobs' settings (command line over study file over the user's
config file, none of them in a trial's fingerprint), and, against a real one-node SLURM
(`.ci/slurm/start`; CI sets ABLATE_REQUIRE_SLURM=1 so that it never skips there), a study of 3
worker jobs with one job cancelled mid-trial: every (variant, seed) finishes exactly once, with
the numbers a one-process run gets."""

from __future__ import annotations

import collections
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import yaml
from mlflow import MlflowClient
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend

from ablate.commands.slurm import job_settings, recorded
from ablate.drive import Stores, run_study
from ablate.drive.ledger import fingerprint
from ablate.errors import AblateError
from ablate.study.load import load_study

COMPLETE, RUNNING, FAIL = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.RUNNING,
                           optuna.trial.TrialState.FAIL)  # fmt: skip
TRAIN = """
import random
import time


def train(config, seed, reporter):
    rng = random.Random(seed * 1000 + config["width"])
    for epoch in range(config["epochs"]):
        time.sleep(config["sleep"])
        reporter.report(epoch, {"valid.acc": rng.random()})
    return {"acc": 0.5 + config["width"] / 1000 + rng.random() / 100}
"""
STUDY = {
    "name": "on-slurm",
    "task": {"kind": "function", "callable": "train.py:train"},
    "model": {"config": {"width": 16, "epochs": 5, "sleep": 0.5}},
    "variants": {"wider": {"config": {"width": 64}}},
    "seeds": [0, 1, 2],
    "metrics": {"primary": "acc"},
    "report": {"calibration": 0, "bootstrap": 200, "margin": 0.01},
}


def _write(folder: Path, **changes) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.py").write_text(TRAIN)
    path = folder / "study.yaml"
    path.write_text(yaml.safe_dump({**STUDY, **changes}))
    return path


def test_settings_command_line_over_study_file_over_user_config(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    config = tmp_path / "config" / "ablate" / "slurm.yaml"
    config.parent.mkdir(parents=True)
    config.write_text("partition: cpu\naccount: lab\nmem: 8G\ntime: 2:00:00\n")
    study = load_study(_write(tmp_path, slurm={"partition": "gpu", "time": "1-00:00"}), check_files=False)
    chosen = job_settings(study, partition=None, time="90", mem=None, cpus_per_task=4, sbatch=["--qos=high"])
    assert (chosen.partition, chosen.account, chosen.mem) == ("gpu", "lab", "8G")
    assert (chosen.time, chosen.cpus_per_task, chosen.sbatch) == (90, 4, ["--qos=high"])
    assert job_settings(study).time == 24 * 60  # the study file's 1-00:00 over the config's 2 h
    with pytest.raises(AblateError, match=r"^--time: .*\[D-\]HH:MM"):
        job_settings(study, time="soon")
    with pytest.raises(AblateError, match=r"^--sbatch\.0: "):
        job_settings(study, sbatch=["-q high"])  # the long form only
    config.write_text("partition: cpu\nmemory: 8G\n")
    with pytest.raises(AblateError, match=rf"^{re.escape(str(config))}: memory: "):
        job_settings(study)


def test_a_newline_in_a_launcher_value_is_refused_where_it_was_written(tmp_path, monkeypatch):
    """A partition, account or sbatch option carrying a newline would write its own #SBATCH lines."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    config = tmp_path / "config" / "ablate" / "slurm.yaml"
    config.parent.mkdir(parents=True)
    study = load_study(_write(tmp_path), check_files=False)
    with pytest.raises(AblateError, match=r"^--partition: .*SLURM names.*'gpu\\n#SBATCH --uid=0'"):
        job_settings(study, partition="gpu\n#SBATCH --uid=0")
    with pytest.raises(AblateError, match=r"^--sbatch\.0: "):
        job_settings(study, sbatch=["--qos=high\n#SBATCH --uid=0"])
    config.write_text('account: "lab\\n#SBATCH --uid=0"\n')
    with pytest.raises(AblateError, match=rf"^{re.escape(str(config))}: account: "):
        job_settings(study)
    config.write_text("account: lab\n")
    with pytest.raises(Exception, match=r"slurm\.partition: .*SLURM names"):
        load_study(_write(tmp_path / "s", slurm={"partition": "gpu\n#SBATCH --uid=0"}), check_files=False)
    assert job_settings(study, partition="gpu,cpu").partition == "gpu,cpu"


def test_the_slurm_section_is_in_no_fingerprint(tmp_path):
    plain = load_study(_write(tmp_path / "a"), check_files=False)
    placed = load_study(
        _write(tmp_path / "b", slurm={"partition": "gpu", "gpus_per_task": 1}), check_files=False
    )
    assert plain.spec.slurm.partition is None and placed.spec.slurm.gpus_per_task == 1
    for variant in plain.variants:
        assert fingerprint(plain, variant) == fingerprint(placed, variant)


def _slurm_problem() -> str | None:
    if shutil.which("sbatch") is None:
        return "no sbatch on PATH (.ci/slurm/start installs and starts a one-node SLURM)"
    try:
        states = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"sinfo failed: {exc}"
    if not {"idle", "mixed", "allocated"} & set(states.stdout.split()):
        return f"no SLURM node takes jobs (sinfo: {states.stdout.strip() or states.stderr.strip()})"
    return None


@pytest.fixture
def slurm():
    problem = _slurm_problem()
    if problem and os.environ.get("ABLATE_REQUIRE_SLURM"):
        pytest.fail(f"ABLATE_REQUIRE_SLURM is set but {problem}")
    if problem:
        pytest.skip(f"{problem} (`.ci/slurm/start` starts a one-node SLURM; CI fails instead)")


def _trials(folder: Path) -> list:
    journal = folder / "optuna.journal"
    if not journal.exists():
        return []
    storage = JournalStorage(JournalFileBackend(str(journal)))
    try:
        return optuna.load_study(study_name=STUDY["name"], storage=storage).trials
    except KeyError:
        return []


def _job_of(trial) -> str | None:
    """The SLURM job (array_task) whose worker holds ``trial``: from the worker process's environment."""
    pid = trial.user_attrs.get("worker", "").split("-")[-2:-1]
    try:
        environ = Path(f"/proc/{pid[0]}/environ").read_bytes().split(b"\0") if pid else []
    except OSError:
        return None
    env = dict(item.decode().split("=", 1) for item in environ if b"=" in item)
    if "SLURM_ARRAY_JOB_ID" not in env:
        return None
    return f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"


def _finished(tracking_uri: str, name: str = STUDY["name"]) -> dict:
    client = MlflowClient(tracking_uri)
    experiment = client.get_experiment_by_name(name)
    runs = client.search_runs([experiment.experiment_id], "tags.`ablate.role` = 'trial'", max_results=1000)
    return collections.Counter(
        ((r.data.tags["variant"], int(r.data.tags["seed"])), r.data.metrics["test.acc"])
        for r in runs
        if r.info.status == "FINISHED"
    )


@pytest.mark.heavy
def test_a_job_cancelled_mid_trial_loses_nothing(slurm, tmp_path, cli, monkeypatch):
    study = _write(tmp_path)
    out = tmp_path / "runs" / STUDY["name"]
    command = [
        sys.executable,
        "-m",
        "ablate.commands.cli",
        "run",
        str(study),
        "--launcher",
        "slurm",
        "--workers",
        "3",
    ]
    run = subprocess.Popen(
        [*command, "--time", "10", "--quiet", "--reports", str(tmp_path / "reports")],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    victim, deadline = None, time.monotonic() + 120
    try:
        while victim is None:  # a job whose worker is mid-trial
            assert run.poll() is None and time.monotonic() < deadline, run.communicate()[1][-3000:]
            held = [_job_of(t) for t in _trials(out) if t.state == RUNNING and "seed" in t.user_attrs]
            victim = next((job for job in held if job), None)
            time.sleep(0.3)
        subprocess.run(["scancel", victim], check=True, timeout=30)
        stdout, stderr = run.communicate(timeout=240)
    finally:
        if run.poll() is None:
            run.send_signal(signal.SIGINT)  # the run cancels its jobs
            run.communicate(timeout=60)
    assert run.returncode == 0, stderr[-3000:]
    ids = [job["id"] for job in recorded(out)]
    assert len(ids) == 3 and victim in ids and f"submitted 3 SLURM job(s): {' '.join(ids)}" in stdout

    trials = _trials(out)
    planned = sorted((v, s) for v in ("base", "wider") for s in (0, 1, 2))
    complete = collections.Counter(
        (t.user_attrs["variant"], t.user_attrs["seed"]) for t in trials if t.state == COMPLETE
    )
    assert sorted(complete) == planned and set(complete.values()) == {1}, complete
    assert not [t for t in trials if t.state == RUNNING]
    assert [t.user_attrs["failure"] for t in trials if t.state == FAIL] == [
        "interrupted"
    ]  # the cancelled one
    on_slurm = _finished(f"sqlite:///{out / 'mlflow.db'}")
    assert sorted(key for key, _ in on_slurm) == planned and set(on_slurm.values()) == {1}

    # The same study in one process (no sleeping: the numbers do not depend on it).
    alone = load_study(study, overrides=["model.config.sleep=0"])
    stores = Stores.for_study(alone, tmp_path / "alone")
    assert run_study(alone, stores).finished == 6
    # The override changes the configuration's name (sleep is a model setting), not its numbers.
    assert alone.name == f"{STUDY['name']}.sleep_0"
    assert _finished(stores.tracking_uri, alone.name) == on_slurm

    monkeypatch.chdir(tmp_path)  # `status` and `cancel` in this process, from where the run was started
    code, shown, err = cli("status", study)
    assert code == 0, err
    for job in recorded(out):
        state = "CANCELLED" if job["id"] == victim else "COMPLETED"
        assert f"job {job['id']}: {state}  log {job['log']}" in shown
        assert Path(job["log"]).is_file()
    code, said, _ = cli("cancel", study)
    assert code == 0 and "cancelled 0 of 3 SLURM job(s)" in said
    assert json.loads((out / "slurm" / "jobs.json").read_text())["jobs"][0]["id"] == ids[0]


def test_a_rerun_follows_the_jobs_still_queued_instead_of_submitting_more(tmp_path, monkeypatch):
    """The shell that followed a submission was lost: `ablate run` again follows its live jobs."""
    from ablate.commands import slurm as launcher

    study = load_study(_write(tmp_path), check_files=False)
    stores = Stores.for_study(study, tmp_path / "out")
    launcher.record(stores.output_dir, [("41_0", "o", "e"), ("41_1", "o", "e"), ("40_0", "o", "e")])
    monkeypatch.setattr(
        launcher, "states", lambda ids: {i: "COMPLETED" if i.startswith("40") else "RUNNING" for i in ids}
    )
    monkeypatch.setattr(launcher, "submit", lambda *a: pytest.fail("submitted again"))
    assert launcher.start_jobs(study, stores, 2, job_settings(study)) == ["41_0", "41_1"]
    submitted = []
    monkeypatch.setattr(launcher, "states", lambda ids: dict.fromkeys(ids, "COMPLETED"))
    monkeypatch.setattr(launcher, "submit", lambda *a: submitted.append(a[2]) or ["42_0"])
    assert launcher.start_jobs(study, stores, 2, job_settings(study)) == ["42_0"] and submitted == [2]

"""What a run records about the conditions its numbers reproduce under, what it says while it runs
and when it ends, and what ``ablate.run`` hands back.

One tiny study (2 variants × 3 seeds, 2 epochs) is trained once for the module, through
``ablate.run`` with ``train.threads: 1``; the log's lines are another tiny study's, through the CLI."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys

import pandas as pd
import pytest
import yaml
from mlflow import MlflowClient
from tiny_study import tiny_spec

import ablate
from ablate.commands import progress as progress_module
from ablate.tracking.provenance import PREFIX, conditions, described, pin_threads

FAST_REPORT = {"calibration": 0, "bootstrap": 200}


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    """The study's folder, ``ablate.run(..., quiet=True)``'s return value and what it printed."""
    folder = tmp_path_factory.mktemp("prov")
    spec = tiny_spec({"name": "prov", "report": FAST_REPORT, "train": {"threads": 1}, "seeds": [0, 1, 2]})
    spec["output"] = str(folder / "runs" / "prov")
    (folder / "prov.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        results = ablate.run(folder / "prov.yaml", quiet=True)
    return folder, results, printed.getvalue()


def test_quiet_run_prints_nothing_and_returns_the_verdicts(ran):
    folder, results, printed = ran
    assert printed == ""
    verdicts = results.comparisons
    assert set(verdicts.metric) == {"ndcg@10", "hr@10"}
    mlp = verdicts[(verdicts.metric == "ndcg@10") & (verdicts.variant == "mlp")].iloc[0]
    assert mlp.verdict in ("better", "worse", "equivalent", "inconclusive")
    written = pd.read_csv(folder / "runs" / "prov" / "report" / "comparisons.csv")
    assert written.verdict.tolist() == verdicts.verdict.tolist()


def test_runs_record_the_conditions_their_numbers_reproduce_under(ran):
    folder, results, _ = ran
    client = MlflowClient(f"sqlite:///{folder / 'runs' / 'prov' / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("prov").experiment_id])
    assert len(runs) == 7  # the study's run and 6 trials
    import torch

    for run in runs:
        tags = run.data.tags
        assert tags[PREFIX + "threads"] == f"1 / {torch.get_num_interop_threads()}"  # train.threads: 1
        assert tags[PREFIX + "torch"] == torch.__version__
        assert tags[PREFIX + "cpu_capability"] == torch.backends.cpu.get_cpu_capability()
        assert tags[PREFIX + "deterministic"] == "false"
        said = "OMP_WAIT_POLICY=" if ablate.WAIT_POLICY_SET else "torch was loaded before ablate"
        assert said in tags[PREFIX + "thread_env"]
        blas = tags[PREFIX + "blas"].split(" ")[0]
        assert f"BLAS_INFO={blas}" in torch.__config__.show()
    methods = (folder / "runs" / "prov" / "report" / "report.md").read_text()
    assert "reproduce bit for bit" in methods and "threads (intra-op / inter-op): 1 / " in methods
    assert results.meta["conditions"][0] == ("torch", torch.__version__)


def test_threads_leave_the_fingerprint_alone(write_study):
    from ablate.drive.ledger import fingerprint
    from ablate.study.load import load_study

    path = write_study()
    assert fingerprint(load_study(path), "base") == fingerprint(
        load_study(path, overrides=["train.threads=3"]), "base"
    )


def test_conditions_name_the_thread_count_pinned_and_the_environment(monkeypatch):
    import torch

    before = torch.get_num_threads()
    try:
        pin_threads(1)
        assert conditions()[PREFIX + "threads"].startswith("1 / ")
    finally:
        torch.set_num_threads(before)
    monkeypatch.setenv("MKL_NUM_THREADS", "3")
    assert "MKL_NUM_THREADS=3" in conditions()[PREFIX + "thread_env"]
    # A compiled step (train.compile) is said with the fast paths; eager, the tag is as before it existed.
    assert conditions()[PREFIX + "fast_paths"] == conditions(compiled="off")[PREFIX + "fast_paths"]
    assert "compiled" not in conditions()[PREFIX + "fast_paths"]
    compiled = conditions(compiled="default")[PREFIX + "fast_paths"]
    assert compiled.endswith("; step forward compiled (train.compile: default)")
    labels = [label for label, _ in described(conditions())]
    assert labels[:5] == ["torch", "BLAS / LAPACK", "CPU", "CPU kernels", "threads (intra-op / inter-op)"]


def test_openmp_waits_passively_unless_torch_came_first():
    """Set before torch loads (ablate's import), not overriding a user's own choice."""
    code = "import ablate, os; print(os.environ.get('OMP_WAIT_POLICY'), ablate.WAIT_POLICY_SET)"
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    said = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert said.stdout.split() == ["PASSIVE", "True"]
    said = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**env, "OMP_WAIT_POLICY": "ACTIVE"}
    )
    assert said.stdout.split() == ["ACTIVE", "True"]
    first = "import torch; " + code
    said = subprocess.run([sys.executable, "-c", first], capture_output=True, text=True, env=env)
    assert said.stdout.split() == ["None", "False"]  # too late to set: not set, and the tags say so


def test_the_log_starts_with_the_plan_beats_during_trials_and_ends_with_the_verdicts(
    write_study, cli, tmp_path, monkeypatch
):
    monkeypatch.setattr(progress_module, "HEARTBEAT_S", 0.0)  # a heartbeat at every step and epoch
    path = write_study({"train": {"epochs": 3}, "report": FAST_REPORT})
    code, out, err = cli("run", str(path))
    assert code == 0, err
    lines = err.splitlines()
    assert lines[0].startswith(
        "plan: 2 variants × 2 seeds = 4 trials, 3 epochs each, in this process; output "
    )
    assert "MLflow sqlite:///" in lines[0] and "report " in lines[0]
    assert any(line.startswith("trial 1/4 base · seed 0: epoch 2/3 done, valid ndcg@10 ") for line in lines)
    assert any(line.startswith("trial 2/4 base · seed 1: in epoch 1/3 (") for line in lines)
    assert "Verdicts on ndcg@10 (the primary metric; higher is better)" in out
    assert any(line.startswith(("- mlp is ", "- mlp: ")) for line in out.splitlines())
    results = pd.read_csv(tmp_path / "runs" / "tiny" / "report" / "results.csv")
    at_cap = (results.best_epoch == results.epochs).any()  # the warning's first sign
    assert ("warning: not converged: " in out) == (at_cap or "still improving" in out)


def test_a_report_shows_the_study_it_reports(ran, cli, tmp_path):
    """The run's own report shows the study as it ran; ``ablate report`` with a variant left out
    shows the study it reports (without that variant), and says that it is not the stored one."""
    folder, _, _ = ran
    own = (folder / "runs" / "prov" / "report" / "report.md").read_text()
    assert "The study as it ran:" in own and "The study as reported" not in own
    assert "\n  mlp:\n" in own.split("Resolved study")[-1]
    code, _, err = cli(
        "report", folder / "prov.yaml", "~variants.mlp", "-o", folder / "runs" / "prov", "--reports", tmp_path
    )
    assert code == 0, err
    reported = (tmp_path / "prov" / "report.md").read_text()
    assert "The study as reported: the study file given to `ablate report`" in reported
    assert "The study as it ran:" not in reported
    assert "mlp" not in reported.split("Resolved study")[-1].split("```")[1]
    assert set(pd.read_csv(tmp_path / "prov" / "results.csv")["variant"]) == {"base"}  # its trials left out


def test_the_conditions_are_said_of_the_trials_they_were_recorded_for():
    """The conditions are the study run's: trials copied in (``--reuse``) ran under their sources',
    and a report of copied trials alone (rebuilt from trial files) does not call these theirs."""
    from ablate.report.methods import CONDITIONS_TEXT, software_elements

    def text(**meta):
        elements = software_elements({"conditions": [("torch", "2.13.0+cpu")], **meta})
        return next(e for e in elements if e.kind == "p" and "conditions" in e.text).text

    assert text() == CONDITIONS_TEXT
    copied = [("base", 0, "reports/x/trials"), ("base", 1, "reports/x/trials")]
    assert text(reused=copied, trained_here=0).startswith("No trial was trained in this study")
    partly = text(reused=copied, trained_here=4)
    assert (
        partly.startswith("The 4 trial(s) trained in this study reproduce bit for bit")
        and "the 2 copied in" in partly
    )
    # The copies' own conditions, grouped as their sources recorded them; a source without them says so.
    groups = [[3, [["torch", "2.12.0+cpu"], ["CPU", "Intel Xeon"]]], [1, []]]
    elements = software_elements({"conditions": [("torch", "2.13.0+cpu")], "copied_conditions": groups})
    listed = [e.items for e in elements if e.kind == "list"][-1]
    assert listed == [
        "3 trial(s): torch: 2.12.0+cpu; CPU: Intel Xeon",
        "1 trial(s): not recorded by their source",
    ]


def test_trials_trained_under_different_conditions_are_listed_by_group(ran, tmp_path):
    """A study resumed on another machine, or workers on several hosts: the Methods lists the trained
    trials' own conditions (shared ones once, the rest by group with their counts), and the study
    run's, which are the last process's, do not speak for trials that process did not train."""
    import shutil

    from ablate.report.methods import software_elements
    from ablate.tracking.results import load_results

    folder, _, _ = ran
    store = tmp_path / "prov"
    shutil.copytree(folder / "runs" / "prov", store)
    uri = f"sqlite:///{store / 'mlflow.db'}"
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("prov").experiment_id])
    study = next(r for r in runs if r.data.tags["ablate.role"] == "study")
    trials = sorted((r for r in runs if r.data.tags["ablate.role"] == "trial"), key=lambda r: r.info.run_id)
    recorded = described(trials[0].data.tags)

    # The study run resumed on another host that trained nothing: the trials' own conditions stand.
    client.set_tag(study.info.run_id, PREFIX + "cpu", "Other CPU (64 logical cores)")
    meta = load_results(uri, "prov").meta
    assert meta["conditions"] == recorded and "trained_conditions" not in meta

    # Two of the six trained on that host, at 4 threads.
    for run in trials[:2]:
        client.set_tag(run.info.run_id, PREFIX + "cpu", "Other CPU (64 logical cores)")
        client.set_tag(run.info.run_id, PREFIX + "threads", "4 / 4")
    meta = load_results(uri, "prov").meta
    assert [n for n, _ in meta["trained_conditions"]] == [4, 2]
    elements = software_elements(meta)
    said = [e.text for e in elements if e.kind == "p"]
    assert said[1].startswith("The 6 trial(s) trained in this study ran under 2 different sets of conditions")
    lists = [e.items for e in elements if e.kind == "list"]
    assert lists[0][0] == f"torch: {dict(recorded)['torch']}"  # shared by all, said once
    assert not any(item.startswith(("CPU:", "threads")) for item in lists[0])
    own = dict(recorded)
    threads = own["threads (intra-op / inter-op)"]
    assert lists[1] == [
        f"4 trial(s): CPU: {own['CPU']}; threads (intra-op / inter-op): {threads}",
        "2 trial(s): CPU: Other CPU (64 logical cores); threads (intra-op / inter-op): 4 / 4",
    ]

"""The researcher's own training function as a task (task kind ``function``, issue 39): the
examples in examples/ (a plain loop, a Lightning module, a Hugging Face ``Trainer``) run through
the driver at a tiny size, a callable that does not import is one line at validation, a function
that raises fails its trial alone, and a changed script is a new fingerprint."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml

from ablate.drive.ledger import fingerprint
from ablate.study.load import load_study
from ablate.tasks import TrialReporter

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
VERDICTS = {"better", "worse", "equivalent", "inconclusive"}


def run_example(cli, tmp_path: Path, folder: str, *overrides: str) -> pd.DataFrame:
    """``ablate run`` on a copy of an example at 2 seeds; its report's comparison rows."""
    shutil.copytree(EXAMPLES / folder, tmp_path / folder)
    study = tmp_path / folder / "study.yaml"
    code, out, err = cli("run", study, "--output", tmp_path / "out", "seeds=[0,1]", *overrides)
    assert code == 0, out + err
    results = pd.read_csv(tmp_path / "out" / "report" / "results.csv")
    assert len(results) == 4  # 2 variants × 2 seeds
    comparisons = pd.read_csv(tmp_path / "out" / "report" / "comparisons.csv")
    comparisons.attrs["log"] = out + err
    return comparisons


def assert_verdict_rows(comparisons: pd.DataFrame, variant: str) -> None:
    """The variant's comparison row against the baseline: its mean over 2 seeds, its paired
    difference, and a verdict — or, at 2 paired seeds, no verdict and a note saying why."""
    rows = comparisons[comparisons["variant"] == variant]
    assert len(rows) == 1, comparisons
    row = rows.iloc[0]
    assert row["n_seeds"] == 2 and row["n_paired"] == 2
    assert pd.notna(row["mean"]) and pd.notna(row["delta"])
    if pd.isna(row["verdict"]):
        assert row["note"] == "2 paired seeds: a verdict needs ≥ 3"
    else:
        assert row["verdict"] in VERDICTS


def test_a_plain_pytorch_loop_runs_through_the_driver(tmp_path, cli):
    comparisons = run_example(cli, tmp_path, "torch_loop", "model.config.rows=100", "model.config.epochs=2")
    assert_verdict_rows(comparisons, "wider")
    # The plan and the cost table say what the run did: its function's epochs (2 here), not
    # train.epochs; no parameter count or throughput where its own code measured none.
    assert "each trained by the task's own code" in comparisons.attrs["log"]
    assert " epochs each" not in comparisons.attrs["log"]
    report = (tmp_path / "out" / "report" / "report.md").read_text(encoding="utf-8")
    cost = report.split("## Cost")[1].split("\n## ")[0]
    header, _, base = [line.split(" | ") for line in cost.splitlines() if line.startswith("|")][:3]
    assert base[header.index("params")] == base[header.index("tokens/s")] == "n/a"
    assert header[-1].strip(" |") == "epochs" and base[-1].strip(" |") == "2.0"


def run_example_writing_nowhere_else(cli, tmp_path: Path, monkeypatch, folder: str, *overrides: str):
    """:func:`run_example` from an empty working directory, which stays empty, as does the example's
    folder apart from Python's bytecode: a framework's own files (``lightning_logs/``, a
    ``Trainer``'s ``output_dir``) go to the trial's checkpoint path, removed once the trial ends."""
    workdir = tmp_path / "workdir"
    workdir.mkdir()
    monkeypatch.chdir(workdir)
    comparisons = run_example(cli, tmp_path, folder, *overrides)
    assert list(workdir.iterdir()) == []
    example_files = {path.name for path in (tmp_path / folder).iterdir()} - {"__pycache__"}
    assert example_files == {"study.yaml", "train.py"}
    assert list((tmp_path / "out").rglob("*.own")) == []  # the trials' own folders, removed
    return comparisons


class SilentReporter(TrialReporter):
    """A reporter for calling an example's ``train`` outside the driver."""

    def __init__(self, seed: int, checkpoint_path: Path):
        self.seed, self.device, self.checkpoint_path = seed, "cpu", checkpoint_path

    def report(self, epoch: int, metrics: dict[str, float]) -> None:
        pass

    def should_prune(self) -> bool:
        return False

    def save_state(self, state: dict) -> None:
        pass

    def resume_state(self) -> None:
        return None


def assert_seed_0_trains_again_to_the_same_numbers(tmp_path: Path, folder: str, **config) -> None:
    """The example's ``train`` called afresh with base's configuration and seed 0 gives the numbers
    the driver recorded for that trial (other trials ran in between, other RNG states)."""
    spec = importlib.util.spec_from_file_location(f"example_{folder}", tmp_path / folder / "train.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    study = yaml.safe_load((tmp_path / folder / "study.yaml").read_text())
    metrics = example.train({**study["model"]["config"], **config}, 0, SilentReporter(0, tmp_path / "again"))
    results = pd.read_csv(tmp_path / "out" / "report" / "results.csv")
    recorded = results[(results["variant"] == "base") & (results["seed"] == 0)].iloc[0]
    assert metrics["valid.acc"] == pytest.approx(recorded["valid.acc"], abs=1e-6)
    assert metrics["test.acc"] == pytest.approx(recorded["test.acc"], abs=1e-6)


@pytest.mark.heavy
def test_a_lightning_module_runs_through_the_driver(tmp_path, cli, monkeypatch):
    pytest.importorskip("lightning", reason="no 'lightning' extra (pip install -e '.[lightning]')")
    comparisons = run_example_writing_nowhere_else(
        cli, tmp_path, monkeypatch, "lightning_module", "model.config.rows=100", "model.config.epochs=2"
    )
    assert_verdict_rows(comparisons, "dropout")
    assert_seed_0_trains_again_to_the_same_numbers(tmp_path, "lightning_module", rows=100, epochs=2)


@pytest.mark.heavy
def test_a_hugging_face_trainer_runs_through_the_driver(tmp_path, cli, monkeypatch):
    pytest.importorskip("transformers", reason="no 'hf' extra (pip install -e '.[hf]')")
    pytest.importorskip("accelerate", reason="no 'hf' extra (pip install -e '.[hf]'): the Trainer needs it")
    comparisons = run_example_writing_nowhere_else(
        cli, tmp_path, monkeypatch, "hf_trainer", "model.config.rows=100", "model.config.epochs=2"
    )
    assert_verdict_rows(comparisons, "deeper")
    assert_seed_0_trains_again_to_the_same_numbers(tmp_path, "hf_trainer", rows=100, epochs=2)


def test_the_readmes_own_model_commands_name_the_examples_as_run_above():
    """README's 'Your own model' commands are the ones the tests above run (there at a tiny size),
    each framework's with the extra pyproject.toml declares."""
    readme = (EXAMPLES.parent / "README.md").read_text()
    section = readme.split("## Your own model", 1)[1].split("\n## ", 1)[0]
    assert ".venv/bin/ablate run examples/torch_loop/study.yaml\n" in section
    for extra, folder in [("lightning", "lightning_module"), ("hf", "hf_trainer")]:
        command = f"-e '.[{extra}]' && .venv/bin/ablate run examples/{folder}/study.yaml\n"
        assert command in section
        assert f'{extra} = ["' in (EXAMPLES.parent / "pyproject.toml").read_text()


SCRIPT = """
def train(config, seed, reporter):
    reporter.report(1, {"valid.acc": 0.5 + seed / 100})
    if config["mode"] == "raise":
        raise ValueError("the user's code broke")
    if config["mode"] == "missing":
        return {"valid.acc": 0.5}
    return {"acc": 0.5 + seed / 100}  # a plain name: valid.acc and test.acc both
"""

STUDY = """
name: own
task: {kind: function, callable: "train.py:train"}
model: {config: {mode: plain}}
variants:
  broken: {config: {mode: raise}}
  partial: {config: {mode: missing}}
seeds: [0, 1]
metrics: {primary: acc}
"""


def test_a_failing_function_fails_its_trials_not_the_study(tmp_path, cli):
    (tmp_path / "train.py").write_text(SCRIPT)
    (tmp_path / "study.yaml").write_text(STUDY)
    code, out, err = cli("run", tmp_path / "study.yaml", "--output", tmp_path / "out")
    assert code == 1  # some trials failed
    assert "broken seed 0: ValueError: the user's code broke" in err
    assert "partial seed 1: the training function returned no test.acc" in err
    results = pd.read_csv(tmp_path / "out" / "report" / "results.csv")
    assert sorted(results["variant"]) == ["base", "base"]


def test_a_callable_that_does_not_import_is_one_line_at_validation(tmp_path, cli):
    (tmp_path / "train.py").write_text("def other(config, seed, reporter):\n    return {}\n")
    (tmp_path / "study.yaml").write_text(STUDY)
    code, out, err = cli("validate", tmp_path / "study.yaml")
    assert code == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "study.yaml:3: task.callable: cannot find 'train.py:train'" in lines[0]
    assert "train.py defines no 'train'" in lines[0]


def test_model_config_is_refused_by_a_task_that_trains_ablates_model(tmp_path):
    (tmp_path / "study.yaml").write_text(
        "name: s\ntask: {kind: seqrec, data: {format: synthetic}}\nmodel: {config: {a: 1}}\n"
        "metrics: {primary: ndcg@10}\n"
    )
    with pytest.raises(Exception, match="model.config: the seqrec task trains ablate's model"):
        load_study(tmp_path / "study.yaml")


def test_a_changed_script_is_a_new_fingerprint_and_a_changed_config_too(tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    (tmp_path / "study.yaml").write_text(STUDY)
    before = load_study(tmp_path / "study.yaml")
    assert fingerprint(before, "base") != fingerprint(before, "broken")  # configs differ
    assert before.variants["broken"].differs_from(before.variants["base"]) == "config.mode: raise"
    (tmp_path / "train.py").write_text(SCRIPT + "\n# changed\n")
    after = load_study(tmp_path / "study.yaml")
    assert fingerprint(after, "base") != fingerprint(before, "base")  # before: the script as imported
    assert fingerprint(after, "base") == fingerprint(load_study(tmp_path / "study.yaml"), "base")

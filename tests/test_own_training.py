"""The researcher's own training function as a task (task kind ``function``, issue 39): the
examples in examples/ run through the driver at a tiny size, a callable that does not import is
one line at validation, a function that raises fails its trial alone, and a changed script is a
new fingerprint."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest

from ablate.drive.ledger import fingerprint
from ablate.study import load_study

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
    return pd.read_csv(tmp_path / "out" / "report" / "comparisons.csv")


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


def test_the_readmes_own_model_command_names_the_example_as_run_above():
    """README's 'Your own model' command is the one the test above runs (there at a tiny size)."""
    readme = (EXAMPLES.parent / "README.md").read_text()
    section = readme.split("## Your own model", 1)[1].split("\n## ", 1)[0]
    assert ".venv/bin/ablate run examples/torch_loop/study.yaml\n" in section


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
    assert "study.yaml:3: task.callable: cannot import 'train.py:train'" in lines[0]
    assert "AttributeError" in lines[0]


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

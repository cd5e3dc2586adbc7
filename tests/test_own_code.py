"""The researcher's own training function (task kind ``function``, issue 39): a trial stopped
mid-way resumes through the reporter's ``save_state`` / ``resume_state`` at the epoch it saved and
ends with the numbers of a run never stopped; its fingerprint covers the local modules beside the
callable, not other files, and ``task.version`` is the study's way to say those changed;
``ablate validate`` shows the callable and each variant's configuration, not ablate's model."""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient

from ablate.cache import file_digest
from ablate.drive.ledger import fingerprint
from ablate.faults import KILL_ENV
from ablate.study.load import load_study
from ablate.tasks import TrialReporter
from ablate.tracking.results import load_results
from ablate.training.trainer import seed_everything

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
TINY = ["seeds=[0]", "model.config.rows=100", "model.config.epochs=4"]


class Recording(TrialReporter):
    """A reporter for calling the example's ``train`` outside the driver: keeps the curves."""

    def __init__(self, seed: int, checkpoint_path: Path):
        self.seed, self.device, self.checkpoint_path = seed, "cpu", checkpoint_path
        self.curves: dict[tuple[int, str], float] = {}

    def report(self, epoch: int, metrics: dict[str, float]) -> None:
        self.curves.update({(epoch, key): value for key, value in metrics.items()})

    def should_prune(self) -> bool:
        return False

    def save_state(self, state: dict) -> None:
        pass

    def resume_state(self) -> None:
        return None


@pytest.mark.heavy
def test_a_killed_own_trial_resumes_at_its_saved_epoch_to_the_uninterrupted_numbers(tmp_path, cli):
    """examples/torch_loop saves its model, optimiser and batch generator after each epoch. Killed
    (SIGKILL) as it reports epoch 3 of base, the state of epoch 2 is on disk; the same command
    resumes there and ends with every number of the function run once, never stopped (called
    here as the driver calls it: the global generators seeded with the seed), curves included."""
    shutil.copytree(EXAMPLES / "torch_loop", tmp_path / "torch_loop")
    study = tmp_path / "torch_loop" / "study.yaml"
    out = tmp_path / "out"
    command = [sys.executable, "-m", "ablate.commands.cli", "run", str(study), *TINY, "--output", str(out)]
    run = subprocess.run(
        command, cwd=tmp_path, env={**os.environ, KILL_ENV: "train@3"}, capture_output=True, text=True
    )
    assert run.returncode == -signal.SIGKILL, run.stderr[-2000:]
    assert json.loads((out / "checkpoints" / "base-seed0.json").read_text())["epoch"] == 2

    code, _, err = cli("worker", study, *TINY, "--output", out, "--quiet")  # the trials, no report
    assert code == 0, err
    client = MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
    # A study of its own, named for the overrides that change what it trains.
    experiment = client.get_experiment_by_name("torch-loop.rows_100.epochs_4")
    finished = client.search_runs(
        [experiment.experiment_id], "tags.variant = 'base' and attributes.status = 'FINISHED'"
    )
    assert [run.data.tags.get("ablate.resumed_from_epoch") for run in finished] == ["2"]
    assert list((out / "checkpoints").glob("*")) == []  # the trial ended: its states are gone

    spec = importlib.util.spec_from_file_location("torch_loop_example", tmp_path / "torch_loop" / "train.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    config = load_study(study, overrides=TINY).variants["base"].spec.config
    never = Recording(0, tmp_path / "never")
    seed_everything(0)
    metrics = example.train(copy.deepcopy(config), 0, never)
    got = load_results(f"sqlite:///{out / 'mlflow.db'}", "torch-loop.rows_100.epochs_4")
    row = got.results.set_index("variant").loc["base"]
    assert (row["valid.acc"], row["test.acc"], row["epochs"]) == (
        metrics["valid.acc"],
        metrics["test.acc"],
        4,
    )
    curves = got.curves[got.curves["variant"] == "base"]
    assert dict(zip(zip(curves["epoch"], curves["metric"], strict=True), curves["value"], strict=True)) == (
        never.curves
    )
    assert sorted({epoch for epoch, _ in never.curves}) == [1, 2, 3, 4]


STUDY = """
name: own
task: {kind: function, callable: "train.py:train"}
model: {config: {width: 4}}
variants:
  wider: {config: {width: 8}}
metrics: {primary: acc}
"""
SCRIPT = """from own_helpers import score

def train(config, seed, reporter):
    return {"acc": score(config)}
"""


def _project(folder: Path) -> Path:
    """A study beside its script, which imports a module beside it and a package beside it."""
    folder.mkdir()
    (folder / "study.yaml").write_text(STUDY)
    (folder / "train.py").write_text(SCRIPT)
    helper = "from own_lib.core import scale\n\ndef score(c):\n    return scale(c)\n"
    (folder / "own_helpers.py").write_text(helper)
    (folder / "own_lib").mkdir()
    (folder / "own_lib" / "__init__.py").write_text("")
    (folder / "own_lib" / "core.py").write_text("def scale(c):\n    return c['width'] / 10\n")
    (folder / "notes.txt").write_text("a file the code does not import\n")
    return folder / "study.yaml"


def test_local_modules_beside_the_script_are_in_the_fingerprint(tmp_path):
    study = _project(tmp_path / "project")
    before = fingerprint(load_study(study), "base")

    def after(*overrides: str) -> str:
        return fingerprint(load_study(study, overrides=overrides), "base")

    (tmp_path / "project" / "notes.txt").write_text("edited, and longer than before\n")
    assert after() == before  # not Python code: not covered
    (tmp_path / "project" / "README.md").write_text("# not code\n")
    assert after() == before
    (tmp_path / "project" / "own_helpers.py").write_text(
        "from own_lib.core import scale\n\ndef score(c):\n    return scale(c) + 0.0\n"
    )
    edited_helper = after()
    assert edited_helper != before  # a module beside the script
    (tmp_path / "project" / "own_lib" / "core.py").write_text("def scale(c):\n    return c['width'] / 100\n")
    assert after() not in (before, edited_helper)  # a module of a package beside it
    # Moved elsewhere, the same code keeps its fingerprints.
    shutil.copytree(tmp_path / "project", tmp_path / "moved")
    assert fingerprint(load_study(tmp_path / "moved" / "study.yaml"), "base") == after()
    # What the digest cannot see (a library's version, the data it reads): the study says so.
    assert after("task.version=2") != after() and after("task.version=2") == after("task.version=2")


def test_a_module_in_a_package_is_covered_with_its_whole_top_level_package(tmp_path):
    package = tmp_path / "own_pkg"
    (package / "models").mkdir(parents=True)
    for path in (package / "__init__.py", package / "models" / "__init__.py"):
        path.write_text("")
    script = SCRIPT.replace("from own_helpers import", "from ..util import")
    (package / "models" / "train.py").write_text(script)
    (package / "util.py").write_text("def score(c):\n    return 0.5\n")
    (tmp_path / "study.yaml").write_text(STUDY.replace('"train.py:train"', '"own_pkg.models.train:train"'))
    before = fingerprint(load_study(tmp_path / "study.yaml"), "base")
    (package / "util.py").write_text("def score(c):\n    return 0.25\n")
    assert fingerprint(load_study(tmp_path / "study.yaml"), "base") != before


def test_a_script_alone_in_its_folder_keeps_the_fingerprint_it_had_before_modules_were_covered(tmp_path):
    """As issue 39 first made it: the callable's name and its file's SHA-256, nothing more."""
    shutil.copytree(EXAMPLES / "torch_loop", tmp_path / "torch_loop")
    study = load_study(tmp_path / "torch_loop" / "study.yaml")
    content = hashlib.sha256((tmp_path / "torch_loop" / "train.py").read_bytes()).hexdigest()
    assert file_digest(tmp_path / "torch_loop" / "train.py") == content
    assert study.task.code_digest() == hashlib.sha256(f"train.py:train\0{content}".encode()).hexdigest()[:16]


def test_validate_shows_the_callable_and_each_variants_configuration(cli):
    code, out, err = cli("validate", EXAMPLES / "torch_loop" / "study.yaml")
    assert code == 0, err
    header = next(line for line in out.splitlines() if "variant" in line and "┃" in line)
    assert [cell.strip() for cell in header.strip("┃").split("┃")] == ["variant", "config"]
    for ablates_own in ("attention", "ffn", "norm", "connection", "parameters", "training memory"):
        assert ablates_own not in out, ablates_own
    rows = {
        cells[0]: cells[1]
        for line in out.splitlines()
        if line.startswith("│") and len(cells := [c.strip() for c in line.strip("│").split("│")]) == 2
    }
    assert rows == {
        "base": "rows: 1200, width: 16, depth: 2, lr: 0.01, epochs: 15, batch_size: 64",
        "wider": "rows: 1200, width: 64, depth: 2, lr: 0.01, epochs: 15, batch_size: 64",
    }
    assert "task function: callable: train.py:train" in out
    assert "examples/torch_loop/study.yaml: valid" in out

"""Shared fixtures: tiny study files and an in-process CLI runner."""

from __future__ import annotations

import os
import shutil
import sqlite3
import sys
from pathlib import Path

import pytest
import torch
import yaml
from tiny_study import TINY_STUDY, deep_update, tiny_spec  # noqa: F401 - re-exported to the test modules

# Tests use tiny tensors: one intra-op thread avoids OpenMP spin contention on 2-core machines
# (measured ~3x faster for the component tests). Subprocess tests run with the defaults.
torch.set_num_threads(1)
# The data mirror (ablate/data/catalog.py): the shared data folder beside the clone.
MIRROR = Path(__file__).resolve().parents[2] / "shared" / "data"


@pytest.fixture(autouse=True, scope="session")
def _dataset_cache(tmp_path_factory):
    """Parsed data sets go to a per-session folder, not the user's cache."""
    mp = pytest.MonkeyPatch()
    mp.setenv("ABLATE_CACHE_DIR", str(tmp_path_factory.mktemp("dataset-cache")))
    # Named data sets come from the shared data folder beside the clone: no test touches the network.
    mp.setenv("ABLATE_DATA_MIRROR", os.environ.get("ABLATE_DATA_MIRROR") or str(MIRROR))
    yield
    mp.undo()


@pytest.fixture
def write_study(tmp_path):
    """``write_study(patch=None, text=None, name="study.yaml", replace=None) -> Path`` in a temp
    folder. ``patch`` deep-merges into the tiny study; ``replace`` sets dotted keys whole."""

    def write(
        patch: dict | None = None,
        text: str | None = None,
        name: str = "study.yaml",
        replace: dict | None = None,
    ) -> Path:
        path = tmp_path / name
        if text is None:
            spec = tiny_spec(patch, replace)
            spec.setdefault("output", str(tmp_path / "runs" / spec["name"]))
            text = yaml.safe_dump(spec, sort_keys=False)
        path.write_text(text)
        return path

    return write


@pytest.fixture
def cli(capsys, monkeypatch):
    """Run the ``ablate`` CLI in-process: ``cli(*args) -> (exit_code, stdout, stderr)``."""
    from ablate.commands.cli import main

    def invoke(*args: str) -> tuple[int, str, str]:
        monkeypatch.setattr(sys, "argv", ["ablate", *map(str, args)])
        code = 0
        try:
            main()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return invoke


@pytest.fixture(scope="session")
def copy_runs():
    """``copy_runs(source, target)``: see :func:`_copy_runs`."""
    return _copy_runs


def _copy_runs(source: Path, target: Path) -> None:
    """Copy a folder of finished studies (study files and output folders) to ``target``, every
    absolute path naming ``source`` rewritten to name ``target``: MLflow's sqlite stores hold
    artifact locations and the study file's path, study files their ``output:``. A copy costs
    ~0.1 s where training the study again costs ~10 s, so a test that changes a finished study
    takes a copy of one trained once per module."""
    shutil.copytree(source, target, dirs_exist_ok=True)
    old, new = f"{source}/", f"{target}/"
    for path in target.rglob("*"):
        if path.suffix in (".yaml", ".yml", ".toml"):
            path.write_text(path.read_text().replace(old, new))
        elif path.suffix == ".db":
            with sqlite3.connect(path) as db:
                for (table,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'"):
                    for column in [row[1] for row in db.execute(f"PRAGMA table_info('{table}')")]:
                        db.execute(
                            f'UPDATE "{table}" SET "{column}" = replace("{column}", ?, ?) '
                            f'WHERE typeof("{column}") = \'text\' AND instr("{column}", ?) > 0',
                            (old, new, old),
                        )
            db.close()

"""Shared fixtures: tiny study files and an in-process CLI runner."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import yaml
from tiny_study import TINY_STUDY, deep_update, tiny_spec  # noqa: F401 - re-exported to the test modules

# Tests use tiny tensors: one intra-op thread avoids OpenMP spin contention on 2-core machines
# (measured ~3x faster for the component tests). Subprocess tests run with the defaults.
torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True, scope="session")
def _dataset_cache(tmp_path_factory):
    """Parsed data sets go to a per-session folder, not the user's cache."""
    mp = pytest.MonkeyPatch()
    mp.setenv("ABLATE_CACHE_DIR", str(tmp_path_factory.mktemp("dataset-cache")))
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
    from ablate.cli import main

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

"""Shared fixtures: tiny study files, an in-process CLI runner, and the named data sets a test
reads (``@pytest.mark.data(NAME, ...)`` or the ``data_file`` fixture): where one is not here the
test skips with one line saying how to get it, and with ``ABLATE_REQUIRE_DATA=1`` (CI) it fails."""

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

from ablate.data import catalog as datasets

# Tests use tiny tensors: one intra-op thread avoids OpenMP spin contention on 2-core machines
# (measured ~3x faster for the component tests). Subprocess tests run with the defaults.
torch.set_num_threads(1)
# No test reaches the network through Hugging Face's libraries (CI has none but the package
# registries): huggingface_hub reads these once, at its first import, so a test that sets them
# later finds them already read wherever an earlier test imported transformers, and lm-eval then
# waited on connection timeouts (97 s for a 5-s test in the suite).
for _offline in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
    os.environ.setdefault(_offline, "1")
# The data mirror (ablate/data/catalog.py): the shared data folder beside the clone, where there is one.
MIRROR = Path(__file__).resolve().parents[2] / "shared" / "data"
REQUIRE_DATA_ENV = "ABLATE_REQUIRE_DATA"  # set (CI): a test whose data set is not here fails


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "data(*names): the named data sets the test reads; it skips where one is not here"
    )
    config.addinivalue_line("markers", "heavy: takes 15 s or more on CI's machine; started first")
    # Named data sets come from $ABLATE_DATA_MIRROR, else the shared folder beside the clone, else
    # the user's own download cache (`ablate data fetch NAME` fills it; ABLATE_CACHE_DIR is a
    # per-session folder below, so the cache is named before). Nothing is downloaded: a test whose
    # data are not here skips before it reads them.
    if not os.environ.get(datasets.MIRROR_ENV) and MIRROR.is_dir():
        os.environ[datasets.MIRROR_ENV] = str(MIRROR)
    elif not os.environ.get(datasets.MIRROR_ENV):
        os.environ.pop(datasets.MIRROR_ENV, None)
        os.environ[datasets.DATA_DIR_ENV] = str(datasets.data_dir())


def pytest_collection_modifyitems(config, items):
    """The heavy tests first in each worker's share. pytest-xdist's work stealing hands each of
    its k workers one contiguous chunk of the collection (n // k, then the rest), and a worker
    that runs dry takes from the end of another's: with the heavy tests dealt round-robin to the
    front of every chunk, no 90-s test is left to start last while the other worker idles (in one
    chunk, they were: the last 20 minutes ran them in turn). Otherwise in file order."""
    k = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))  # set in each worker (-n's
    # own option is not: the workers collect, the controller only hands out the chunks)
    heavy = [item for item in items if item.get_closest_marker("heavy")]
    light = [item for item in items if not item.get_closest_marker("heavy")]
    ordered, left = [], len(items)
    for worker in range(k):
        size = left // (k - worker)  # xdist's first distribution: what is left, split evenly
        mine = heavy[worker::k]
        fill = max(0, size - len(mine))
        ordered += mine + light[:fill]
        light, left = light[fill:], left - len(mine) - fill
    items[:] = ordered + light


def data_missing(why: str) -> None:
    """Skip the running test for want of its data (one line: ``why``); fail it under
    ``ABLATE_REQUIRE_DATA=1``."""
    if os.environ.get(REQUIRE_DATA_ENV, "0") not in ("", "0"):
        pytest.fail(f"{REQUIRE_DATA_ENV} is set but the test {why}", pytrace=False)
    pytest.skip(why)


def need_data(*names: str) -> None:
    """Go on only where every named data set is here (its files, checked against their SHA-256)."""
    for name in names:
        dataset = datasets.lookup(name)
        if not datasets.present(dataset):
            data_missing(f"needs data set '{name}', not in {datasets.root()}: {datasets.how_to_get(dataset)}")


def pytest_runtest_setup(item):
    for mark in item.iter_markers("data"):
        need_data(*mark.args)


@pytest.fixture(scope="session")
def data_file():
    """``data_file(name, beside=None) -> Path``: where the named data set's file is here; the test
    skips (or fails under ``ABLATE_REQUIRE_DATA=1``) where the data set is not here. ``beside``: a
    file no registry entry holds that the test reads from the same folder (then its path)."""

    def find(name: str, beside: str | None = None) -> Path:
        need_data(name)
        file = datasets.root() / datasets.lookup(name).path
        if beside is None:
            return file
        if not (file.parent / beside).is_file():
            where = (file.parent / beside).relative_to(datasets.root())
            data_missing(
                f"needs {beside} beside data set '{name}', not in {file.parent}: no registry entry "
                f"fetches it; set {datasets.MIRROR_ENV} to a folder holding it as {where}"
            )
        return file.parent / beside

    return find


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

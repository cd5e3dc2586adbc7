"""The unrelated PyPI project `ablate` ships a top-level `ablate/` package too: installed beside
this one (in either order) it gives one line naming both and what to do, exit status 2 — from
`import ablate` and from the `ablate` command — never an ImportError from a package made of half of
each. Costs ~15 s and one download of the other project's wheel (~40 kB) from PyPI; our wheel is
built here from a copy of the sources, and each scratch environment is a venv without pip."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SOURCES = ["pyproject.toml", "README.md", "ablate_studies.py", "ablate_namesake.py", "ablate", "plugins"]
PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
ADVICE = "`pip uninstall ablate` and then `pip install --force-reinstall --no-deps ablate-studies`"


def _run(command: list, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in command], capture_output=True, text=True, timeout=180, **kwargs)


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> dict[str, Path]:
    """Our wheel, built from a copy of the sources (no build/ left in the work tree), and the
    other project's from PyPI (skipped where PyPI cannot be reached, except in CI)."""
    folder = tmp_path_factory.mktemp("wheels")
    index = ["--isolated", "--no-cache-dir", "--index-url", "https://pypi.org/simple"]
    fetched = _run([*PIP, "download", "--no-deps", *index, "-d", folder / "theirs", "ablate"])
    if fetched.returncode != 0:
        why = f"pypi.org could not give the `ablate` wheel: {fetched.stderr.strip()[-300:]}"
        if os.environ.get("ABLATE_CHECK_PYPI") == "1" or os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(f"{why} (needs pypi.org; CI sets ABLATE_CHECK_PYPI=1 and fails here instead)")
    source = folder / "source"
    for name in SOURCES:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            source.mkdir(exist_ok=True)
            shutil.copy2(path, source / name)
    built = _run([*PIP, "wheel", "--no-deps", "--no-build-isolation", "-w", folder / "ours", source])
    assert built.returncode == 0, built.stderr
    (theirs,) = (folder / "theirs").iterdir()
    (ours,) = (folder / "ours").iterdir()
    return {"ours": ours, "theirs": theirs}


def test_our_wheel_holds_every_module_of_the_package(wheels):
    """A subpackage missing from pyproject's `packages` would install a package without it."""
    names = set(zipfile.ZipFile(wheels["ours"]).namelist())
    modules = {p.relative_to(REPO).as_posix() for p in (REPO / "ablate").rglob("*.py")}
    assert modules <= names, sorted(modules - names)
    assert {"ablate_studies.py", "ablate_namesake.py"} <= names


def _environment(folder: Path, wheels: dict[str, Path], order: list[str]) -> Path:
    """A venv with both wheels installed in ``order``, the later one's files overwriting the
    earlier one's; this interpreter's site-packages on its path (after its own) stand in for the
    dependencies a plain `pip install` would bring."""
    _run([sys.executable, "-m", "venv", "--without-pip", folder]).check_returncode()
    python = folder / "bin" / "python"
    for name in order:
        installed = _run([*PIP, "--python", python, "install", "--no-deps", "--no-index", wheels[name]])
        assert installed.returncode == 0, installed.stderr
    site = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    (Path(site) / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return folder


def _says_the_clash(done: subprocess.CompletedProcess) -> None:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("error: ablate ") and "ablate-studies " in lines[0]
    assert "unrelated report tool" in lines[0] and ADVICE in lines[0]


@pytest.mark.parametrize("order", [["theirs", "ours"], ["ours", "theirs"]], ids=["ours-last", "theirs-last"])
def test_both_installed_is_one_line_from_import_and_from_the_command(tmp_path, wheels, order):
    """ours-last: our __init__ says it. theirs-last: their __init__ imports `ablate.report` (ours,
    a package beats their report.py), which says it; the command checks before importing the package."""
    env = _environment(tmp_path / "env", wheels, order)
    _says_the_clash(_run([env / "bin" / "python", "-c", "import ablate"], cwd=tmp_path))
    _says_the_clash(_run([env / "bin" / "ablate", "--help"], cwd=tmp_path))


@pytest.mark.heavy
def test_the_advice_mends_the_environment(tmp_path, wheels):
    env = _environment(tmp_path / "env", wheels, ["ours", "theirs"])
    python = env / "bin" / "python"
    removed = _run([*PIP, "--python", python, "uninstall", "-y", "ablate"])
    assert removed.returncode == 0, removed.stderr
    again = [
        *PIP,
        "--python",
        python,
        "install",
        "--force-reinstall",
        "--no-deps",
        "--no-index",
        wheels["ours"],
    ]
    assert _run(again).returncode == 0
    imported = _run([python, "-c", "import ablate, ablate.report; print(ablate.DISTRIBUTION)"], cwd=tmp_path)
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.strip() == "ablate-studies"
    shown = _run([env / "bin" / "ablate", "--version"], cwd=tmp_path)
    assert shown.returncode == 0 and shown.stdout.startswith("ablate 0"), shown.stderr

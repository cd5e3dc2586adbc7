"""The installed distribution: its name (free on PyPI, where `ablate` is another project), version,
entry points and the `ablate` command."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

import ablate
from ablate import registry

REPO = Path(__file__).resolve().parents[1]
NAME = "ablate-studies"


def _pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def test_the_installed_distribution_has_the_new_name_and_gives_the_version():
    assert ablate.DISTRIBUTION == NAME == _pyproject()["project"]["name"]
    dist = metadata.distribution(NAME)
    assert dist.metadata["Name"] == NAME
    assert ablate.__version__ == dist.version == _pyproject()["project"]["version"]


def test_the_installed_entry_points_are_pyprojects():
    """A stale install (or one under the old name) would register other entry points, or none."""
    project = _pyproject()["project"]
    installed = metadata.distribution(NAME).entry_points
    scripts = {ep.name: ep.value for ep in installed if ep.group == "console_scripts"}
    # the command starts outside the package, where it can check for the namesake (ablate_studies)
    assert scripts == project["scripts"] == {"ablate": "ablate_studies:main"}
    for slot in registry.SLOTS:
        group = f"ablate.{slot}"
        assert {ep.name: ep.value for ep in installed if ep.group == group} == project["entry-points"][group]
        for kind in project["entry-points"][group]:  # built-in kinds resolve to this distribution
            assert registry.provider(slot, kind) == f"{NAME} {ablate.__version__}", (slot, kind)


def test_the_ablate_command_is_installed_beside_the_interpreter():
    script = Path(sys.executable).parent / ("ablate.exe" if os.name == "nt" else "ablate")
    assert script.is_file()
    shown = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert "Usage: ablate" in shown.stdout


@pytest.mark.skipif(  # in CI (which reaches the package registries) it always runs
    os.environ.get("ABLATE_CHECK_PYPI") != "1" and not os.environ.get("CI"),
    reason="asks pypi.org; set ABLATE_CHECK_PYPI=1 to run",
)
def test_the_name_on_pypi_is_free_or_ours(tmp_path):
    """PyPI normalises `-`, `_` and `.`, so one query covers every spelling. Once published, the
    project found must be this one (same summary), never someone else's."""
    index = ["--isolated", "--no-cache-dir", "--index-url", "https://pypi.org/simple"]  # no local mirrors
    command = [sys.executable, "-m", "pip", "download", "-vv", "--no-deps", *index, "-d", str(tmp_path), NAME]
    fetched = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if fetched.returncode != 0:  # absent: PyPI answered 404 (not: pypi.org could not be reached)
        assert "No matching distribution found" in fetched.stderr, fetched.stderr
        assert f"/simple/{NAME}/: 404 Client Error" in fetched.stdout, fetched.stdout[-2000:]
        return
    (archive,) = tmp_path.iterdir()
    if archive.suffix == ".whl":
        with zipfile.ZipFile(archive) as wheel:
            (meta,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
            published = wheel.read(meta).decode()
    else:
        with tarfile.open(archive) as sdist:
            top = [m for m in sdist.getmembers() if m.name.count("/") == 1]
            (meta,) = [m for m in top if m.name.endswith("/PKG-INFO")]
            published = sdist.extractfile(meta).read().decode()
    assert f"Summary: {_pyproject()['project']['description']}" in published

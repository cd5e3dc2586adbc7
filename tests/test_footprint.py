"""What ablate leaves outside a study's output folder: nothing but its one documented cache folder
(issue 40, item 8) — MLflow's usage telemetry off unless asked for, matplotlib's font cache inside
ablate's cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

PROBE = """
import json
import ablate.tracking.store, ablate.report.figures
import matplotlib
from mlflow.telemetry.utils import is_telemetry_disabled
print(json.dumps({"telemetry_off": is_telemetry_disabled(), "mpl": matplotlib.get_cachedir()}))
"""


CI_MARKERS = (
    "PYTEST_CURRENT_TEST",
    "CI",
    "GITHUB_ACTIONS",
    "CIRCLECI",
    "GITLAB_CI",
    "JENKINS_URL",
    "TRAVIS",
    "TF_BUILD",
    "BITBUCKET_BUILD_NUMBER",
    "CODEBUILD_BUILD_ARN",
    "BUILDKITE",
    "TEAMCITY_VERSION",
    "CLOUD_RUN_EXECUTION",
    "RUNBOT_HOST_URL",
    "RUNBOT_BUILD_NAME",
    "RUNBOT_WORKER_ID",
    "DO_NOT_TRACK",
)


def _probe(tmp_path, **env):
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("ABLATE_", "MLFLOW_", "MPL", "XDG_"))}
    # MLflow switches telemetry off by itself under pytest, on CI machines and under DO_NOT_TRACK: the
    # probe runs as a user's shell would, so what is seen is ablate's own doing.
    for marker in CI_MARKERS:
        clean.pop(marker, None)
    clean.update(HOME=str(tmp_path), **env)
    done = subprocess.run([sys.executable, "-c", PROBE], env=clean, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.heavy
def test_telemetry_is_off_and_caches_stay_in_ablates_folder(tmp_path):
    seen = _probe(tmp_path)
    assert seen["telemetry_off"] is True
    assert seen["mpl"] == str(tmp_path / ".cache" / "ablate" / "matplotlib")
    assert not (tmp_path / ".config").exists()


@pytest.mark.heavy
def test_telemetry_can_be_asked_for(tmp_path):
    assert _probe(tmp_path, MLFLOW_DISABLE_TELEMETRY="false")["telemetry_off"] is False


SITE = """
import socket

def _refuse(*args, **kwargs):
    with open({log!r}, "a") as log:
        log.write(repr(args[:2]) + "\\n")
    raise OSError("network disabled by the test")

socket.getaddrinfo = _refuse
socket.create_connection = _refuse
_connect = socket.socket.connect

def _connect_local_only(self, address):
    if self.family in (socket.AF_INET, socket.AF_INET6):
        _refuse(address)
    return _connect(self, address)

socket.socket.connect = _connect_local_only
"""


@pytest.mark.heavy
def test_a_run_writes_only_its_output_folder_and_the_cache_and_looks_nothing_up(write_study, tmp_path):
    """A study run under a fresh HOME and TMPDIR, with every network call made to fail (and
    logged): afterwards HOME holds only ablate's cache folder, the temp folder is empty, and no
    network call was tried (issue 40, item 8)."""
    home, temp, site, log = (tmp_path / name for name in ("home", "tmp", "site", "network.log"))
    for folder in (home, temp, site):
        folder.mkdir()
    (site / "sitecustomize.py").write_text(SITE.format(log=str(log)))
    study = write_study(
        {"train": {"epochs": 1}, "report": {"calibration": 0}}, replace={"seeds": [0], "variants": {}}
    )
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "TMPDIR": str(temp), "PYTHONPATH": str(site)}
    done = subprocess.run(
        [sys.executable, "-m", "ablate.commands.cli", "run", str(study), "--quiet"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "runs" / "tiny" / "report" / "report.md").is_file()
    assert [p.name for p in home.iterdir()] == [".cache"] and [
        p.name for p in (home / ".cache").iterdir()
    ] == ["ablate"]
    assert not list(temp.iterdir())
    assert not log.exists(), log.read_text()

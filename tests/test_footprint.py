"""What ablate leaves outside a study's output folder: nothing but its one documented cache folder
(issue 40, item 8) — MLflow's usage telemetry off unless asked for, matplotlib's font cache inside
ablate's cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys

PROBE = """
import json
import ablate.track, ablate.report.figures
import matplotlib
from mlflow.telemetry.utils import is_telemetry_disabled
print(json.dumps({"telemetry_off": is_telemetry_disabled(), "mpl": matplotlib.get_cachedir()}))
"""


def _probe(tmp_path, **env):
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("ABLATE_", "MLFLOW_", "MPL", "XDG_"))}
    clean.pop("PYTEST_CURRENT_TEST", None)  # MLflow switches telemetry off under pytest by itself
    clean.update(HOME=str(tmp_path), **env)
    done = subprocess.run([sys.executable, "-c", PROBE], env=clean, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_telemetry_is_off_and_caches_stay_in_ablates_folder(tmp_path):
    seen = _probe(tmp_path)
    assert seen["telemetry_off"] is True
    assert seen["mpl"] == str(tmp_path / ".cache" / "ablate" / "matplotlib")
    assert not (tmp_path / ".config").exists()


def test_telemetry_can_be_asked_for(tmp_path):
    assert _probe(tmp_path, MLFLOW_DISABLE_TELEMETRY="false")["telemetry_off"] is False

"""A clone without the data: tests that read a named data set skip, each with one line naming it
and how to get it, and ``ABLATE_REQUIRE_DATA=1`` (CI) turns every such skip into a failure. Run
as a stranger's clone runs them: pytest in a subprocess, the data mirror an empty folder, the
download cache empty, and every connection off the loopback refused."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Each way a test asks for data: the marker (per parameter, and on a test), the data_file fixture,
# and a file beside a data set's; from test modules that are quick to collect.
DATA_TESTS = [
    "tests/test_studies.py::test_study_validates_with_its_data[tisasrec_ml1m]",
    "tests/test_studies.py::test_study_validates_with_its_data[duet_etth1]",
    "tests/test_studies.py::test_fuxi_alpha_switches_off_each_ams_channel",
    "tests/plugins/test_seqrec_data.py::test_sasrec_ml1m_file_loads_whole_in_file_order",
    "tests/plugins/test_seqrec_catalogue.py::test_ml1m_users_1_to_2999_against_all_3883_movies",
]
# Loaded into the subprocess with -p: a connection anywhere but the loopback is an error.
NO_NETWORK = """
import socket

_connect = socket.socket.connect


def _loopback_only(self, address):
    if self.family in (socket.AF_INET, socket.AF_INET6) and address[0] not in ("127.0.0.1", "::1"):
        raise OSError(f"the network is off in this test: {address}")
    return _connect(self, address)


socket.socket.connect = _loopback_only
"""


def _pytest(folder: Path, **env: str) -> subprocess.Popen:
    (folder / "no_network.py").write_text(NO_NETWORK)
    (folder / "mirror").mkdir()
    env = {
        **{k: v for k, v in os.environ.items() if k != "ABLATE_REQUIRE_DATA"},
        "PYTHONPATH": str(folder),
        "ABLATE_DATA_MIRROR": str(folder / "mirror"),
        "ABLATE_DATA_DIR": str(folder / "cache"),
        "COLUMNS": "1000",  # -ra's summary lines whole, as wide as any CI's terminal
        **env,
    }
    command = [sys.executable, "-m", "pytest", "-p", "no_network", "-p", "no:cacheprovider", "-n", "0"]
    command += ["-q", "-ra", "--basetemp", str(folder / "tmp"), *DATA_TESTS]
    return subprocess.Popen(
        command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def test_data_tests_skip_saying_how_to_get_the_data_and_fail_where_it_is_required(tmp_path):
    """The data tests run twice at once: as a stranger's clone runs them, and as CI does."""
    folders = {kind: tmp_path / kind for kind in ("plain", "required")}
    for folder in folders.values():
        folder.mkdir()
    started = {
        "plain": _pytest(folders["plain"]),
        "required": _pytest(folders["required"], ABLATE_REQUIRE_DATA="1"),
    }
    out = {kind: p.communicate(timeout=300)[0] for kind, p in started.items()}

    tail = out["plain"].strip().splitlines()
    assert started["plain"].returncode == 0 and tail[-1].startswith(f"{len(DATA_TESTS)} skipped"), out
    reasons = [line for line in tail if line.startswith("SKIPPED [")]  # -ra: one line per reason
    assert sum(int(re.match(r"SKIPPED \[(\d+)\]", r).group(1)) for r in reasons) == len(DATA_TESTS)
    for name in ("ml-1m-users2999", "etth1", "ml-100k", "ml-1m-sasrec-minus978"):
        said = (
            f"needs data set '{name}', not in {folders['plain'] / 'mirror'}: run `ablate data fetch {name}`"
        )
        assert any(said in r for r in reasons), (name, reasons)
    assert all("or set ABLATE_DATA_MIRROR to a folder holding" in r for r in reasons)

    # ABLATE_REQUIRE_DATA=1: each skip a failure, at setup (a marker) or in the test (data_file)
    summary = [line for line in out["required"].splitlines() if line.startswith(("ERROR ", "FAILED "))]
    assert started["required"].returncode == 1 and len(summary) == len(DATA_TESTS), out["required"]
    said = "ABLATE_REQUIRE_DATA is set but the test needs data set '"
    assert all(said in line for line in summary) and "skipped" not in out["required"], summary


def test_ci_lets_no_data_test_skip():
    assert "export ABLATE_REQUIRE_DATA=1" in (REPO / ".ci/run").read_text()

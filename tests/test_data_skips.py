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
# One test per way a test asks for data: a marker per parameter, the marker, the data_file fixture,
# a module-scoped fixture built on it, and a file beside a data set's.
DATA_TESTS = [
    "tests/test_studies.py::test_study_validates_with_its_data[tisasrec_ml1m]",
    "tests/test_schedules.py::test_duet_runs_every_horizon_with_the_published_schedule_and_widths",
    "tests/plugins/test_seqrec_data.py::test_sasrec_ml1m_file_loads_whole_in_file_order",
    "tests/plugins/test_tabular.py::test_california_loads_the_published_split",
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


def _pytest(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    (tmp_path / "no_network.py").write_text(NO_NETWORK)
    (tmp_path / "mirror").mkdir(exist_ok=True)
    env = {
        **{k: v for k, v in os.environ.items() if k != "ABLATE_REQUIRE_DATA"},
        "PYTHONPATH": str(tmp_path),
        "ABLATE_DATA_MIRROR": str(tmp_path / "mirror"),
        "ABLATE_DATA_DIR": str(tmp_path / "cache"),
        **env,
    }
    command = [sys.executable, "-m", "pytest", "-p", "no_network", "-p", "no:cacheprovider", "-n", "0"]
    command += ["-q", "-ra", "--durations=0", *DATA_TESTS]
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def test_without_the_data_each_data_test_skips_saying_how_to_get_it(tmp_path):
    done = _pytest(tmp_path)
    tail = done.stdout.strip().splitlines()
    assert done.returncode == 0 and tail[-1].startswith(f"{len(DATA_TESTS)} skipped"), done.stdout
    reasons = [line for line in tail if line.startswith("SKIPPED [")]  # -ra: one line per reason
    assert sum(int(re.match(r"SKIPPED \[(\d+)\]", r).group(1)) for r in reasons) == len(DATA_TESTS)
    for name in ("ml-1m-users2999", "etth1", "ml-1m-sasrec-minus978", "california-housing"):
        said = f"needs data set '{name}', not in {tmp_path / 'mirror'}: run `ablate data fetch {name}`"
        assert any(said in r for r in reasons), (name, reasons)
    assert all("or set ABLATE_DATA_MIRROR to a folder holding" in r for r in reasons)


def test_require_data_turns_each_skip_into_a_failure(tmp_path):
    done = _pytest(tmp_path, ABLATE_REQUIRE_DATA="1")
    summary = [line for line in done.stdout.splitlines() if line.startswith(("ERROR ", "FAILED "))]
    assert done.returncode == 1 and len(summary) == len(DATA_TESTS), done.stdout  # at setup or in the test
    said = "ABLATE_REQUIRE_DATA is set but the test needs data set '"
    assert done.stdout.count(said) == len(DATA_TESTS) and "skipped" not in done.stdout, done.stdout


def test_ci_lets_no_data_test_skip():
    assert "export ABLATE_REQUIRE_DATA=1" in (REPO / ".ci/run").read_text()

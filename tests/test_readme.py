"""The README's two commands are what CI and users run."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_ci_runs_the_readme_test_command():
    """.ci/run prepares services (PostgreSQL), then its last line is the README's test command."""
    lines = [line for line in (REPO / ".ci/run").read_text().splitlines() if line.strip()]
    readme = (REPO / "README.md").read_text()
    assert "pytest" in lines[-1] and f"```bash\n{lines[-1]}\n```" in readme
    assert not any("pytest" in line for line in lines[:-1])  # nothing else runs tests
    assert "ABLATE_REQUIRE_POSTGRES=1" in (REPO / ".ci/run").read_text()  # the PostgreSQL test may not skip
    # The lint rules (pyproject's [tool.ruff]) are checked with the tests, before them.
    assert "ruff check && .venv/bin/ruff format --check && " in lines[-1]


def test_quickstart_command_is_in_the_readme():
    readme = (REPO / "README.md").read_text()
    assert "ablate run studies/quickstart.yaml\n```" in readme
    assert "-c constraints.txt" in readme and "torch==2.13.0" in (REPO / "constraints.txt").read_text()

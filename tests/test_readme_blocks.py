"""The README's examples as a newcomer meets them: in a fresh copy of the clone (its tracked files
only), after the quickstart left its trials in runs/quickstart, every command block of "Commands"
that runs the quickstart study with overrides — the override example, the log example — and the
Python example run in order and exit 0, each in the test's own process (tests/readme_lines.py;
each configuration goes to a folder of its own: before that, the first of them stopped on the
quickstart's trials). "Writing a component" calls only the clone's own .venv binaries (its
commands are what tests/test_template.py runs)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from readme_lines import run_readme_line, run_readme_python

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()


def _blocks(language: str, section: str) -> list[str]:
    """The ``language`` code blocks of a README section (``## section``), in order."""
    start = README.index(f"\n## {section}\n")
    end = README.find("\n## ", start + 1)
    return re.findall(rf"```{language}\n(.*?)```", README[start : end if end > 0 else None], flags=re.S)


def _fresh_copy(target: Path) -> Path:
    """The clone's tracked files as they are now, nothing else (no runs/, no caches); its .venv
    is this interpreter's environment."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    for name in filter(None, listed.decode().split("\0")):
        source = REPO / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    (target / ".venv").symlink_to(Path(sys.prefix), target_is_directory=True)
    return target


@pytest.mark.heavy
def test_the_readmes_override_log_and_python_examples_run_after_the_quickstart(tmp_path, cli, monkeypatch):
    clone = _fresh_copy(tmp_path / "clone")
    monkeypatch.setenv("PATH", f"{clone / '.venv' / 'bin'}:{os.environ['PATH']}")
    # The quickstart's own trials in runs/quickstart (a shorter run kept under the quickstart's name,
    # a worker's: no report): the folder holds trials trained with other settings than the examples'.
    quickstart = ".venv/bin/ablate worker studies/quickstart.yaml name=quickstart train.epochs=1"
    less = " train.epochs=1 'seeds=[0]' '~variants.gelu-mlp' '~variants.post-norm' --quiet"
    code, _, err = run_readme_line(cli, quickstart + less, clone)
    assert code == 0, err[-2000:]
    commands = [b.strip() for b in _blocks("bash", "Commands") if "ablate run studies/quickstart.yaml" in b]
    assert len(commands) == 2, commands  # the override example, then the log example
    for command in commands:  # each line in this process (tests/readme_lines.py)
        code, _, err = run_readme_line(cli, command, clone)
        assert code == 0, (command, err[-2000:])
    assert "0 left" in (clone / "run.log").read_text()  # the log example's one line per trial
    (python,) = _blocks("python", "Commands")
    run_readme_python(python, clone)
    folders = sorted(p.name for p in (clone / "runs").iterdir())
    assert folders == ["quickstart", "quickstart.epochs_1", "quickstart.epochs_1.heads_2.mult_4"], folders


def test_writing_a_component_uses_the_clones_own_binaries():
    (block,) = [b for b in _blocks("bash", "Components are plugins") if "templates/component" in b]
    for line in block.strip().splitlines()[1:]:
        for command in re.split(r"&&", line.split("#")[0]):
            first = command.split()[0]
            assert first.startswith("../.venv/bin/"), f"{command.strip()}: not the clone's .venv"

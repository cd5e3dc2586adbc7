"""A README command line run as its reader runs it, but in the test's own process: the command's
code is the same, without a new interpreter's imports of torch, MLflow and Optuna (about 8 s a
line on CI's machine; the README tests ran 4–6 lines each)."""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable
from pathlib import Path

BINARY = ".venv/bin/ablate"  # how the README writes every command (the clone's own .venv)


def run_readme_line(cli: Callable, line: str, cwd: Path) -> tuple[int, str, str]:
    """``.venv/bin/ablate ARGS [2> FILE]`` run from ``cwd`` through ``cli`` (conftest's in-process
    runner): ``(exit code, stdout, stderr)``, stderr also written to FILE where the line sends it
    there. A line of any other form fails the test, so that the README cannot gain a line that
    this does not run as written; ``cwd/.venv/bin/ablate`` must be the installed script."""
    words = shlex.split(line, comments=True)
    log = None
    if len(words) > 2 and words[-2] == "2>":
        words, log = words[:-2], words[-1]
    assert words and words[0] == BINARY, f"not a `{BINARY} …` line: {line}"
    assert not {"|", "&&", ";", ">", "<", "2>&1"} & set(words), f"shell syntax this does not run: {line}"
    assert (cwd / BINARY).is_file(), f"{cwd / BINARY}: no such script"
    before = Path.cwd()
    os.chdir(cwd)
    try:
        code, out, err = cli(*words[1:])
    finally:
        os.chdir(before)
    if log is not None:
        (cwd / log).write_text(err)
    return code, out, err


def run_readme_python(code: str, cwd: Path) -> dict:
    """A README Python block run from ``cwd`` in this process, as a script's ``__main__``; an
    exception in it fails the test. Returns its namespace."""
    namespace = {"__name__": "__main__"}
    before = Path.cwd()
    os.chdir(cwd)
    try:
        exec(compile(code, "README.md", "exec"), namespace)  # noqa: S102 - the README's own example
    finally:
        os.chdir(before)
    return namespace

"""The bad-input corpus's harness: a case is a set of files written to a fresh folder plus the
``ablate`` arguments that read them; every case must end with exit status 2 and exactly one line
on stderr, no traceback, and that line must name where the problem is (file, line, key).

Test modules build lists of ``Case`` and parametrise one test over them with ``check``."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml
from tiny_study import tiny_spec


@dataclass(frozen=True)
class Case:
    """``files`` maps a relative path to its content (``str`` is written as UTF-8, ``bytes`` as
    is); ``args`` are the CLI arguments after ``ablate``, where ``{dir}`` is the case's folder;
    ``expect`` are substrings the one error line must contain; ``commands`` lists the commands
    the case is checked with when ``args`` starts with ``{command}`` (validate and run must agree)."""

    id: str
    files: dict[str, str | bytes]
    expect: tuple[str, ...]
    args: tuple[str, ...] = ("{command}", "{dir}/study.yaml")
    commands: tuple[str, ...] = ("validate", "run")
    exit_code: int = 2
    env: dict[str, str] = field(default_factory=dict)


def study_text(patch: dict | None = None, replace: dict | None = None, drop: tuple[str, ...] = ()) -> str:
    """The tiny test study as YAML, ``patch`` deep-merged, ``replace`` setting dotted keys whole,
    ``drop`` removing dotted keys. Its output folder is relative (``runs/``), inside the case's folder."""
    spec = tiny_spec(patch, replace)
    for dotted in drop:
        *parents, last = dotted.split(".")
        node = spec
        for key in parents:
            node = node[key]
        del node[last]
    spec.setdefault("output", "runs/tiny")
    return yaml.safe_dump(spec, sort_keys=False)


def write_case(case: Case, folder: Path) -> None:
    for relative, content in case.files.items():
        path = folder / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content.replace("{dir}", str(folder)), encoding="utf-8")


def check(case: Case, folder: Path, cli, monkeypatch) -> list[str]:
    """Run every command of ``case`` in ``folder``; assert the contract; return the error lines."""
    write_case(case, folder)
    monkeypatch.chdir(folder)
    for name, value in case.env.items():
        monkeypatch.setenv(name, value)
    commands = case.commands if "{command}" in case.args else ("",)
    lines = []
    for command in commands:
        args = [a.replace("{command}", command).replace("{dir}", str(folder)) for a in case.args]
        code, out, err = cli(*args)
        shown = f"ablate {' '.join(args)} -> exit {code}\nstdout: {out}\nstderr: {err}"
        assert "Traceback" not in out + err, shown
        assert code == case.exit_code, shown
        error_lines = [line for line in err.splitlines() if line.strip().startswith("error:")]
        assert len(error_lines) == 1, shown
        line = error_lines[0]
        for expected in case.expect:
            assert expected in line, f"{expected!r} not in the error line\n{shown}"
        lines.append(line)
    return lines

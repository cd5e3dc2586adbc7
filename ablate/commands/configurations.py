"""The configurations of one study file that have been run. Overrides that change what a trial
trains make a study of their own (:func:`ablate.study.overrides.configuration_name`), in its own
output folder beside the study's; that folder keeps the overrides that made it, so that ``ablate
report`` and ``ablate status`` given the study file without them say where its trials are instead
of describing another configuration."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from ablate.study.load import Study

OVERRIDES_FILE = "overrides.txt"  # the overrides a folder's study was run with, one per line, as given


def record(study: Study, output_dir: Path) -> None:
    """Keep the study's overrides in its output folder (nothing where it has none)."""
    if not study.overrides:
        return
    output_dir.mkdir(parents=True, exist_ok=True)
    kept = output_dir / OVERRIDES_FILE
    partial = kept.with_name(f".{kept.name}.{os.getpid()}")
    partial.write_text("".join(f"{text}\n" for text in study.overrides), encoding="utf-8")
    partial.replace(kept)


def elsewhere(study: Study, output_dir: Path) -> list[tuple[Path, list[str]]]:
    """The folders beside ``output_dir`` holding this study run with overrides, with them."""
    found = []
    for folder in sorted(output_dir.parent.glob(f"{study.name}.*")):
        kept = folder / OVERRIDES_FILE
        if kept.is_file():
            found.append((folder, kept.read_text(encoding="utf-8").splitlines()))
    return found


def not_here(study: Study, output_dir: Path, command: str) -> str:
    """Where a study file's trials are when ``output_dir`` holds none: each configuration run with
    overrides, and the command that reaches it; "" where there is none."""
    others = elsewhere(study, output_dir)
    if not others:
        return ""
    shown = [
        f"{folder} (`ablate {command} {shlex.join([str(study.path), *overrides])}`)"
        for folder, overrides in others
    ]
    return f"; this study file was run with overrides, each its own study: {'; '.join(shown)}"

"""Where a run writes: whether a folder can be written in, checked before any training (and by
``ablate validate``), and the study-file line to blame when it cannot."""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

from ablate.errors import AblateError
from ablate.schema import Locator
from ablate.study.file import read_study
from ablate.study.load import Study
from ablate.study.overrides import OverriddenLocator, parse_overrides


def folder_problem(folder: Path) -> str | None:
    """Why files cannot be written in ``folder`` (created first where missing), or None. Creates
    nothing: it probes the folder, or the nearest part of its path that exists, with a temporary
    file (which also tells a read-only file system, or a folder root may not write in)."""
    folder = Path(os.path.abspath(folder))
    probe = folder
    try:
        while not probe.exists():
            if probe.is_symlink():
                return f"{probe} is a symbolic link to a missing or looping target"
            probe = probe.parent
        if not probe.is_dir():
            made = "" if probe == folder else f", so {folder} cannot be made"
            return f"{probe} is a file, not a folder{made}"
        with tempfile.TemporaryFile(dir=probe, prefix=".ablate-probe-"):
            pass
    except OSError as exc:
        reason = os.strerror(exc.errno).lower() if exc.errno else str(exc)
        if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            return f"cannot write in {probe}: {reason}"
        return f"cannot create {folder}: {reason}"
    return None


def study_key_error(study: Study, key: tuple[str, ...], message: str) -> AblateError:
    """``file:line: key: message`` for a key of the study's file (or the override that set it)."""
    try:
        _, lines = read_study(study.path)
    except (OSError, AblateError):  # read once already (edited since?): a line number is a nicety
        lines = {}
    given = parse_overrides(study.overrides)
    where = OverriddenLocator(study.path, lines, given) if given else Locator(study.path, lines)
    return where.error(key, message)


def output_problem(study: Study) -> AblateError | None:
    """The error ``ablate run`` would stop with when the study's default output folder (its
    ``output:``, else ``runs/<name>``) cannot be written in, or None."""
    problem = folder_problem(study.output_dir())
    if problem is None:
        return None
    if study.spec.output is not None:
        return study_key_error(study, ("output",), problem)
    return AblateError(
        f"{problem} (the output folder is runs/<name> in the current folder; output: in "
        f"{study.path} or --output puts it elsewhere)"
    )

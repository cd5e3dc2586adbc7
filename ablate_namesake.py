"""The import package ``ablate`` has a namesake: the unrelated PyPI project ``ablate`` (a report
tool reading MLflow logs) ships a top-level ``ablate/`` too, so installed into one environment
the two overwrite each other's files. This module sees that and stops with one line naming both
and what to do, instead of an ``ImportError`` from half of one package importing half of the
other. It is checked as ``ablate`` is imported, by ``ablate.report`` (which the other project's
``__init__`` imports, as its ``report`` module, once its files have replaced ours), and by the
``ablate`` command before it imports the package, so the command says it whichever
``__init__`` is installed.

Stdlib only, and cheap: one metadata look-up by name (a directory listing per path entry), not a
scan of every installed distribution."""

from __future__ import annotations

import sys
from importlib import metadata

OURS = "ablate-studies"  # as ablate.DISTRIBUTION, which may be the other project's file here
THEIRS = "ablate"
CLASH_EXIT = 2  # bad input: the environment, as a study file or an argument would be


def clash_line() -> str | None:
    """One line naming both distributions and what to do when the other ``ablate`` is installed
    in this environment; None when it is not."""
    try:
        theirs = metadata.distribution(THEIRS)
    except metadata.PackageNotFoundError:
        return None
    if theirs.metadata["Name"].lower() != THEIRS:  # an older ablate-studies found under "ablate"
        return None
    try:
        ours = f"{OURS} {metadata.version(OURS)}"
    except metadata.PackageNotFoundError:  # this source tree on sys.path, never installed
        ours = f"{OURS} (this source tree)"
    return (
        f"{THEIRS} {theirs.version} (an unrelated report tool from PyPI) and {ours} (comparative "
        f"ablation studies) both install the import package 'ablate', so one has overwritten the "
        f"other's files; keep them in separate virtual environments, or run `pip uninstall {THEIRS}` "
        f"and then `pip install --force-reinstall --no-deps {OURS}`"
    )


def stop_if_clashing() -> None:
    """``error: <clash_line()>`` on stderr and exit status 2 when the other ``ablate`` is
    installed; nothing otherwise."""
    line = clash_line()
    if line is not None:
        print(f"error: {line}", file=sys.stderr, flush=True)
        raise SystemExit(CLASH_EXIT)

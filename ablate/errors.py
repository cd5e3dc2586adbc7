"""User-facing errors and warnings: each is one line on stderr; an error ends the command with its
exit status (the README's table: 2 for bad input, 1 for a run that could not produce its result)."""

from __future__ import annotations

import sys


class AblateError(Exception):
    """Bad input from the user (study file, data file, CLI argument, a store or folder that cannot
    be used). Message is one line."""

    exit_code = 2


class StudyError(AblateError):
    """The study file is invalid: the message names the file, line and key path."""


class DataError(AblateError):
    """A data file is missing or malformed: the message names the file and line."""


class RunFailed(AblateError):
    """The input was good but the command could not produce its result: no trial finished, a
    worker process crashed. Message is one line."""

    exit_code = 1


def first_line(exc: BaseException) -> str:
    """An exception's message cut to its first line (its type's name where it has none)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def warn(message: str) -> None:
    """One ``warning: …`` line on stderr, written now: something the user should know of that
    does not stop the command (looked up at call time, so a live progress display shows it above
    its bars)."""
    print(f"warning: {message}", file=sys.stderr, flush=True)

"""User-facing errors and warnings: each is one line on stderr; an error ends the command with its
exit status (the README's table: 2 for bad input, 1 for a run that could not produce its result)."""

from __future__ import annotations

import json
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


# Whose errors mean a store (or the disk under it) failed: not the variant's fault nor a bug.
STORE_LIBRARIES = frozenset({"sqlalchemy", "sqlite3", "mlflow", "optuna"})


def store_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is the disk's or a store's failure (an ``OSError``, an error of a store's
    library): the run stops in one line, exit status 1, and the same command resumes it."""
    return isinstance(exc, OSError) or type(exc).__module__.split(".")[0] in STORE_LIBRARIES


# SQLite's result codes for a disk that failed (full, a file-size limit, an I/O error) — not for a
# file that is no database (SQLITE_NOTADB: bad input, the user's to fix)
DISK_RESULT_CODES = ("SQLITE_FULL", "SQLITE_IOERR")


def disk_failure(exc: BaseException) -> bool:
    """Whether ``exc`` was raised from the disk or a SQLite database's disk failing (full, a
    file-size limit, an I/O error), at the bottom of its causes."""
    cause = root_cause(exc)
    name = getattr(cause, "sqlite_errorname", "") or ""
    return isinstance(cause, OSError) or name.startswith(DISK_RESULT_CODES)


def root_cause(exc: BaseException) -> BaseException:
    """The error ``exc`` was raised from, at the bottom: a full disk's ``database or disk is full``
    rather than MLflow's wrapper or SQLAlchemy's first line (which blames an autoflush)."""
    seen = {id(exc)}
    while exc.__cause__ is not None and id(exc.__cause__) not in seen:
        exc = exc.__cause__
        seen.add(id(exc))
    return exc


def parse_json(text: str | bytes) -> object:
    """``json.loads(text)``; nesting too deep for Python's parser (``[[[…``) a ``JSONDecodeError``
    like any other malformed text, which each reader names in one line, not a RecursionError."""
    try:
        return json.loads(text)
    except RecursionError:
        raise json.JSONDecodeError("nested too deeply", text if isinstance(text, str) else "", 0) from None


def first_line(exc: BaseException) -> str:
    """An exception's message cut to its first line (its type's name where it has none)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def warn(message: str) -> None:
    """One ``warning: …`` line on stderr, written now: something the user should know of that
    does not stop the command (looked up at call time, so a live progress display shows it above
    its bars)."""
    print(f"warning: {message}", file=sys.stderr, flush=True)

"""The Optuna journal file, checked as it is opened.

A process killed in the middle of a write leaves the journal's last record cut off (no final
newline). Optuna's reader skips such a line, but its next write is appended to it, which
corrupts the file for good; so the cut-off record is removed before the journal is used (the
file as it was is kept beside it, and one warning line says so). A record that does not parse
in the middle of the file is not something a crash leaves: it stops the command with the file
and line, as does a journal that is not a readable file.

Writers append under Optuna's journal lock, so a tail without a newline seen while holding that
lock is a crash's leftover, never a write in progress.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from optuna.storages.journal import JournalFileSymlinkLock

from ablate.drive.optuna_private import JOURNAL_OPERATIONS, LOCK_FILE_SUFFIX
from ablate.errors import AblateError, parse_json, warn

# What a record's op_code may be (tests/test_resume.py replays a real journal through this check).
KNOWN_OPERATIONS = JOURNAL_OPERATIONS


def check_journal(path: Path) -> None:
    """Raise :class:`AblateError` (file:line) on a journal that cannot be read back; remove a
    cut-off last record (keeping a copy of the file). A missing journal is fine (a new study)."""
    _remove_dangling_lock(path)
    if not os.path.lexists(path):
        return
    if not path.is_file():
        raise AblateError(f"{path}: the Optuna journal is not a file")
    try:
        complete = _complete_records(path)
    except OSError as exc:
        raise AblateError(f"{path}: cannot read the Optuna journal: {exc.strerror or exc}") from None
    if complete == _size(path):
        return
    try:
        size, complete, backup = _cut_tail(path)
    except OSError as exc:  # the lock or the copy cannot be written (a read-only folder)
        raise AblateError(
            f"{path}: its last record was cut off by a crash mid-write and cannot be removed: "
            f"{exc.strerror or exc}"
        ) from None
    if backup is None:
        return
    warn(
        f"{path}: its last record was cut off by a crash mid-write; removed it ({size - complete} bytes), "
        f"the file as it was is kept as {backup.name}"
    )


def _remove_dangling_lock(path: Path) -> None:
    """Remove the journal's lock where it is a symbolic link to a journal that is gone: Optuna's
    lock (a link to the journal) would wait on it forever, at full speed — its stale-lock check
    reads the link's target, which fails, and retries at once. No writer can be holding it: a
    writer's lock points at the journal it appends to."""
    lock = Path(f"{path}{LOCK_FILE_SUFFIX}")
    if lock.is_symlink() and not lock.exists():
        try:
            lock.unlink()
        except FileNotFoundError:  # another process removed it first
            return
        warn(f"{lock}: a stale lock a crash left, naming a journal that is gone; removed it")


def _cut_tail(path: Path) -> tuple[int, int, Path | None]:
    """Under the journal's lock: the file's size, its length up to the last whole record, and
    the copy kept of it before the cut-off record was removed (None: the tail was a write in
    progress, finished by now)."""
    lock = JournalFileSymlinkLock(str(path))
    lock.acquire()
    try:
        size = _size(path)
        if size == 0 or _last_byte(path) == b"\n":
            return size, size, None
        complete = _complete_records(path)
        backup = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
        shutil.copy2(path, backup)
        os.truncate(path, complete)
        return size, complete, backup
    finally:
        lock.release()


def _complete_records(path: Path) -> int:
    """The length of the journal up to its last newline, having parsed every record before it."""
    offset = 0
    with open(path, "rb") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.endswith(b"\n"):
                break  # the tail: cut off, or being written
            try:
                record = parse_json(line)
                op = record.get("op_code") if isinstance(record, dict) else None
                if op not in KNOWN_OPERATIONS:  # Optuna's replay would raise on it, every run
                    raise ValueError(f"no known op_code: {op!r}")
            except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, the operation
                raise AblateError(
                    f"{path}:{number}: the Optuna journal has a corrupt record ({exc}); the store cannot "
                    f"be read: restore the file from a backup, or move it away to start the study afresh"
                ) from None
            offset += len(line)
    return offset


def _size(path: Path) -> int:
    return path.stat().st_size


def _last_byte(path: Path) -> bytes:
    with open(path, "rb") as handle:
        handle.seek(-1, os.SEEK_END)
        return handle.read(1)

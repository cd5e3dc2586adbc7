"""A new SQLite tracking store as a copy of an empty one MLflow migrated before.

MLflow makes a SQLite store by running its schema migrations: 1.65 s for every new study, every
test that runs one (measured at load 4 on 2 cores), where opening a migrated copy takes 0.03 s.
The first store MLflow makes is kept, before anything is written into it, in this user's own
cache folder (``stores-<uid>``, under the rules of the compiled kernels' folder: owned by this
user, writable by no one else), one per MLflow version; each later new store starts as a copy.

Nothing read back may lie: the kept store is checked before every copy — its schema (every table,
index and trigger as SQLite stores its definition) the same as the dump written beside it when
MLflow made it (a trigger planted there would run on a study's writes), MLflow's one Default
experiment and default workspace, no run, no other row in any table — so a file planted with runs
or triggers in it is never copied into a study; anything amiss, and MLflow makes the store as before.

:func:`first_use` is where a tracker opens a SQLite store: one process at a time, a new one seeded
from the copy, and whatever MLflow kept in this process of a deleted file of that name forgotten.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.metadata import version
from pathlib import Path

from ablate.cache import cache_dir
from ablate.kernels.build import Unavailable, private_folder

# the rows an empty store holds: MLflow's schema version, its Default experiment, the default workspace
_SEEDED_ROWS = {"alembic_version": 1, "experiments": 1, "workspaces": 1}


def _kept() -> Path:
    return cache_dir() / f"stores-{os.getuid()}" / f"mlflow-{version('mlflow')}-empty.db"


def _schema(connection: sqlite3.Connection) -> str:
    """The store's schema as SQLite keeps it, one definition a line in a fixed order."""
    rows = connection.execute("SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY type, name")
    return "".join(f"{kind}\t{name}\t{table}\t{sql}\n" for kind, name, table, sql in rows)


def _schema_dump(kept: Path) -> Path:
    return kept.with_suffix(".schema")


def _is_empty(db: Path, schema: str | None = None) -> bool:
    """Whether ``db`` is a store holding nothing but what MLflow writes into a new one (with
    ``schema``: that schema exactly)."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as connection:
        if schema is not None and _schema(connection) != schema:  # a trigger, a view, a column added
            return False
        tables = [row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        if "experiments" not in tables or "runs" not in tables:
            return False
        for table in tables:
            count = connection.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0]
            if count > _SEEDED_ROWS.get(table, 0):
                return False
        return connection.execute("SELECT experiment_id FROM experiments").fetchall() in ([], [(0,)])


def seed(db: Path) -> bool:
    """Start the store ``db`` (missing or empty) as a copy of the kept empty store, where a sound
    one is kept; False where MLflow is to make it. The Default experiment's artifact folder is set
    to what MLflow gives it here (``./mlruns/0`` of the working folder)."""
    if db.exists() and db.stat().st_size:
        return False
    kept = _kept()
    try:
        private_folder(kept.parent)
        dump = _schema_dump(kept)
        if not kept.is_file() or not dump.is_file() or not _is_empty(kept, dump.read_text(encoding="utf-8")):
            return False
        partial = db.with_name(db.name + ".new")
        shutil.copyfile(kept, partial)
        from mlflow.store.tracking import DEFAULT_LOCAL_FILE_AND_ARTIFACT_PATH
        from mlflow.utils.uri import append_to_uri_path, resolve_uri_if_local

        default = append_to_uri_path(resolve_uri_if_local(DEFAULT_LOCAL_FILE_AND_ARTIFACT_PATH), "0")
        with sqlite3.connect(partial) as connection:
            connection.execute(
                "UPDATE experiments SET artifact_location = ? WHERE experiment_id = 0", (default,)
            )
        connection.close()
        os.replace(partial, db)
        return True
    except (Unavailable, OSError, sqlite3.Error):
        return False


def keep(db: Path) -> None:
    """Keep a copy of the store MLflow has just made at ``db``, before anything is written into it,
    where no sound copy is kept yet (a consistent snapshot through SQLite's backup)."""
    kept = _kept()
    try:
        private_folder(kept.parent)
        dump = _schema_dump(kept)
        sound = kept.is_file() and dump.is_file() and _is_empty(kept, dump.read_text(encoding="utf-8"))
        if sound or not _is_empty(db):
            return
        partial = kept.with_name(f"{kept.name}.{os.getpid()}")
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as source, sqlite3.connect(partial) as target:
            source.backup(target)
            schema = _schema(source)
        target.close()
        source.close()
        partial_dump = dump.with_name(f"{dump.name}.{os.getpid()}")
        partial_dump.write_text(schema, encoding="utf-8")
        os.replace(partial_dump, dump)  # the dump first: a store kept without one is never copied
        os.replace(partial, kept)
    except (Unavailable, OSError, sqlite3.Error):
        return


@contextmanager
def first_use(tracking_uri: str) -> Iterator[None]:
    """Workers opening one SQLite store at once would each run MLflow's schema migrations and
    collide ("duplicate column"): a lock beside it lets one go first. A new one is a copy."""
    if not tracking_uri.startswith("sqlite:///"):
        yield
        return
    db = Path(tracking_uri.removeprefix("sqlite:///"))
    db.parent.mkdir(parents=True, exist_ok=True)
    with open(db.with_name(db.name + ".lock"), "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        fresh = not (db.exists() and db.stat().st_size)
        if fresh:
            _forget_stores(tracking_uri)
        made_here = fresh and not seed(db)
        try:
            yield
        except BaseException:
            # Half-migrated (a full disk, a file-size limit), it holds nothing: the next run remakes it.
            if made_here:
                for leftover in (db, db.with_name(db.name + "-journal")):
                    leftover.unlink(missing_ok=True)
            raise
        if made_here:  # MLflow migrated a new store: kept, empty, for the next one (1.6 s each)
            keep(db)


def _forget_stores(tracking_uri: str) -> None:
    """Drop what MLflow keeps of a SQLite store in this process, before its file is made: kept
    from a file since deleted (``ablate.run`` again after its output folder was removed, in a
    notebook), the store and its engine write to the deleted file ("attempt to write a readonly
    database"). The stores per URI are one cache without per-URI eviction: those of other URIs
    are made again at their next use. MLflow's private names: where a version lacks them, nothing
    is dropped (the case above fails as before, every other use is untouched)."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
    from mlflow.tracking._tracking_service import utils

    engines = getattr(SqlAlchemyStore, "_engine_map", None)
    lock = getattr(SqlAlchemyStore, "_engine_map_lock", None)
    stores = getattr(getattr(utils, "_tracking_store_registry", None), "_get_store_with_resolved_uri", None)
    if engines is None or lock is None or not hasattr(stores, "cache_clear"):
        return
    with lock:
        engine = engines.pop(tracking_uri, None)
    if engine is not None:
        engine.dispose()
        stores.cache_clear()

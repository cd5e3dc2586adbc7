"""Where a study's queues and results live: an Optuna storage and an MLflow tracking URI.

One interface, two implementations, as Optuna puts ``BaseStorage`` in front of its backends:

* :class:`LocalStores` — a journal file (or a legacy SQLite file) on one host: enqueue and pop
  are serialised by a file lock, and a worker is alive while it holds its lock file in
  ``workers/``;
* :class:`SharedStores` — a database server many hosts use (PostgreSQL, …): no local locks
  (two hosts may enqueue the same key; the ledger drops the duplicate), and a trial's worker is
  alive while it beats Optuna's heartbeat (``RetryHeartbeatStaleTrialCallback`` re-queues it).

Everything above this module is storage-agnostic.
"""

from __future__ import annotations

import fcntl
import os
import socket
import threading
import time
import uuid
import warnings
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import optuna
from optuna.storages import JournalStorage, RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.storages.journal import JournalFileBackend
from optuna.trial import FrozenTrial, TrialState

from ablate.drive.journal import check_journal
from ablate.drive.proxy import (
    PROXY_SCHEME,
    connect_proxy,
    mark_alive,
    proxy_problem,
    reap_due,
    unmarked_trials,
)
from ablate.errors import AblateError, first_line
from ablate.study.folders import folder_problem
from ablate.tracking.store import default_uri, tracking_problem

if TYPE_CHECKING:  # pragma: no cover
    from ablate.drive.queue import Queue
    from ablate.study.load import Study

optuna.logging.set_verbosity(optuna.logging.WARNING)

HEARTBEAT_S, GRACE_S = 20, 120  # shared databases: beat every 20 s, stale after 2 min
LOCAL_REAP_S = 2.0  # one host: a dead worker's lock file is looked for this often while others train
# A folder where each process appends its queue-lock waits and holds and its heartbeats' durations
# (benchmarks/store_scale.py); unset, nothing is timed or written.
TIMINGS_ENV = "ABLATE_QUEUE_TIMINGS"
_timings: list = []  # this process's open timings file, once opened


def _timing(kind: str, *seconds: float) -> None:
    """Append one timed event (``lock``: wait, hold; ``beat``: duration) where TIMINGS_ENV says."""
    folder = os.environ.get(TIMINGS_ENV)
    if not folder:
        return
    if not _timings or _timings[0][0] != os.getpid():  # a forked worker opens its own
        _timings[:] = [(os.getpid(), open(Path(folder) / f"{os.getpid()}.txt", "a", buffering=1))]
    _timings[0][1].write(f"{kind} {time.time():.3f} {' '.join(f'{s:.6f}' for s in seconds)}\n")


@contextmanager
def _held(asked: float) -> Iterator[None]:
    """Times the queue lock taken after ``asked`` (perf_counter) until it is let go."""
    got = time.perf_counter()
    try:
        yield
    finally:
        _timing("lock", got - asked, time.perf_counter() - got)


@dataclass
class Stores(ABC):
    output_dir: Path
    optuna_url: str  # a journal file path, sqlite:///…, or postgresql://…
    tracking_uri: str
    heartbeat_s: int = HEARTBEAT_S
    grace_s: int = GRACE_S
    # A database server other hosts may use: liveness by heartbeat, not local locks.
    shared: ClassVar[bool]

    @staticmethod
    def for_study(
        study: Study,
        output: str | Path | None = None,
        tracking_uri: str | None = None,
        storage: str | None = None,
    ) -> Stores:
        """The study's stores: in its output folder unless ``storage`` / ``tracking_uri`` say
        otherwise. A value that names no store (``--storage notaurl``) is refused in one line."""
        if storage is not None and (problem := storage_problem(storage)):
            raise AblateError(f"--storage {_redact(storage)}: {problem}")
        if tracking_uri is not None and (problem := tracking_problem(tracking_uri)):
            raise AblateError(f"--tracking-uri {tracking_uri}: {problem}")
        try:
            out = study.output_dir(output)
        except (ValueError, RuntimeError, OSError) as exc:  # a NUL byte; a symbolic link loop
            named = f"--output {output}" if output is not None else f"{study.path}: output"
            raise AblateError(f"{named}: not a usable folder: {exc}") from None
        legacy = out / "optuna.db"  # studies started before the journal default keep their store
        local = (
            f"sqlite:///{legacy}"
            if _is_file(legacy) and not os.path.lexists(out / "optuna.journal")
            else str(out / "optuna.journal")
        )
        url = local if storage is None else storage if "://" in storage else str(Path(storage).resolve())
        served = "://" in url and not url.startswith("sqlite")
        kind = (ProxyStores if url.startswith(PROXY_SCHEME) else SharedStores) if served else LocalStores
        return kind(out, url, tracking_uri or default_uri(out))

    @abstractmethod
    def started(self) -> bool:
        """Whether the Optuna store exists (a study that never ran has none)."""

    @abstractmethod
    def storage(self) -> optuna.storages.BaseStorage:
        """A new handle on the Optuna store (creating it on first use)."""

    @abstractmethod
    def queue_lock(self) -> AbstractContextManager[None]:
        """Held while a worker enqueues and pops."""

    @abstractmethod
    def worker(self) -> AbstractContextManager[str]:
        """This process's worker id, marked alive while the context lasts."""

    @abstractmethod
    def is_live(self, trial: FrozenTrial) -> bool:
        """Whether a RUNNING trial's worker is still at it."""

    @abstractmethod
    def reap(self, queue: Queue) -> int:
        """Fail the queue's trials whose worker is gone (the next sync enqueues them again, or
        Optuna's heartbeat callback has); how many were."""

    @property
    @abstractmethod
    def reap_s(self) -> float:
        """How often a busy worker looks for trials whose worker is gone (an idle one at every look)."""

    @abstractmethod
    def heartbeat(self, queue: Queue, trial: optuna.Trial) -> AbstractContextManager[None]:
        """Keeps ``trial`` marked alive while it trains."""


def _new_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class LocalStores(Stores):
    """Stores in the output folder on one host."""

    shared = False

    def started(self) -> bool:
        return _is_file(Path(self.optuna_url.removeprefix("sqlite:///")))

    def storage(self) -> optuna.storages.BaseStorage:
        url = self.optuna_url
        path = Path(url.removeprefix("sqlite:///"))
        self.output_dir.mkdir(parents=True, exist_ok=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        if url.startswith("sqlite:///"):
            try:
                return RDBStorage(url, engine_kwargs={"connect_args": {"timeout": 60}})
            except Exception as exc:  # noqa: BLE001 - sqlalchemy's errors: not a database, locked, …
                raise AblateError(f"{path}: cannot open the Optuna store: {first_line(exc)}") from None
        check_journal(path)  # a record cut off by a crash is removed before anything is appended
        return JournalStorage(JournalFileBackend(url))

    @contextmanager
    def queue_lock(self) -> Iterator[None]:
        self.output_dir.mkdir(parents=True, exist_ok=True)
        with open(self.output_dir / ".queue.lock", "w") as handle:
            asked = time.perf_counter()
            fcntl.flock(handle, fcntl.LOCK_EX)
            with _held(asked):
                yield

    @contextmanager
    def worker(self) -> Iterator[str]:
        """Holds ``workers/<id>.lock`` while alive."""
        worker_id = _new_worker_id()
        folder = self.output_dir / "workers"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{worker_id}.lock"
        with open(path, "w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield worker_id
            finally:
                path.unlink(missing_ok=True)

    def worker_alive(self, worker_id: str | None) -> bool:
        if not worker_id:
            return False
        path = self.output_dir / "workers" / f"{worker_id}.lock"
        try:
            with open(path, "r+") as handle:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except FileNotFoundError:
            return False
        except BlockingIOError:
            return True
        path.unlink(missing_ok=True)  # a dead worker's leftover
        return False

    def is_live(self, trial: FrozenTrial) -> bool:
        return self.worker_alive(trial.user_attrs.get("worker"))

    def reap(self, queue: Queue) -> int:
        gone = [t.number for t in queue.trials(TrialState.RUNNING) if not self.is_live(t)]
        for number in gone:
            queue.interrupt(number)
        return len(gone)

    @property
    def reap_s(self) -> float:
        return LOCAL_REAP_S

    @contextmanager
    def heartbeat(self, queue: Queue, trial: optuna.Trial) -> Iterator[None]:
        yield  # the worker's lock file says it is alive


class _Retry(RetryHeartbeatStaleTrialCallback):
    """Optuna's re-queue of a trial whose heartbeat stopped, counted: a reap that re-queued one
    has the worker read the queue whole again (its checkpointed trials go first)."""

    retried = 0

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        super().__call__(study, trial)
        _Retry.retried += 1


class SharedStores(Stores):
    """Stores on a database server shared by many hosts."""

    shared = True

    def started(self) -> bool:
        return True

    def storage(self) -> optuna.storages.BaseStorage:
        for attempt in range(5):
            try:
                with warnings.catch_warnings():  # heartbeats are "experimental" since Optuna 2.x
                    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                    return RDBStorage(
                        self.optuna_url,
                        heartbeat_interval=self.heartbeat_s,
                        grace_period=self.grace_s,
                        heartbeat_stale_trial_callback=_Retry(),
                        # Two connections a worker, kept: Optuna's calls sometimes hold two at
                        # once (one pooled and one opened and closed each time cost a connection
                        # a trial); the heartbeat thread waits for one, never opens a third.
                        engine_kwargs={"pool_pre_ping": True, "pool_size": 2, "max_overflow": 0},
                    )
            except Exception as exc:  # noqa: BLE001 - driver errors vary (psycopg, sqlalchemy)
                text = str(exc)
                # Workers starting together may race to create Optuna's tables: try again.
                if attempt < 4 and ("already exists" in text or "duplicate key" in text):
                    time.sleep(0.5 + attempt)
                    continue
                where = _redact(self.optuna_url)
                raise AblateError(f"cannot reach the Optuna storage {where}: {first_line(exc)}") from None

    @contextmanager
    def queue_lock(self) -> Iterator[None]:
        with _held(time.perf_counter()):
            yield  # hosts do not share a file system; duplicates are dropped when popped

    @contextmanager
    def worker(self) -> Iterator[str]:
        yield _new_worker_id()

    def is_live(self, trial: FrozenTrial) -> bool:
        return True  # until the heartbeat says otherwise

    def reap(self, queue: Queue) -> int:
        retried = _Retry.retried
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(queue.study)  # by heartbeat; Optuna's callback re-enqueues them
        return _Retry.retried - retried

    @property
    def reap_s(self) -> float:
        return self.heartbeat_s

    @contextmanager
    def heartbeat(self, queue: Queue, trial: optuna.Trial) -> Iterator[None]:
        """Beats every ``heartbeat_s`` on a thread (Optuna beats only inside ``optimize``)."""
        storage, trial_id = queue.storage, queue.trial_id(trial.number)
        stop = threading.Event()

        def beat() -> None:
            while True:
                began = time.perf_counter()
                try:
                    self._beat(storage, trial_id)
                except Exception:  # noqa: BLE001 - a missed beat is retried; the grace period covers it
                    pass
                _timing("beat", time.perf_counter() - began)
                if stop.wait(self.heartbeat_s):
                    return

        threading.Thread(target=beat, daemon=True).start()
        try:
            yield
        finally:
            stop.set()

    def _beat(self, storage: optuna.storages.BaseStorage, trial_id: int) -> None:
        storage.record_heartbeat(trial_id)


class ProxyStores(SharedStores):
    """Stores behind Optuna's gRPC storage proxy (:mod:`.proxy`), which holds the database
    connections for every worker; a trial's worker is alive while it renews its mark."""

    def storage(self) -> optuna.storages.BaseStorage:
        try:
            return connect_proxy(self.optuna_url)
        except Exception as exc:  # noqa: BLE001 - grpc's and Optuna's errors vary
            raise AblateError(
                f"cannot reach the Optuna storage proxy {self.optuna_url}: "
                f"{first_line(exc) or type(exc).__name__}; "
                f"start it on that host with `ablate proxy --storage postgresql://…`"
            ) from None

    def reap(self, queue: Queue) -> int:
        if not reap_due(queue.storage, queue.study_id, self.reap_s):
            return 0  # another worker looked lately
        gone = unmarked_trials(queue.storage, queue.study_id, self.grace_s)
        for number in gone:
            queue.interrupt(number)  # the next sync queues it again
        return len(gone)

    @property
    def reap_s(self) -> float:
        return self.grace_s / 2  # one worker of the study looks this often (reap_due): ≤ 1.5 × grace

    def _beat(self, storage: optuna.storages.BaseStorage, trial_id: int) -> None:
        mark_alive(storage, trial_id)


def storage_problem(storage: str) -> str | None:
    """Why ``storage`` names no Optuna store, or None: a database URL whose kind SQLAlchemy knows
    (``postgresql://…``, ``sqlite:///path.db``), or a journal file (a path ending in ``.journal``
    or ``.log``); anything else is most likely a mistyped URL, not a file to create."""
    if storage.startswith(PROXY_SCHEME):
        return proxy_problem(storage)
    if "://" not in storage:
        if Path(storage).suffix in JOURNAL_SUFFIXES:
            return folder_problem(Path(storage).parent)
        return (
            "not a storage URL or journal file; give a database URL (postgresql://user:pw@host/db, "
            "sqlite:///path/optuna.db) or a journal file path ending in .journal"
        )
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    try:
        url = make_url(storage)
        url.get_dialect()  # the dialect only: the database driver is imported when connecting
    except NoSuchModuleError:  # (an ArgumentError too)
        return f"unknown database kind '{storage.split('://')[0]}' (e.g. postgresql://user:pw@host/db)"
    except ArgumentError:
        return "not a database URL (e.g. postgresql://user:pw@host/db or sqlite:///path/optuna.db)"
    if url.get_backend_name() != "sqlite":
        return None
    if not url.database or url.database == ":memory:":
        return "an in-memory database is lost when the command ends; give sqlite:///path/optuna.db"
    return folder_problem(Path(url.database).parent)


JOURNAL_SUFFIXES = (".journal", ".log")


def _is_file(path: Path) -> bool:
    """``path.is_file()``, False where the path cannot even be looked at (a name over the file
    system's limit): the folder checks name that problem."""
    try:
        return path.is_file()
    except OSError:
        return False


def _redact(url: str) -> str:
    """Hide a password in a database URL."""
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        cred, host = rest.rsplit("@", 1)
        return f"{scheme}://{cred.split(':')[0]}:***@{host}" if ":" in cred else url
    return url

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

from ..errors import AblateError
from ..track import default_uri

if TYPE_CHECKING:  # pragma: no cover
    from ..study import Study
    from .ledger import Queue

optuna.logging.set_verbosity(optuna.logging.WARNING)

HEARTBEAT_S, GRACE_S = 20, 120  # shared databases: beat every 20 s, stale after 2 min


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
        out = study.output_dir(output)
        legacy = out / "optuna.db"  # studies started before the journal default keep their store
        local = (
            f"sqlite:///{legacy}"
            if legacy.is_file() and not (out / "optuna.journal").exists()
            else str(out / "optuna.journal")
        )
        url = storage or local
        served = "://" in url and not url.startswith("sqlite")
        return (SharedStores if served else LocalStores)(out, url, tracking_uri or default_uri(out))

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
    def reap(self, queue: Queue) -> None:
        """Fail the queue's trials whose worker is gone; the next sync enqueues them again."""

    @abstractmethod
    def heartbeat(self, queue: Queue, trial: optuna.Trial) -> AbstractContextManager[None]:
        """Keeps ``trial`` marked alive while it trains."""


def _new_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class LocalStores(Stores):
    """Stores in the output folder on one host."""

    shared = False

    def started(self) -> bool:
        return Path(self.optuna_url.removeprefix("sqlite:///")).is_file()

    def storage(self) -> optuna.storages.BaseStorage:
        url = self.optuna_url
        if url.startswith("sqlite:///"):
            return RDBStorage(url, engine_kwargs={"connect_args": {"timeout": 60}})
        self.output_dir.mkdir(parents=True, exist_ok=True)
        return JournalStorage(JournalFileBackend(url))

    @contextmanager
    def queue_lock(self) -> Iterator[None]:
        self.output_dir.mkdir(parents=True, exist_ok=True)
        with open(self.output_dir / ".queue.lock", "w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
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

    def reap(self, queue: Queue) -> None:
        for t in queue.trials(TrialState.RUNNING):
            if not self.is_live(t):
                queue.interrupt(t.number)

    @contextmanager
    def heartbeat(self, queue: Queue, trial: optuna.Trial) -> Iterator[None]:
        yield  # the worker's lock file says it is alive


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
                        heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(),
                        engine_kwargs={"pool_pre_ping": True},
                    )
            except Exception as exc:  # noqa: BLE001 - driver errors vary (psycopg, sqlalchemy)
                text = str(exc)
                # Workers starting together may race to create Optuna's tables: try again.
                if attempt < 4 and ("already exists" in text or "duplicate key" in text):
                    time.sleep(0.5 + attempt)
                    continue
                first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
                where = _redact(self.optuna_url)
                raise AblateError(f"cannot reach the Optuna storage {where}: {first}") from None

    @contextmanager
    def queue_lock(self) -> Iterator[None]:
        yield  # hosts do not share a file system; duplicates are dropped when popped

    @contextmanager
    def worker(self) -> Iterator[str]:
        yield _new_worker_id()

    def is_live(self, trial: FrozenTrial) -> bool:
        return True  # until the heartbeat says otherwise

    def reap(self, queue: Queue) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(queue.study)  # by heartbeat; Optuna's callback re-enqueues them

    @contextmanager
    def heartbeat(self, queue: Queue, trial: optuna.Trial) -> Iterator[None]:
        """Beats every ``heartbeat_s`` on a thread (Optuna beats only inside ``optimize``)."""
        storage, trial_id = queue.storage, queue.trial_id(trial.number)
        stop = threading.Event()

        def beat() -> None:
            while True:
                try:
                    storage.record_heartbeat(trial_id)
                except Exception:  # noqa: BLE001 - a missed beat is retried; the grace period covers it
                    pass
                if stop.wait(self.heartbeat_s):
                    return

        threading.Thread(target=beat, daemon=True).start()
        try:
            yield
        finally:
            stop.set()


def _redact(url: str) -> str:
    """Hide a password in a database URL."""
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        cred, host = rest.rsplit("@", 1)
        return f"{scheme}://{cred.split(':')[0]}:***@{host}" if ":" in cred else url
    return url

"""Optuna's gRPC storage proxy as a study's store: ``--storage grpc://host:port``, with the proxy
(``ablate proxy``) started once in front of the database, so that any number of workers hold no
database connection at all — the front Optuna recommends for thousands of nodes.

The proxy passes on no heartbeat, so a worker marks its trial alive itself: a system attribute
(:data:`BEAT`) rewritten every heartbeat; a RUNNING trial whose mark is older than the grace period
is its dead worker's, failed as interrupted and queued again (:func:`unmarked_trials`). Finding
those trials reads every unfinished trial of the study through the proxy (its API has no read by
state), so one worker of the study looks at a time (:func:`reap_due`), not each worker: with 16
workers and 2,100 trials queued each worker's own look doubled the proxy's CPU a trial.
"""

from __future__ import annotations

import time
import warnings
from urllib.parse import urlsplit

import optuna
from optuna.trial import TrialState

PROXY_SCHEME = "grpc://"
BEAT = "ablate.beat"  # a trial's last sign of life through a proxy (seconds since the epoch)
REAPED = "ablate.reaped"  # a study's last look for dead workers' trials (seconds since the epoch)
DEFAULT_PORT = 13000  # Optuna's own default
READY_S = 10.0  # how long a worker waits for the proxy to answer: one started beside it is starting


def proxy_address(url: str) -> tuple[str, int]:
    """``grpc://host:port`` as (host, port); a missing port is Optuna's default."""
    parts = urlsplit(url)
    return parts.hostname or "localhost", parts.port or DEFAULT_PORT


def proxy_problem(url: str) -> str | None:
    """Why ``url`` names no proxy, or None."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError as exc:
        return f"not a proxy address ({exc}); give grpc://host:port"
    if not parts.hostname or parts.path not in ("", "/"):
        return "not a proxy address; give grpc://host:port (the host `ablate proxy` runs on)"
    try:
        import grpc  # noqa: F401 - Optuna's proxy client needs it
    except ImportError:
        return "the proxy needs grpcio: pip install 'ablate-studies[grpc]'"
    return None


def connect_proxy(url: str) -> optuna.storages.BaseStorage:
    """The proxy at ``url``, once it answers within :data:`READY_S` (raises ``optuna``'s or grpc's
    error when it does not)."""
    host, port = proxy_address(url)
    with warnings.catch_warnings():  # "experimental" since Optuna 4.2: said once, in the README
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        storage = optuna.storages.GrpcStorageProxy(host=host, port=port)
    storage.wait_server_ready(timeout=READY_S)
    return storage


def mark_alive(storage: optuna.storages.BaseStorage, trial_id: int) -> None:
    storage.set_trial_system_attr(trial_id, BEAT, time.time())


def reap_due(storage: optuna.storages.BaseStorage, study_id: int, every_s: float) -> bool:
    """Whether this worker should look for the study's dead workers' trials now: no worker has
    looked for ``every_s`` seconds (by the study's :data:`REAPED` mark, a cheap read of the study's
    attributes; a mark in the future, from a host whose clock is ahead, counts as none). A due look
    is marked before it is made. Two workers that read the mark at once both look: a trial failed
    twice is failed once (:meth:`~ablate.drive.queue.Queue.interrupt`)."""
    now = time.time()
    last = storage.get_study_system_attrs(study_id).get(REAPED)
    if last is not None and 0 <= now - float(last) < every_s:
        return False
    storage.set_study_system_attr(study_id, REAPED, now)
    return True


def unmarked_trials(storage: optuna.storages.BaseStorage, study_id: int, grace_s: float) -> list[int]:
    """The numbers of the study's RUNNING trials with no sign of life for ``grace_s`` (the mark,
    or the start of a trial that has none yet; clocks of the workers' hosts compared, as a
    cluster's NTP keeps them within far less than a grace period)."""
    now = time.time()
    gone = []
    for trial in storage.get_all_trials(study_id, deepcopy=False, states=(TrialState.RUNNING,)):
        started = trial.datetime_start.timestamp() if trial.datetime_start else now
        if now - float(trial.system_attrs.get(BEAT, started)) > grace_s:
            gone.append(trial.number)
    return gone


def serve_proxy(storage_url: str, host: str, port: int) -> None:
    """Run Optuna's proxy in front of ``storage_url`` until stopped (its cached storage, as
    Optuna's documentation advises for a proxy)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.run_grpc_proxy_server(optuna.storages.get_storage(storage_url), host=host, port=port)

"""The study driver: Optuna queues per ablation study, one trial per (variant, seed).

Every planned (variant, seed) is enqueued once as a fixed-parameter Optuna trial; workers pop
them with ``ask`` and report with ``tell``. With a ``search:`` section each variant first gets
its own Optuna study (``<study>.search.<variant>``) with the same budget of search slots, each
slot enqueued once; when a variant's search is over, its best parameters are trained over the
study's seeds in the main study, which the report compares.

Exactly once, across any number of worker processes:

* every enqueue happens under a queue lock (a file lock on one host); on shared databases,
  where two hosts may enqueue the same key, the higher-numbered duplicate steps aside when asked;
* a trial RUNNING for a worker that is gone is failed as "interrupted" and enqueued again: on
  one host a worker is alive while it holds its lock file in ``workers/``; on a database shared
  by many machines Optuna's heartbeat finds it (``RetryHeartbeatStaleTrialCallback``);
* MLflow runs of a (variant, seed) left RUNNING, or FINISHED by a worker killed before it told
  Optuna, are closed as KILLED when the key is trained again, so the report sees one per key.
"""

from __future__ import annotations

import fcntl
import hashlib
import itertools
import json
import math
import os
import random
import re
import socket
import threading
import time
import uuid
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import optuna
import torch
from optuna.storages import JournalStorage, RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

from . import match as matching
from . import stopping
from .errors import AblateError, StudyError
from .faults import fault_point
from .search import Categorical, FloatRange, IntRange, grid_points
from .study import Study, Variant
from .track import Tracker, default_uri
from .train import Checkpoint, TrialFailed, TrialResult, checkpoint_interval, resolve_device, train_trial

optuna.logging.set_verbosity(optuna.logging.WARNING)

INTERRUPTED = "interrupted"
# Trials failed for bookkeeping, not because training failed: never shown as failures.
BOOKKEEPING = {INTERRUPTED, "duplicate", "nothing queued", "no longer in the study file"}
HEARTBEAT_S, GRACE_S = 20, 120  # shared databases: beat every 20 s, stale after 2 min
POLL_S = 1.0  # idle workers look for new work this often while others still run trials


class Reporter:
    """Progress display hooks; this base is silent (tests), the CLI's draws progress bars."""

    def study(self, total: int, done: int) -> None: ...
    def trial(self, variant: str, seed: int, epochs: int) -> None: ...
    def epoch(self, epoch: int, logged: dict[str, float]) -> None: ...
    def step(self) -> None: ...
    def finished(self, variant: str, seed: int, result: TrialResult) -> None: ...
    def failed(self, variant: str, seed: int, reason: str) -> None: ...


# ---------------------------------------------------------------------------------- stores


@dataclass
class Stores:
    output_dir: Path
    optuna_url: str  # a journal file path, sqlite:///…, or postgresql://…
    tracking_uri: str
    heartbeat_s: int = HEARTBEAT_S
    grace_s: int = GRACE_S

    @classmethod
    def for_study(cls, study: Study, output: str | Path | None = None, tracking_uri: str | None = None,
                  storage: str | None = None) -> "Stores":
        out = study.output_dir(output)
        legacy = out / "optuna.db"  # studies started before the journal default keep their store
        local = f"sqlite:///{legacy}" if legacy.is_file() and not (out / "optuna.journal").exists() \
            else str(out / "optuna.journal")
        return cls(out, storage or local, tracking_uri or default_uri(out))

    @property
    def shared(self) -> bool:
        """A database server other hosts may use: liveness by heartbeat, not local locks."""
        return "://" in self.optuna_url and not self.optuna_url.startswith("sqlite")

    def started(self) -> bool:
        if self.shared:
            return True
        url = self.optuna_url
        return Path(url.removeprefix("sqlite:///")).is_file()

    def storage(self) -> optuna.storages.BaseStorage:
        url = self.optuna_url
        if self.shared:
            for attempt in range(5):
                try:
                    with warnings.catch_warnings():  # heartbeats are "experimental" since Optuna 2.x
                        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                        return RDBStorage(url, heartbeat_interval=self.heartbeat_s, grace_period=self.grace_s,
                                          heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(),
                                          engine_kwargs={"pool_pre_ping": True})
                except Exception as exc:  # noqa: BLE001 - driver errors vary (psycopg, sqlalchemy)
                    text = str(exc)
                    # Workers starting together may race to create Optuna's tables: try again.
                    if attempt < 4 and ("already exists" in text or "duplicate key" in text):
                        time.sleep(0.5 + attempt)
                        continue
                    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
                    raise AblateError(f"cannot reach the Optuna storage {_redact(url)}: {first}") from None
        if url.startswith("sqlite:///"):
            return RDBStorage(url, engine_kwargs={"connect_args": {"timeout": 60}})
        self.output_dir.mkdir(parents=True, exist_ok=True)
        return JournalStorage(JournalFileBackend(url))

    @contextmanager
    def queue_lock(self) -> Iterator[None]:
        """Serialises enqueue and pop on one host (a no-op for shared databases)."""
        if self.shared:
            yield
            return
        self.output_dir.mkdir(parents=True, exist_ok=True)
        with open(self.output_dir / ".queue.lock", "w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            yield

    @contextmanager
    def worker(self) -> Iterator[str]:
        """This process's worker id; on one host it holds ``workers/<id>.lock`` while alive."""
        worker_id = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        if self.shared:
            yield worker_id
            return
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


def _redact(url: str) -> str:
    """Hide a password in a database URL."""
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        cred, host = rest.rsplit("@", 1)
        return f"{scheme}://{cred.split(':')[0]}:***@{host}" if ":" in cred else url
    return url


@dataclass
class RunSummary:
    finished: int  # trials finished by this invocation
    skipped: int  # already complete before it started
    failed: list[tuple[str, int, str]]
    searched: int = 0  # search trials run by this invocation


def direction(study: Study) -> str:
    return "maximize" if study.task.metric_higher_is_better(study.metrics[0]) else "minimize"


def open_optuna(study: Study, stores: Stores, storage: Any = None) -> optuna.Study:
    return optuna.create_study(storage=storage or stores.storage(), study_name=study.name,
                               direction=direction(study), load_if_exists=True)


def search_name(study: Study, variant: str) -> str:
    return f"{study.name}.search.{variant}"


def open_search(study: Study, variant: str, storage: Any) -> optuna.Study:
    search = study.spec.search
    seed = search.seed if search.seed is not None else study.spec.seeds[0]
    samplers = {"tpe": lambda: optuna.samplers.TPESampler(seed=seed),
                "random": lambda: optuna.samplers.RandomSampler(seed=seed),
                "grid": lambda: optuna.samplers.RandomSampler(seed=seed)}  # grid points are enqueued
    pruners = {"none": optuna.pruners.NopPruner, "median": lambda: optuna.pruners.MedianPruner(n_warmup_steps=1),
               "hyperband": lambda: optuna.pruners.HyperbandPruner(min_resource=1,
                                                                   max_resource=study.spec.train.epochs)}
    return optuna.create_study(storage=storage, study_name=search_name(study, variant), direction=direction(study),
                               sampler=samplers[search.sampler](), pruner=pruners[search.pruner](),
                               load_if_exists=True)


def plan(study: Study) -> list[tuple[str, int]]:
    return [(v, s) for v in study.variants for s in study.spec.seeds]


def fingerprint(study: Study, variant: str) -> str:
    """What a trial's result depends on (model, training, task, metrics) — not the device or
    evaluation batch size. Adding a variant or a seed keeps existing trials valid; changing
    what they were trained with does not."""
    train = study.spec.train.model_dump(exclude={"device", "eval_batch_size"})
    content = {"model": study.variants[variant].spec.model_dump(), "train": train,
               "task": study.spec.task.model_dump(), "metrics": study.metrics}
    return hashlib.sha256(json.dumps(content, sort_keys=True, default=str).encode()).hexdigest()[:16]


def search_fingerprint(study: Study, variant: str) -> str:
    content = {"base": fingerprint(study, variant), "search": study.spec.search.model_dump(),
               "match": study.spec.match_params}
    return hashlib.sha256(json.dumps(content, sort_keys=True, default=str).encode()).hexdigest()[:16]


def search_budget(study: Study) -> int:
    search = study.spec.search
    if not search.enabled:
        return 0
    if search.sampler == "grid":
        size = math.prod(len(grid_points(d)) for d in search.space.values())
        return min(search.trials, size) if search.trials else size
    return search.trials


def grid_order(study: Study) -> list[dict[str, Any]]:
    """Grid points in a seeded random order (a budget below the grid's size samples it evenly)."""
    space = study.spec.search.space
    points = [dict(zip(space, values)) for values in itertools.product(*(grid_points(d) for d in space.values()))]
    random.Random(study.spec.search.seed or 0).shuffle(points)
    return points


def failure_of(trial: optuna.trial.FrozenTrial) -> str | None:
    """Why a FAIL trial failed; None for bookkeeping (interrupted, duplicate, …).
    A FAIL with no reason recorded was failed by Optuna's heartbeat: its worker died."""
    reason = trial.user_attrs.get("failure")
    return None if reason is None or reason in BOOKKEEPING else reason


def _key(trial: optuna.trial.FrozenTrial) -> tuple[str, int] | None:
    """(variant, seed) of a final trial, (variant, slot) of a search trial."""
    attrs = trial.user_attrs
    for index in ("seed", "slot"):
        if "variant" in attrs and index in attrs:
            return attrs["variant"], int(attrs[index])
    return None


def elapsed(trial: optuna.trial.FrozenTrial) -> float | None:
    if trial.datetime_start and trial.datetime_complete:
        return (trial.datetime_complete - trial.datetime_start).total_seconds()
    return None


# ---------------------------------------------------------------------------------- driver


@dataclass
class _Config:
    """What one variant's final trials are trained with (search result and matching applied)."""

    study: Study
    variant: Variant
    params: dict[str, Any] = field(default_factory=dict)
    matched: matching.Matched | None = None


class Driver:
    """One worker: syncs the queues, pops trials until none is left anywhere, trains them."""

    def __init__(self, study: Study, stores: Stores, reporter: Reporter | None = None,
                 retry_failed: bool = False):
        self.study, self.stores = study, stores
        self.reporter = reporter or Reporter()
        self.retry_failed = retry_failed
        self.summary = RunSummary(0, 0, [])
        self._configs: dict[str, _Config | None] = {}
        self._data = None
        self._max_len: int | None = None

    # -- setup ------------------------------------------------------------------------
    def open(self) -> None:
        study, stores = self.study, self.stores
        self.checkpoint_s = checkpoint_interval()  # a bad $ABLATE_CHECKPOINT_S stops us before any trial
        self.storage = stores.storage()  # first: an unreachable database stops us before anything is created
        artifacts = stores.output_dir / "artifacts" if stores.tracking_uri.startswith("sqlite") else None
        self.tracker = Tracker(stores.tracking_uri, study.name, artifact_root=artifacts)
        self.parent = self.tracker.study_run(study.name, tags=_study_tags(study), params=_study_params(study))
        self.final = open_optuna(study, stores, self.storage)
        self.searches = {v: open_search(study, v, self.storage) for v in study.variants} \
            if study.spec.search.enabled else {}

    @property
    def data(self):
        if self._data is None:
            self._data = self.study.task.load()
            self._max_len = self.study.task.max_len(self._data)
        return self._data

    def config(self, variant: str) -> _Config | None:
        """The final configuration of a variant, or None while its search is unfinished."""
        if variant in self._configs and self._configs[variant] is not None:
            return self._configs[variant]
        study, params = self.study, {}
        if study.spec.search.enabled:
            ostudy = self.searches[variant]
            trials = ostudy.get_trials(deepcopy=False)
            if not self._search_done(variant, trials):
                self._configs[variant] = None
                return None
            best = [t for t in trials if t.state == TrialState.COMPLETE]
            if not best:
                self._configs[variant] = None
                return None
            params = ostudy.best_trial.params
        cfg = self._apply(variant, params)
        self._configs[variant] = cfg
        return cfg

    def _apply(self, variant: str, params: dict[str, Any]) -> _Config:
        study, var = self.study.with_params(variant, params) if params else (self.study, self.study.variants[variant])
        matched = None
        if self.study.spec.match_params:
            self.data  # noqa: B018 - max_len comes from the data
            base = self.study.variants[self.study.spec.report.baseline]
            study, var, matched = matching.match(study, variant, self._max_len, base=base)
        return _Config(study, var, params, matched)

    def _search_done(self, variant: str, trials) -> bool:
        budget = search_budget(self.study)
        finished = {_key(t)[1] for t in trials if _key(t) and t.user_attrs.get("variant") == variant
                    and (t.state in (TrialState.COMPLETE, TrialState.PRUNED)
                         or (t.state == TrialState.FAIL and failure_of(t)))}
        return all(slot in finished for slot in range(budget))

    # -- queues -----------------------------------------------------------------------
    def _reap(self, ostudy: optuna.Study, trials) -> None:
        """Fail trials whose worker is gone; they are enqueued again by the sync."""
        if self.stores.shared:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                optuna.storages.fail_stale_trials(ostudy)  # heartbeat; the callback re-enqueues them
            return
        for t in trials:
            if t.state == TrialState.RUNNING and not self.stores.worker_alive(t.user_attrs.get("worker")):
                try:
                    ostudy._storage.set_trial_user_attr(t._trial_id, "failure", INTERRUPTED)
                    ostudy.tell(t.number, state=TrialState.FAIL)
                except (optuna.exceptions.UpdateFinishedTrialError, ValueError, RuntimeError):
                    pass  # finished meanwhile

    def sync(self) -> None:
        """Enqueue every search slot and (variant, seed) not yet complete, queued or running."""
        study = self.study
        for variant, ostudy in self.searches.items():
            self._reap(ostudy, ostudy.get_trials(deepcopy=False))
            trials = ostudy.get_trials(deepcopy=False)
            self._check_changed(trials, {variant: search_fingerprint(study, variant)}, ostudy.study_name)
            taken = self._taken(trials)
            points = grid_order(study) if study.spec.search.sampler == "grid" else None
            for slot in range(search_budget(study)):
                if (variant, slot) not in taken:
                    attrs = {"variant": variant, "slot": slot, "fingerprint": search_fingerprint(study, variant)}
                    ostudy.enqueue_trial(points[slot] if points else {}, user_attrs=attrs)
        self._reap(self.final, self.final.get_trials(deepcopy=False))
        trials = self.final.get_trials(deepcopy=False)
        configs = {v: self.config(v) for v in study.variants}
        self._check_changed(trials, {v: fingerprint(c.study, v) for v, c in configs.items() if c},
                            "the output folder")
        taken = self._taken(trials)
        for variant, seed in plan(study):
            cfg = configs[variant]
            if cfg is None or (variant, seed) in taken:
                continue
            attrs = {"variant": variant, "seed": seed, "fingerprint": fingerprint(cfg.study, variant)}
            if cfg.params:
                attrs["params"] = json.dumps(cfg.params, sort_keys=True, default=str)
            self.final.enqueue_trial({}, user_attrs=attrs)

    def _taken(self, trials) -> set[tuple[str, int]]:
        """Keys that need no enqueue: complete, waiting, running, or failed for good."""
        taken = set()
        for t in trials:
            key = _key(t)
            if key is None:
                continue
            if t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.WAITING, TrialState.RUNNING):
                taken.add(key)
            elif t.state == TrialState.FAIL and failure_of(t) and not self.retry_failed:
                taken.add(key)
        return taken

    def _check_changed(self, trials, expected: dict[str, str], where: str) -> None:
        changed = sorted({t.user_attrs["variant"] for t in trials
                          if t.state == TrialState.COMPLETE and _key(t) and t.user_attrs.get("variant") in expected
                          and t.user_attrs.get("fingerprint") not in (None, expected[t.user_attrs["variant"]])})
        if changed:
            place = self.stores.output_dir if where == "the output folder" else f"search study '{where}' in {self.stores.output_dir}"
            raise AblateError(
                f"{place} holds finished trials of variant(s) {', '.join(changed)} trained with different "
                f"settings than the study file has now (model, train, task, metrics or search changed); "
                f"give a new --output folder, or delete that one")

    def _pop(self, worker_id: str):
        """(optuna study, trial, phase) of the next queued trial, or None."""
        for phase, ostudy in [*(("search", s) for s in self.searches.values()), ("final", self.final)]:
            if not ostudy.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
                continue
            with warnings.catch_warnings():  # we beat the heart ourselves (see _beat)
                warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")
                trial = (phase == "final" and self._pop_checkpointed(ostudy)) or ostudy.ask()
            trial.set_user_attr("worker", worker_id)
            key = _key(ostudy._storage.get_trial(trial._trial_id))
            drop = self._drop_reason(ostudy, trial.number, key, phase)
            if drop:
                trial.set_user_attr("failure", drop)
                ostudy.tell(trial, state=TrialState.FAIL)
                continue
            if self.stores.shared:
                self._beat(trial)
            return ostudy, trial, phase
        return None

    def _pop_checkpointed(self, ostudy: optuna.Study) -> optuna.Trial | None:
        """A queued final trial that an interrupted run left a checkpoint for, taken as
        ``ask()`` takes one (so a resumed study finishes its half-trained trials before it starts
        new ones), or None. Search trials are not preferred: a retried slot samples anew."""
        for t in ostudy.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
            key = _key(t)
            if key is None or not self._checkpoint_path(*key).exists():
                continue
            try:
                if ostudy._storage.set_trial_state_values(t._trial_id, state=TrialState.RUNNING):
                    return optuna.Trial(ostudy, t._trial_id)
            except optuna.exceptions.UpdateFinishedTrialError:
                continue  # another worker took and finished it meanwhile
        return None

    def _drop_reason(self, ostudy, number: int, key, phase: str) -> str | None:
        if key is None:  # another worker took the last queued trial; ask() made a fresh one
            return "nothing queued"
        if phase == "final" and key not in set(plan(self.study)):
            return "no longer in the study file"
        for t in ostudy.get_trials(deepcopy=False):
            if t.number == number or _key(t) != key:
                continue
            if t.state == TrialState.COMPLETE or (t.state in (TrialState.WAITING, TrialState.RUNNING)
                                                  and t.number < number):
                return "duplicate"
        return None

    def _beat(self, trial: optuna.Trial) -> None:
        storage, trial_id = self.storage, trial._trial_id
        stop = threading.Event()

        def beat() -> None:
            while True:
                try:
                    storage.record_heartbeat(trial_id)
                except Exception:  # noqa: BLE001 - a missed beat is retried; the grace period covers it
                    pass
                if stop.wait(self.stores.heartbeat_s):
                    return

        thread = threading.Thread(target=beat, daemon=True)
        thread.start()
        self._heartbeat = (stop, thread)

    def _end_beat(self) -> None:
        beat = getattr(self, "_heartbeat", None)
        if beat:
            beat[0].set()
            self._heartbeat = None

    def _busy_elsewhere(self) -> bool:
        """Trials running in other workers (whose completion may unlock more work)."""
        return any(ostudy.get_trials(deepcopy=False, states=(TrialState.RUNNING, TrialState.WAITING))
                   for ostudy in [*self.searches.values(), self.final])

    # -- main loop --------------------------------------------------------------------
    def run(self, wait_for_others: bool = True) -> RunSummary:
        with self.stores.worker() as worker_id:
            self.worker_id = worker_id
            self.open()
            with self.stores.queue_lock():
                self.sync()
            complete = {_key(t) for t in self.final.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))}
            self.summary.skipped = len(complete & set(plan(self.study)))
            self.reporter.study(total=len(plan(self.study)), done=self.summary.skipped)
            self.device = resolve_device(self.study.spec.train.device)
            if self.summary.skipped < len(plan(self.study)):
                _ = self.data  # a bad data file stops the run here (one line, exit 2), not every trial
            while True:
                stopping.check()
                with self.stores.queue_lock():
                    self.sync()
                    popped = self._pop(worker_id)
                if popped is None:
                    if wait_for_others and self._busy_elsewhere():
                        stopping.sleep(POLL_S)
                        continue
                    break
                ostudy, trial, phase = popped
                try:
                    if phase == "search":
                        self._search_trial(ostudy, trial)
                    else:
                        self._final_trial(trial)
                except KeyboardInterrupt:
                    # Stopped outside training (setting up, logging): record the trial as
                    # interrupted, as training itself does, so the next run re-queues it at once.
                    if ostudy._storage.get_trial(trial._trial_id).state == TrialState.RUNNING:
                        trial.set_user_attr("failure", INTERRUPTED)
                        ostudy.tell(trial, state=TrialState.FAIL, skip_if_finished=True)
                    raise
                finally:
                    self._end_beat()
            self._report_unsearchable()
        return self.summary

    def _report_unsearchable(self) -> None:
        for variant in self.searches:
            if self.config(variant) is None and self._search_done(variant, self.searches[variant].get_trials(deepcopy=False)):
                self.summary.failed.append((variant, -1, "every search trial failed; no parameters to train with"))

    # -- trials -----------------------------------------------------------------------
    def _search_trial(self, ostudy: optuna.Study, trial: optuna.Trial) -> None:
        study = self.study
        variant, slot = trial.user_attrs["variant"], int(trial.user_attrs["slot"])
        seed = study.spec.search.seed if study.spec.search.seed is not None else study.spec.seeds[0]
        params = {key: _suggest(trial, key, dim) for key, dim in study.spec.search.space.items()}
        label = f"{variant} · search {slot + 1}/{search_budget(study)}"
        try:
            cfg = self._apply(variant, params)
        except (StudyError, AblateError) as exc:
            trial.set_user_attr("failure", f"parameters do not fit: {exc}")
            ostudy.tell(trial, state=TrialState.FAIL)
            self.reporter.failed(label, seed, str(exc))
            return
        tags = {"variant": variant, "slot": str(slot), "seed": str(seed), "trial": str(trial.number),
                **{f"search.{k}": str(v) for k, v in params.items()}}
        run_id = self._start_run("search", cfg, variant, seed, tags, params, slot=slot)
        trial.set_user_attr("mlflow_run_id", run_id)
        self.reporter.trial(label, seed, study.spec.train.epochs)
        outcome = self._train(cfg, variant, seed, run_id, trial, prune=True, slot=slot)
        if outcome is None:
            return
        if outcome == "pruned":
            self.tracker.fail_trial(run_id, "pruned", status="KILLED")
            ostudy.tell(trial, state=TrialState.PRUNED)
            self.summary.searched += 1
            return
        result = outcome
        self.tracker.finish_trial(run_id, {**result.summary, **result.costs()}, result.per_unit)
        ostudy.tell(trial, result.summary[f"valid.{study.metrics[0]}"])
        self.summary.searched += 1
        self.reporter.finished(label, seed, result)

    def _final_trial(self, trial: optuna.Trial) -> None:
        variant, seed = trial.user_attrs["variant"], int(trial.user_attrs["seed"])
        cfg = self.config(variant)
        trial.set_user_attr("fingerprint", fingerprint(cfg.study, variant))
        run_id = self._start_run("trial", cfg, variant, seed, {"trial": str(trial.number)}, cfg.params)
        trial.set_user_attr("mlflow_run_id", run_id)
        self.reporter.trial(variant, seed, cfg.study.spec.train.epochs)
        outcome = self._train(cfg, variant, seed, run_id, trial, prune=False)
        if outcome is None:
            return
        result = outcome
        fault_point("track")  # test hook, before anything of the result is logged
        self.tracker.finish_trial(run_id, {**result.summary, **result.costs()}, result.per_unit)
        for key, value in result.summary.items():
            trial.set_user_attr(key, value)
        trial.set_user_attr("wall_s", result.wall_s)
        fault_point("tell")  # test hook: MLflow says FINISHED, Optuna does not know yet
        self.final.tell(trial, result.summary[f"valid.{self.study.metrics[0]}"])
        self.summary.finished += 1
        self.reporter.finished(variant, seed, result)

    def _start_run(self, role: str, cfg: _Config, variant: str, seed: int, extra_tags: dict[str, str],
                   params: dict[str, Any], slot: int | None = None) -> str:
        base = self.study.variants[self.study.spec.report.baseline]
        # A (variant, seed) is trained by one worker at a time: any run of it still open, or
        # finished by a worker that died before telling Optuna, is superseded now.
        self.tracker.close_unfinished(variant, seed if slot is None else slot, role=role,
                                      key="seed" if slot is None else "slot")
        tags = {
            "variant": variant,
            "seed": str(seed),
            "differs": cfg.variant.differs_from(base),
            "device": self.device.type,
            "ablate.worker": self.worker_id,
            "ablate.fingerprint": fingerprint(cfg.study, variant),
            **extra_tags,
            **{f"component.{s}": label for s, label in cfg.variant.components().items()},
        }
        run_params = {"variant": variant, "seed": seed,
                      "model": json.dumps(cfg.variant.spec.model_dump(), default=str),
                      **{f"train.{k}": v for k, v in cfg.study.spec.train.model_dump().items()},
                      **{f"search.{k}": v for k, v in params.items()},
                      **(cfg.matched.record() if cfg.matched else {})}
        name = f"{variant}/seed{seed}" if slot is None else f"{variant}/search{slot}"
        return self.tracker.start_trial(self.parent, name, tags, run_params, role=role)

    def _checkpoint_path(self, variant: str, seed: int, slot: int | None = None) -> Path:
        name = f"{variant}-seed{seed}" if slot is None else f"{variant}-search{slot}"
        return self.stores.output_dir / "checkpoints" / f"{name.replace(os.sep, '_')}.pt"

    def _checkpoint(self, cfg: _Config, variant: str, seed: int, slot: int | None) -> Checkpoint:
        """Where this (variant, seed) — or search slot — keeps its mid-training state."""
        signature = f"{fingerprint(cfg.study, variant)}/seed{seed}/batch{cfg.study.spec.train.batch_size}"
        return Checkpoint(self._checkpoint_path(variant, seed, slot), signature, every_s=self.checkpoint_s)

    def _train(self, cfg: _Config, variant: str, seed: int, run_id: str, trial: optuna.Trial, prune: bool,
               slot: int | None = None):
        """Train with one retry at half batch size on GPU out-of-memory. Returns the result,
        "pruned", or None when the trial failed (already recorded). A trial a dead worker left
        half-trained resumes from its checkpoint; only an interruption keeps the checkpoint."""
        metric = f"valid.{self.study.metrics[0]}"

        def on_epoch(epoch: int, logged: dict[str, float]) -> None:
            self.tracker.log_metrics(run_id, logged, step=epoch)
            primary = logged.get(metric)
            if primary is not None and math.isfinite(primary):
                trial.report(primary, epoch)
                if prune and trial.should_prune():
                    raise optuna.TrialPruned(f"pruned at epoch {epoch}")
            self.reporter.epoch(epoch, logged)
            fault_point("train")

        study, batch = cfg.study, cfg.study.spec.train.batch_size
        checkpoint = self._checkpoint(cfg, variant, seed, slot)
        for attempt in (1, 2):
            try:
                result = train_trial(study, cfg.variant, seed, self.data, self.device,
                                     on_epoch=on_epoch, on_step=self.reporter.step, checkpoint=checkpoint)
                if result.resumed_from:
                    self.tracker.set_tag(run_id, "ablate.resumed_from_epoch", str(result.resumed_from))
                return result
            except optuna.TrialPruned:
                checkpoint.remove()
                return "pruned"
            except torch.OutOfMemoryError as exc:
                _free_accelerator()
                checkpoint.remove()
                if attempt == 1 and batch > 1:
                    batch //= 2
                    study, _ = study.with_params(variant, {"train.batch_size": batch})
                    checkpoint = self._checkpoint(_Config(study, cfg.variant), variant, seed, slot)
                    self.tracker.set_tag(run_id, "ablate.oom_retry", f"batch size {batch}")
                    trial.set_user_attr("oom_retry_batch_size", batch)
                    continue
                reason = (f"out of memory at batch size {batch} (after a retry at half the batch size)"
                          if attempt == 2 else f"out of memory at batch size {batch}: {str(exc).splitlines()[0]}")
                return self._fail(trial, run_id, variant, seed, reason)
            except TrialFailed as exc:
                checkpoint.remove()  # a retry starts afresh (e.g. after the code was fixed)
                return self._fail(trial, run_id, variant, seed, str(exc))
            except Exception as exc:  # noqa: BLE001 - a crashing variant fails alone; the study goes on
                checkpoint.remove()
                message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                return self._fail(trial, run_id, variant, seed, f"{type(exc).__name__}: {message}".rstrip(": "))
            except BaseException:
                # Ctrl-C: leave a clean record; the next run re-queues this trial.
                trial.set_user_attr("failure", INTERRUPTED)
                self.tracker.fail_trial(run_id, INTERRUPTED, status="KILLED")
                trial.study.tell(trial, state=TrialState.FAIL)
                raise
        return None  # pragma: no cover - the loop always returns

    def _fail(self, trial: optuna.Trial, run_id: str, variant: str, seed: int, reason: str) -> None:
        trial.set_user_attr("failure", reason)
        self.tracker.fail_trial(run_id, reason)
        trial.study.tell(trial, state=TrialState.FAIL)
        if "slot" not in trial.user_attrs:
            self.summary.failed.append((variant, seed, reason))
        self.reporter.failed(variant, seed, reason)
        return None


def _suggest(trial: optuna.Trial, key: str, dim) -> Any:
    if isinstance(dim, Categorical):
        return trial.suggest_categorical(key, dim.choices)
    if isinstance(dim, IntRange):
        return trial.suggest_int(key, dim.low, dim.high, step=dim.step, log=dim.log)
    assert isinstance(dim, FloatRange)
    return trial.suggest_float(key, dim.low, dim.high, step=dim.step, log=dim.log)


def _free_accelerator() -> None:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def run_study(study: Study, stores: Stores, reporter: Reporter | None = None,
              retry_failed: bool = False, wait_for_others: bool = True) -> RunSummary:
    """Train every planned (variant, seed) not yet complete (searching first when the study
    has a ``search:`` section); returns what this process did."""
    return Driver(study, stores, reporter, retry_failed).run(wait_for_others=wait_for_others)


def prepare(study: Study, stores: Stores) -> None:
    """Create the stores and fill the queues once, before N workers start on them (MLflow's
    and Optuna's first-use schema creation must not race)."""
    driver = Driver(study, stores)
    driver.open()
    with stores.queue_lock():
        driver.sync()


# ---------------------------------------------------------------------------------- status


@dataclass
class VariantStatus:
    done: int = 0
    running: int = 0
    failed: int = 0
    left: int = 0
    searched: int = 0  # finished search trials
    search_budget: int = 0
    final_running: int = 0
    failures: list[tuple[int, str]] = field(default_factory=list)  # (seed, reason)
    walls: list[float] = field(default_factory=list)


def progress(study: Study, stores: Stores, storage: Any = None) -> dict[str, VariantStatus]:
    """Per variant: final trials done / running / failed / left, search trials finished."""
    storage = storage or stores.storage()
    rows = {v: VariantStatus(search_budget=search_budget(study)) for v in study.variants}
    names = {s.study_name for s in optuna.get_all_study_summaries(storage)}
    if study.name in names:
        final = optuna.load_study(study_name=study.name, storage=storage)
        # One state per key, however many trials it took: complete > running > queued > failed.
        by_key: dict[tuple[str, int], list] = {}
        for t in final.get_trials(deepcopy=False):
            key = _key(t)
            if key is not None and key[0] in rows and key in set(plan(study)):
                by_key.setdefault(key, []).append(t)
        for key, trials in by_key.items():
            row = rows[key[0]]
            states = {t.state for t in trials}
            if TrialState.COMPLETE in states:
                row.done += 1
                t = next(t for t in trials if t.state == TrialState.COMPLETE)
                wall = t.user_attrs.get("wall_s") or elapsed(t)
                if wall:
                    row.walls.append(wall)
            elif any(t.state == TrialState.RUNNING and _live(stores, t) for t in trials):
                row.running += 1
                row.final_running += 1
            elif TrialState.WAITING not in states:
                reasons = [failure_of(t) for t in trials if t.state == TrialState.FAIL and failure_of(t)]
                if reasons:
                    row.failed += 1
                    row.failures.append((key[1], reasons[-1]))
    for variant, row in rows.items():
        name = search_name(study, variant)
        if name in names:
            for t in optuna.load_study(study_name=name, storage=storage).get_trials(deepcopy=False):
                if t.state in (TrialState.COMPLETE, TrialState.PRUNED) or (t.state == TrialState.FAIL and failure_of(t)):
                    row.searched += 1
                    if elapsed(t):
                        row.walls.append(elapsed(t))
                elif t.state == TrialState.RUNNING and _live(stores, t):
                    row.running += 1
        row.left = max(len(study.spec.seeds) - row.done - row.failed - row.final_running, 0)
    return rows


def _live(stores: Stores, trial: optuna.trial.FrozenTrial) -> bool:
    """A RUNNING trial whose worker still lives (on a shared database: until the heartbeat says otherwise)."""
    return stores.shared or stores.worker_alive(trial.user_attrs.get("worker"))


def eta_seconds(rows: dict[str, VariantStatus], checkpointed: dict[str, list[float]] | None = None) -> float | None:
    """Remaining trials × mean wall time of finished trials ÷ trials running now (≥ 1).
    ``checkpointed[variant]`` lists the done fraction (epoch / epochs) of that variant's trials
    with a checkpoint: they count as that much less left; other running trials as half left."""
    walls = [w for r in rows.values() for w in r.walls]
    if not walls:
        return None
    checkpointed = checkpointed or {}
    remaining = 0.0
    for name, r in rows.items():
        done = checkpointed.get(name, [])
        unsaved_running = max(r.running - len(done), 0)
        remaining += (r.left + r.running - sum(done) - 0.5 * unsaved_running
                      + max(r.search_budget - r.searched - r.running + r.final_running, 0))
    parallel = max(1, sum(r.running for r in rows.values()))
    return max(remaining, 0.0) * (sum(walls) / len(walls)) / parallel


def checkpointed_fractions(summaries: dict[str, dict[str, float]]) -> dict[str, list[float]]:
    """``{variant: [epoch / epochs, …]}`` from :func:`ablate.train.checkpoint_summaries`
    (files named ``<variant>-seed<k>`` or ``<variant>-search<slot>``)."""
    found: dict[str, list[float]] = {}
    for stem, saved in summaries.items():
        named = re.fullmatch(r"(.+)-(?:seed|search)\d+", stem)
        if named:
            found.setdefault(named.group(1), []).append(min(saved["epoch"] / saved["epochs"], 1.0))
    return found


def _study_tags(study: Study) -> dict[str, str]:
    return {"ablate.study": study.name, "ablate.task": study.task.kind_name(),
            "ablate.report_settings": study.report_settings_json()}


def _study_params(study: Study) -> dict[str, object]:
    return {"study_file": str(study.path), "seeds": study.spec.seeds, "task": study.spec.task.model_dump_json()}

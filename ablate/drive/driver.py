"""The worker loop: sync the queues, take the next trial, train it, until no work is left.

A worker reads the final queue whole (a sync: what is planned, what is missing, what a dead
worker left) when it starts, when its take finds nothing waiting, after a reap found a dead
worker's trial, and before every take of a study whose plan moves with its results (a sequential
design) or that searches; otherwise a take is one claim (:meth:`.queue.Queue.take`), whose cost
does not grow with the study.

Every planned (variant, seed) is enqueued once as a fixed-parameter trial in the study's final
queue. With a ``search:`` section each variant first gets its own search queue
(``<study>.search.<variant>``) with the same budget of slots; when a variant's search is over,
its best parameters are trained over the study's seeds in the final queue, which the report
compares. Search queues are served first.
"""

from __future__ import annotations

import collections
import json
import os
import time
import warnings
import zlib
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from ablate import stopping
from ablate.drive.execution import (
    Config,
    Execution,
    Failed,
    Job,
    Pruned,
    SearchJob,
    TaskData,
    checkpoint_path,
)
from ablate.drive.finals import FinalTrials
from ablate.drive.identity import check_data, data_digest
from ablate.drive.ledger import (
    DATA_DIGEST,
    INTERRUPTED,
    Key,
    check_changed,
    drop_reason,
    failed_for_good,
    fingerprint,
    fingerprints,
    key_of,
    plan,
    search_done,
    search_fingerprints,
    taken,
)
from ablate.drive.packing import claim_mates
from ablate.drive.queue import Phase, Queue
from ablate.drive.records import resolved_yaml, study_params, study_tags
from ablate.drive.reference import record_reference
from ablate.drive.reporter import Reporter
from ablate.drive.reuse import Donors
from ablate.drive.stores import Stores
from ablate.errors import AblateError, StudyError
from ablate.stats import ReportSettings
from ablate.study.load import Study
from ablate.study.tuning import grid_order, search_budget, search_seed
from ablate.tracking.names import DATA_ARTIFACTS, DATA_SUMMARY, STUDY_ARTIFACT
from ablate.tracking.provenance import pin_threads
from ablate.tracking.store import Tracker, provenance
from ablate.training import match as matching
from ablate.training.preflight import trained_sizes
from ablate.training.trainer import TrialResult, checkpoint_interval, resolve_device

POLL_S = 1.0  # idle workers look for new work this often while others still run trials


@dataclass
class RunSummary:
    finished: int  # trials trained by this invocation
    skipped: int  # already complete before it started
    failed: list[tuple[str, int, str]]
    searched: int = 0  # search trials run by this invocation
    planned: int = 0  # (variant, seed) trials planned when it ended (a sequential design's plan grows)
    reused: int = 0  # trials copied from another study's store or trial files (``--reuse``), not trained


class Driver(FinalTrials):
    """One worker: opens the stores, syncs the queues, takes trials until none is left anywhere."""

    def __init__(
        self,
        study: Study,
        stores: Stores,
        reporter: Reporter | None = None,
        retry_failed: bool = False,
        worker_id: str = "",
        donors: Donors | None = None,
        data: TaskData | None = None,
    ):
        self.study, self.stores = study, stores
        self.donors = donors or Donors()
        self.reporter = reporter or Reporter()
        self.retry_failed = retry_failed
        self.worker_id = worker_id
        self.planned = plan(study)  # a sequential design's first look until the first sync
        self.possible = {(v, s) for v in study.variants for s in study.spec.seed_list}
        self._settings: ReportSettings | None = None  # the sequential rule's α, correction, margin
        self.summary = RunSummary(0, 0, [])
        checkpoint_s = checkpoint_interval()  # a bad $ABLATE_CHECKPOINT_S stops us before any trial
        storage = stores.storage()  # first: an unreachable database stops us before anything is created
        # A tracking server keeps the artifacts where it is configured to; for a database store
        # (SQLite, PostgreSQL) MLflow's own default is ./mlruns under whichever process creates the
        # experiment (a worker's working folder, outside the study's output): the output folder's
        served = stores.tracking_uri.startswith(("http://", "https://"))
        artifacts = None if served else stores.output_dir / "artifacts"
        tracker = Tracker(stores.tracking_uri, study.name, artifact_root=artifacts)
        pin_threads((train := study.spec.train).threads)  # before the conditions are recorded
        tracker.provenance = provenance(study.path, str(resolve_device(train.device)), train.compile)
        parent = tracker.study_run(study.name, tags=study_tags(study), params=study_params(study))
        tracker.attach_text(parent, resolved_yaml(study), STUDY_ARTIFACT)
        self.tracker, self.parent = tracker, parent  # the study's MLflow run
        self.final = Queue.final(study, storage)
        self.searches = (
            {v: Queue.search(study, v, storage) for v in study.variants} if study.spec.search.enabled else {}
        )
        self.data_digest = data_digest(study)  # what the data files hold now, by content
        self.data = data or TaskData(study)
        self.data.on_load = self._record_data
        if self.data.loaded:  # read before the stores existed (read_data_first): recorded now
            self._record_data(self.data.get())
        self.execution = Execution(
            study, stores.output_dir, tracker, parent, self.reporter, self.data, worker_id, checkpoint_s
        )
        self._configs: dict[str, Config] = {}
        self._seen: list[FrozenTrial] | None = None  # the final queue as the last sync read it
        self._seen_by_key: dict[Key | None, list[FrozenTrial]] = {}
        self._fresh: set[int] = set()  # final trials taken whose key had no other trial (no MLflow run)
        self._resumable: list[int] = []  # waiting final trials with a checkpoint, as the last sync found them
        self._waiting: list[int] = []  # the final trials the last sync found waiting, in this worker's order
        self._reap_at = 0.0  # when (time.monotonic) a busy worker next looks for dead workers' trials
        # Whether every take reads the queues whole: a sequential design's plan moves with each
        # result; a search's sampler reads its queue anyway, and its end enqueues final trials.
        self._read_whole = study.spec.sequential is not None or bool(self.searches)

    def _record_data(self, data: Any) -> None:
        """The loaded data's summary (Task.data_summary) as a tag on the study's run, its files
        (Task.artifacts) as artifacts under ``data/``."""
        try:
            summary = self.study.task.data_summary(data)
            if self.data_digest:  # which content every trial of this run was trained on
                summary = {**summary, "data digest (SHA-256)": self.data_digest}
            text = json.dumps(summary, default=str)
            try:
                self.tracker.set_tags(self.parent, {DATA_SUMMARY: text})
            except Exception:
                # Workers starting together tag the study's run with the same summary, and a
                # database refuses the second insert: the tag being there is what matters.
                if self.tracker.tag_of(self.parent, DATA_SUMMARY) != text:
                    raise
            self.tracker.attach_files(self.parent, self.study.task.artifacts(data), DATA_ARTIFACTS)
        except Exception as exc:  # noqa: BLE001 - a summary is never worth a trial (data loads inside one)
            warnings.warn(f"no data summary recorded: {exc}", stacklevel=2)
        record_reference(self.tracker, self.parent, self.study, data)

    # -- what each variant trains with ----------------------------------------------------
    def config(self, variant: str) -> Config | None:
        """The final configuration of a variant, or None while its search is unfinished."""
        if variant in self._configs:
            return self._configs[variant]
        params: dict[str, Any] = {}
        if self.study.spec.search.enabled:
            queue = self.searches[variant]
            trials = queue.trials()
            if not search_done(self.study, variant, trials) or not any(
                t.state == TrialState.COMPLETE for t in trials
            ):
                return None
            params = queue.study.best_trial.params
        self._configs[variant] = self._apply(variant, params)
        return self._configs[variant]

    def _apply(self, variant: str, params: dict[str, Any]) -> Config:
        if params:
            study, var = self.study.with_params(variant, params)
        else:
            study, var = self.study, self.study.variants[variant]
        matched = None
        if self.study.spec.match_params:
            base = self.study.variants[self.study.spec.report.baseline]
            study, var, matched = matching.match(study, variant, self.data.max_len(), base=base)
        return Config(study, var, params, matched)

    # -- queues -------------------------------------------------------------------------
    def sync(self) -> None:
        """Enqueue every search slot and (variant, seed) not yet complete, queued or running."""
        study = self.study
        self._reap_at = time.monotonic() + self.stores.reap_s
        for variant, queue in self.searches.items():
            self.stores.reap(queue)
            trials = queue.trials()
            expected = search_fingerprints(study, variant)  # the current one first: new trials carry it
            place = f"search study '{queue.name}' in {self.stores.output_dir}"
            check_changed(trials, {variant: expected}, place)
            check_data(trials, study, self.data_digest, self.stores.output_dir, queue.name)
            done = taken(trials, self.retry_failed)
            points = grid_order(study) if study.spec.search.grid else None
            for slot in range(search_budget(study)):
                if (variant, slot) not in done:
                    attrs = {"variant": variant, "slot": slot, "fingerprint": expected[0]}
                    queue.enqueue(points[slot] if points else {}, attrs)
        self.stores.reap(self.final)
        trials = self.final.trials()
        configs = {v: self.config(v) for v in study.variants}
        expected = {v: fingerprints(c.study, v) for v, c in configs.items() if c}
        check_changed(trials, expected, str(self.stores.output_dir))
        check_data(trials, study, self.data_digest, self.stores.output_dir)
        self._replan(trials)
        done = taken(trials, self.retry_failed)
        enqueued = False
        for variant, seed in self.planned:
            cfg = configs[variant]
            if cfg is None or (variant, seed) in done:
                continue
            attrs = {"variant": variant, "seed": seed, "fingerprint": fingerprint(cfg.study, variant)}
            if cfg.params:
                attrs["params"] = json.dumps(cfg.params, sort_keys=True, default=str)
            self.final.enqueue_key(variant, seed, attrs, study.variants)
            enqueued = True
        self._seen = self.final.trials() if enqueued else trials
        self._resumable = self._checkpointed(self._seen)
        waiting = [t.number for t in self._seen if t.state == TrialState.WAITING]
        turn = zlib.crc32(self.worker_id.encode()) % max(len(waiting), 1)  # this worker's first
        self._waiting = waiting[turn:] + waiting[:turn]
        self._seen_by_key = collections.defaultdict(list)  # a take checks its key's trials alone
        for t in self._seen:
            self._seen_by_key[key_of(t)].append(t)

    def _checkpointed(self, trials: list[FrozenTrial]) -> list[int]:
        """The numbers of the waiting ``trials`` an interrupted worker left a checkpoint for: taken
        first, so half-trained trials finish first. One listing of the checkpoint folder, not a
        file check per waiting trial (slow on a cluster's shared file system)."""
        try:
            saved = set(os.listdir(self.stores.output_dir / "checkpoints"))
        except OSError:  # no folder yet: nothing was checkpointed
            return []
        return [
            t.number
            for t in trials
            if t.state == TrialState.WAITING
            and (key := key_of(t))
            and checkpoint_path(self.stores.output_dir, Job(*key)).name in saved
        ]

    def _next(self) -> tuple[Queue, optuna.Trial] | None:
        """Under the queue lock: the next trial to train and its queue, or None when none waits.
        The queues are read whole only when something may have changed what is missing (module
        docstring); a busy worker looks for dead workers' trials every ``stores.reap_s``."""
        synced = self._seen is None or self._read_whole
        if not synced and time.monotonic() >= self._reap_at:
            self._reap_at = time.monotonic() + self.stores.reap_s
            synced = self.stores.reap(self.final) > 0
        if synced:
            self.sync()
        popped = self._take()
        if popped is None and not synced:  # nothing waits: read whole, enqueue what is missing
            self.sync()
            popped = self._take()
        return popped

    def _take(self) -> tuple[Queue, optuna.Trial] | None:
        """The next queued trial (search queues first) and its queue, or None."""
        for queue in [*self.searches.values(), self.final]:
            final = queue.phase is Phase.FINAL
            if final:
                trial = queue.take(self._resumable, self._waiting)
                if trial is None:
                    continue
            elif any(t.state == TrialState.WAITING for t in queue.trials()):
                trial = queue.ask()
            else:
                continue
            trial.set_user_attr("worker", self.worker_id)
            key = key_of(trial)  # its attributes as the claim read them
            planned = self.planned if final else None
            # A final trial's duplicates (two hosts enqueuing one key) as the last sync saw them, read again.
            seen, stored = (self._seen_by_key.get(key, []), queue.stored) if final else (queue.trials(), None)
            drop = drop_reason(seen, trial.number, key, planned, self.possible, stored)
            if drop:
                queue.fail(trial, drop)
                continue
            if final and [(t.number, t.state) for t in seen] == [(trial.number, TrialState.WAITING)]:
                self._fresh.add(trial.number)
            return queue, trial
        return None

    def _pack_size(self, trial: optuna.Trial, measure: bool) -> int | None:
        """``train.pack`` for ``trial``'s variant; None: to be measured, and ``measure`` False."""
        variant = trial.user_attrs.get("variant")
        return self.execution.pack_size(variant, sum(v == variant for v, _ in self.planned), measure)

    def _mates(self, queue: Queue, trial: optuna.Trial) -> list[optuna.Trial] | None:
        """Queued final trials of ``trial``'s variant claimed to train in its pack (``train.pack``);
        None where its size is still to be measured."""
        if queue.phase is not Phase.FINAL:
            return []
        if (size := self._pack_size(trial, measure=False)) is None:
            return None
        return claim_mates(self.study, size, queue, trial, self.planned, self.worker_id, self._seen_by_key)

    def _busy_elsewhere(self) -> bool:
        """Trials running in other workers (whose completion may unlock more work)."""
        return any(
            queue.trials(TrialState.RUNNING, TrialState.WAITING)
            for queue in [*self.searches.values(), self.final]
        )

    def _running_elsewhere(self) -> bool:
        return any(
            self.stores.is_live(t)
            for queue in [*self.searches.values(), self.final]
            for t in queue.trials(TrialState.RUNNING)
        )

    def close_study(self, stopped_by: BaseException | None = None) -> None:
        """Close the study's MLflow run if this worker ends the study: after a normal end with no
        trial queued or running anywhere, FINISHED — or FAILED where trials failed for good (the
        run exits 1); stopped (Ctrl-C, SIGTERM) or crashed with no trial running elsewhere, a RUNNING
        run becomes KILLED or FAILED. Several workers may each close it: they agree."""
        if stopped_by is None:
            if self._busy_elsewhere():
                return
            failed = [f for f in self.summary.failed if f[1] < 0] or failed_for_good(
                self.final.trials(), self.possible
            )
            self.tracker.close_study(self.parent, "FAILED" if failed else "FINISHED")
        elif not self._running_elsewhere() and self.tracker.study_status(self.parent) == "RUNNING":
            interrupted = isinstance(stopped_by, KeyboardInterrupt)
            self.tracker.close_study(self.parent, "KILLED" if interrupted else "FAILED")

    def _replan(self, trials: list[optuna.trial.FrozenTrial]) -> None:
        """The keys wanted now (a sequential design adds seeds as its looks complete); the progress
        total follows the plan."""
        if self.study.spec.sequential is None:
            return
        self._settings = self._settings or self.study.report_settings()
        planned = plan(self.study, trials, self._settings)
        if self.summary.planned and len(planned) != len(self.planned):
            done = self.summary.finished + self.summary.reused
            settled = self.summary.skipped + done + len(self.summary.failed)
            self.reporter.study(total=len(planned), done=settled)
        self.planned = planned

    # -- main loop ------------------------------------------------------------------------
    def run(self, wait_for_others: bool = True) -> RunSummary:
        with self.stores.queue_lock():
            self.sync()
        complete = {key_of(t) for t in self._seen if t.state == TrialState.COMPLETE}
        self.summary.skipped = len(complete & set(self.planned))
        self.summary.planned = len(self.planned)
        self.reporter.study(total=len(self.planned), done=self.summary.skipped)
        if self.summary.skipped < len(self.planned):
            self.data.get()  # a bad data file stops the run here (one line, exit 2), not every trial
        trainers = {Phase.SEARCH: self._search_trial, Phase.FINAL: self._final_trial}
        while True:
            stopping.check()
            with self.stores.queue_lock():
                stopping.check()  # a stop asked while waiting for the lock takes no new trial
                popped = self._next()
                mates = self._mates(*popped) if popped else []
            if popped and mates is None:  # the pack's size measured first, outside the lock
                self._pack_size(popped[1], measure=True)
                with self.stores.queue_lock():
                    mates = self._mates(*popped)
            if popped is None:
                if wait_for_others and self._busy_elsewhere():
                    stopping.sleep(POLL_S)
                    continue
                break
            queue, trial = popped
            held = [trial, *mates]
            with ExitStack() as beats:
                for each in held:
                    beats.enter_context(self.stores.heartbeat(queue, each))
                try:
                    if mates:
                        self._final_pack(queue, held)
                    else:
                        trainers[queue.phase](queue, trial)
                except KeyboardInterrupt:
                    # Stopped outside training (setting up, logging): record the trials as
                    # interrupted, as training itself does, so the next run re-queues them at once.
                    for each in held:
                        if queue.running(each):
                            queue.fail(each, INTERRUPTED, skip_if_finished=True)
                    raise
        self._report_unsearchable()
        self.summary.planned = len(self.planned)
        return self.summary

    def _report_unsearchable(self) -> None:
        for variant, queue in self.searches.items():
            if self.config(variant) is None and search_done(self.study, variant, queue.trials()):
                reason = "every search trial failed; no parameters to train with"
                self.summary.failed.append((variant, -1, reason))

    # -- trials ---------------------------------------------------------------------------
    def _search_trial(self, queue: Queue, trial: optuna.Trial) -> None:
        study = self.study
        job = SearchJob(trial.user_attrs["variant"], search_seed(study), int(trial.user_attrs["slot"]))
        params = {key: dim.suggest(trial, key) for key, dim in study.spec.search.space.items()}
        label = f"{job.variant} · search {job.slot + 1}/{search_budget(study)}"
        try:
            cfg = self._apply(job.variant, params)
        except (StudyError, AblateError) as exc:
            queue.fail(trial, f"parameters do not fit: {exc}")
            self.reporter.failed(label, job.seed, str(exc))
            return
        tags = {
            "variant": job.variant,
            "slot": str(job.slot),
            "seed": str(job.seed),
            "trial": str(trial.number),
            **{f"search.{k}": str(v) for k, v in params.items()},
        }
        if self.data_digest:
            trial.set_user_attr(DATA_DIGEST, self.data_digest)
            tags[f"ablate.{DATA_DIGEST}"] = self.data_digest
        run_id = self.execution.start_run(job, cfg, tags, params)
        trial.set_user_attr("mlflow_run_id", run_id)
        self.reporter.trial(label, job.seed, study.spec.train.epochs)
        outcome = self.execution.train(job, cfg, run_id, trial)
        if isinstance(outcome, Failed):
            return
        if isinstance(outcome, Pruned):
            self.summary.searched += 1
            return
        self.execution.finish(run_id, outcome)
        queue.study.tell(trial, self._primary(outcome))
        self.summary.searched += 1
        self.reporter.finished(label, job.seed, outcome)

    def _parameters(self, cfg: Config, variant: str) -> int:
        """The parameter count of the model a trial of ``variant`` trains (built on the meta device)."""
        return trained_sizes(cfg.study, self.data.get())[variant].parameters

    def _primary(self, result: TrialResult) -> float:
        return result.summary[f"valid.{self.study.metrics[0]}"]

"""The worker loop: sync the queues, take the next trial, train it, until no work is left.

Every planned (variant, seed) is enqueued once as a fixed-parameter trial in the study's final
queue. With a ``search:`` section each variant first gets its own search queue
(``<study>.search.<variant>``) with the same budget of slots; when a variant's search is over,
its best parameters are trained over the study's seeds in the final queue, which the report
compares. Search queues are served first.
"""

from __future__ import annotations

import json
import warnings
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import TrialState

from ablate import stopping
from ablate.drive.donor import Donor
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
from ablate.drive.identity import check_data, data_digest
from ablate.drive.ledger import (
    DATA_DIGEST,
    INTERRUPTED,
    Phase,
    Queue,
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
from ablate.drive.records import resolved_yaml, study_params, study_tags
from ablate.drive.reference import record_reference
from ablate.drive.reporter import Reporter
from ablate.drive.reuse import Donors
from ablate.drive.stores import Stores
from ablate.errors import AblateError, StudyError
from ablate.faults import fault_point
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


class Driver:
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
        pin_threads(study.spec.train.threads)  # before the conditions are recorded
        tracker.provenance = provenance(study.path, str(resolve_device(study.spec.train.device)))
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
        self._seen: list[optuna.trial.FrozenTrial] | None = None  # the final queue as the last sync read it

    def _record_data(self, data: Any) -> None:
        """The loaded data's summary (Task.data_summary) as a tag on the study's run, its files
        (Task.artifacts) as artifacts under ``data/``."""
        try:
            summary = self.study.task.data_summary(data)
            if self.data_digest:  # which content every trial of this run was trained on
                summary = {**summary, "data digest (SHA-256)": self.data_digest}
            self.tracker.set_tag(self.parent, DATA_SUMMARY, json.dumps(summary, default=str))
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
        trials = self._seen = self.final.trials()
        configs = {v: self.config(v) for v in study.variants}
        expected = {v: fingerprints(c.study, v) for v, c in configs.items() if c}
        check_changed(trials, expected, str(self.stores.output_dir))
        check_data(trials, study, self.data_digest, self.stores.output_dir)
        self._replan(trials)
        done = taken(trials, self.retry_failed)
        for variant, seed in self.planned:
            cfg = configs[variant]
            if cfg is None or (variant, seed) in done:
                continue
            attrs = {"variant": variant, "seed": seed, "fingerprint": fingerprint(cfg.study, variant)}
            if cfg.params:
                attrs["params"] = json.dumps(cfg.params, sort_keys=True, default=str)
            self.final.enqueue({}, attrs)
            self._seen = None  # read again by the take that follows

    def _take(self) -> tuple[Queue, optuna.Trial] | None:
        """The next queued trial (search queues first) and its queue, or None."""
        for queue in [*self.searches.values(), self.final]:
            final = queue.phase is Phase.FINAL
            seen = self._seen if final and self._seen is not None else queue.trials()
            waiting = [t for t in seen if t.state == TrialState.WAITING]
            if not waiting:
                continue
            trial = self._claim(queue, waiting) if final else queue.ask()
            trial.set_user_attr("worker", self.worker_id)
            key = key_of(queue.stored(trial.number))
            planned = self.planned if queue.phase is Phase.FINAL else None
            drop = drop_reason(queue.trials(), trial.number, key, planned, self.possible)
            if drop:
                queue.fail(trial, drop)
                continue
            return queue, trial
        return None

    def _mates(self, queue: Queue, trial: optuna.Trial) -> list[optuna.Trial]:
        """Queued final trials of ``trial``'s variant claimed to train in its pack (``train.pack``)."""
        if queue.phase is not Phase.FINAL:
            return []
        return claim_mates(self.study, self.execution.device, queue, trial, self.planned, self.worker_id)

    def _claim(self, queue: Queue, waiting: list[optuna.trial.FrozenTrial]) -> optuna.Trial:
        """The first ``waiting`` final trial no other worker took since the sync read it (no read of every
        trial again, as ``ask()`` does), checkpointed ones first: half-trained trials finish first."""

        def fresh(t: optuna.trial.FrozenTrial) -> bool:
            return not (key_of(t) and checkpoint_path(self.stores.output_dir, Job(*key_of(t))).exists())

        return next(filter(None, map(queue.claim, sorted(waiting, key=fresh))), None) or queue.ask()

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
        complete = {key_of(t) for t in self.final.trials(TrialState.COMPLETE)}
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
                self.sync()
                popped = self._take()
                mates = self._mates(*popped) if popped else []
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

    def _final_trial(self, queue: Queue, trial: optuna.Trial) -> None:
        job, cfg, run_id, outcome, donor = self._open_final(trial)
        if outcome is None:
            self.reporter.trial(job.variant, job.seed, cfg.study.spec.train.epochs)
            outcome = self.execution.train(job, cfg, run_id, trial)
        self._settle_final(queue, trial, job, run_id, outcome, donor)

    def _final_pack(self, queue: Queue, trials: list[optuna.Trial]) -> None:
        """Final trials of one variant: those no donor supplies trained as one pack."""
        opened = [self._open_final(trial) for trial in trials]
        fresh = [(trial, o) for trial, o in zip(trials, opened, strict=True) if o[3] is None]
        if len(fresh) > 1:
            jobs = [o[0] for _, o in fresh]
            for job in jobs:
                self.reporter.trial(job.variant, job.seed, fresh[0][1][1].study.spec.train.epochs)
            trained = self.execution.train_packed(
                jobs, fresh[0][1][1], [o[2] for _, o in fresh], [trial for trial, _ in fresh]
            )
            outcomes = dict(zip([trial.number for trial, _ in fresh], trained, strict=True))
        else:
            outcomes = {t.number: self.execution.train(o[0], o[1], o[2], t) for t, o in fresh}
        for trial, (job, _, run_id, outcome, donor) in zip(trials, opened, strict=True):
            self._settle_final(queue, trial, job, run_id, outcomes.get(trial.number, outcome), donor)

    def _open_final(self, trial: optuna.Trial) -> tuple[Job, Config, str, TrialResult | None, Donor | None]:
        """A final trial's MLflow run opened, and its result copied where a donor has one."""
        job = Job(trial.user_attrs["variant"], int(trial.user_attrs["seed"]))
        self.final.show_key(trial, job.variant, job.seed, list(self.study.variants))
        cfg = self.config(job.variant)
        trained_as = fingerprint(cfg.study, job.variant)
        trial.set_user_attr("fingerprint", trained_as)
        tags = {"trial": str(trial.number)}
        if self.data_digest:
            trial.set_user_attr(DATA_DIGEST, self.data_digest)
            tags[f"ablate.{DATA_DIGEST}"] = self.data_digest
        run_id = self.execution.start_run(job, cfg, tags, cfg.params)
        trial.set_user_attr("mlflow_run_id", run_id)
        donor = self.donors.find_for(cfg.study, job.variant, job.seed, self.data_digest)
        outcome = donor.copy_into(self.tracker, run_id, self._parameters(cfg, job.variant)) if donor else None
        if outcome is not None:
            trial.set_user_attr("reused_from", donor.source)
        return job, cfg, run_id, outcome, donor if outcome is not None else None

    def _settle_final(
        self,
        queue: Queue,
        trial: optuna.Trial,
        job: Job,
        run_id: str,
        outcome: TrialResult | Failed,
        donor: Donor | None,
    ) -> None:
        """A final trial's result logged and told (or its failure counted)."""
        if isinstance(outcome, Failed):
            self.summary.failed.append((job.variant, job.seed, outcome.reason))
            return
        fault_point("track")  # test hook, before anything of the result is logged
        self.execution.finish(run_id, outcome)
        for key, value in outcome.summary.items():
            trial.set_user_attr(key, value)
        trial.set_user_attr("wall_s", outcome.wall_s)
        fault_point("tell")  # test hook: MLflow says FINISHED, Optuna does not know yet
        queue.study.tell(trial, self._primary(outcome))
        if donor is not None:
            self.summary.reused += 1
            self.reporter.reused(job.variant, job.seed, outcome, donor.source)
        else:
            self.summary.finished += 1
            self.reporter.finished(job.variant, job.seed, outcome)

    def _parameters(self, cfg: Config, variant: str) -> int:
        """The parameter count of the model a trial of ``variant`` trains (built on the meta device)."""
        return trained_sizes(cfg.study, self.data.get())[variant].parameters

    def _primary(self, result: TrialResult) -> float:
        return result.summary[f"valid.{self.study.metrics[0]}"]

"""Running one trial: its MLflow run, training with one retry at half batch size on GPU
out-of-memory, its mid-training checkpoint, and how it ends — finished (a :class:`TrialResult`),
:class:`Pruned`, :class:`Failed`, or interrupted (recorded, then raised on).

A trial a dead worker left half-trained resumes from its checkpoint; only an interruption keeps
the checkpoint (a failed or pruned trial starts afresh when retried).
"""

from __future__ import annotations

import functools
import json
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import optuna
import torch
from optuna.trial import TrialState

from ablate.drive.ledger import INTERRUPTED, fingerprint_of, fingerprints, trained_with
from ablate.drive.packing import PACK_TAG, pack_size
from ablate.errors import store_failure
from ablate.faults import fault_point
from ablate.model.variant import Variant
from ablate.registry import COMPONENT_SLOTS
from ablate.study.load import Study
from ablate.tracking.names import TRAINED_WITH
from ablate.tracking.store import Tracker
from ablate.training import match as matching
from ablate.training.own_trial import own_trial
from ablate.training.packed import train_packed
from ablate.training.packsize import measure_pack_size
from ablate.training.preflight import preflight
from ablate.training.trainer import (
    PRECISION_TAG,
    Checkpoint,
    TrialFailed,
    TrialResult,
    precision_name,
    resolve_device,
    train_trial,
)

if TYPE_CHECKING:  # pragma: no cover
    from ablate.drive.reporter import Reporter


@dataclass(frozen=True)
class Job:
    """A final trial: one (variant, seed) of the study."""

    variant: str
    seed: int
    role: ClassVar[str] = "trial"  # the MLflow run's ablate.role
    prunes: ClassVar[bool] = False

    @property
    def index(self) -> tuple[str, int]:
        """The tag that tells this trial's MLflow runs from the variant's others, and its value."""
        return "seed", self.seed

    def stem(self, separator: str) -> str:
        return f"{self.variant}{separator}seed{self.seed}"


@dataclass(frozen=True)
class SearchJob(Job):
    """A search trial: one slot of a variant's search budget, trained with the search seed."""

    slot: int
    role: ClassVar[str] = "search"
    prunes: ClassVar[bool] = True

    @property
    def index(self) -> tuple[str, int]:
        return "slot", self.slot

    def stem(self, separator: str) -> str:
        return f"{self.variant}{separator}search{self.slot}"


def checkpoint_path(output_dir: Path, job: Job) -> Path:
    return output_dir / "checkpoints" / f"{job.stem('-').replace(os.sep, '_')}.pt"


@dataclass
class SignedCheckpoint(Checkpoint):
    """A trial's checkpoint that also resumes a state signed as an older version of ablate signed
    the same trial (with its legacy fingerprint, :func:`~.ledger.fingerprints`); it saves under
    the current signature."""

    older: tuple[str, ...] = ()

    def load(self) -> dict[str, Any] | None:
        for signature in (self.signature, *self.older):
            state = Checkpoint(self.path, signature, self.every_s).load()
            if state is not None:
                return state
        return None


@dataclass
class Config:
    """What one variant's trials are trained with (searched parameters and matching applied)."""

    study: Study
    variant: Variant
    params: dict[str, Any] = field(default_factory=dict)
    matched: matching.Matched | None = None


@dataclass(frozen=True)
class Pruned:
    """A search trial the pruner stopped (recorded as PRUNED)."""

    message: str


@dataclass(frozen=True)
class Failed:
    """A trial that could not finish (recorded as FAIL with its reason)."""

    reason: str


class TaskData:
    """The study's data, loaded on first use: a study whose trials are all complete never loads it.
    ``on_load`` hears of the data once it is loaded (the driver records its summary)."""

    def __init__(self, study: Study, on_load: Callable[[Any], None] | None = None):
        self.study, self.task = study, study.task
        self.on_load = on_load

    @cached_property
    def _loaded(self) -> tuple[Any, int]:
        fault_point("load")  # test hook
        data = self.task.load()
        preflight(self.study, data)  # every variant's size and first forward pass with these data
        if self.on_load:
            self.on_load(data)
        return data, self.task.max_len(data)

    @property
    def loaded(self) -> bool:
        return "_loaded" in self.__dict__

    def get(self) -> Any:
        return self._loaded[0]

    def max_len(self) -> int:
        return self._loaded[1]


# Seconds between two checks that the study's MLflow run is RUNNING while this worker trains.
STUDY_RECHECK_S = 60.0


class Execution:
    """Trains trials for one worker and records them in MLflow and Optuna."""

    def __init__(
        self,
        study: Study,
        output_dir: Path,
        tracker: Tracker,
        parent: str,
        reporter: Reporter,
        data: TaskData,
        worker_id: str,
        checkpoint_s: float,
    ):
        self.study, self.output_dir = study, output_dir
        self.tracker, self.parent = tracker, parent  # the study's MLflow run, parent of the trials'
        self.reporter, self.data = reporter, data
        self.worker_id, self.checkpoint_s = worker_id, checkpoint_s
        self.device = resolve_device(study.spec.train.device)
        self._study_opened_at = -math.inf
        self._pack_sizes: dict[str, int] = {}

    def pack_size(self, variant: str, most: int, measure: bool = True) -> int | None:
        """``train.pack`` for this worker's final trials of ``variant`` (at most ``most``): under
        ``auto`` on a GPU measured once per variant (:mod:`ablate.training.packsize`), said in a
        line; None where that is still to do and ``measure`` is False (the caller holds the lock)."""
        if variant not in self._pack_sizes:
            measured = functools.partial(self._measured, variant, most, measure)  # where auto meets a GPU
            size = pack_size(self.study, self.device, measured)
            if size is None:
                return None
            self._pack_sizes[variant] = size
        return self._pack_sizes[variant]

    def _measured(self, variant: str, most: int, measure: bool) -> int | None:
        if not measure:
            return None
        if self.study.task.runs_trials or variant not in self.study.variants:
            return 1
        spec = self.study.variants[variant]
        size, timings = measure_pack_size(self.study, spec, self.data.get(), self.device, most)
        rates = ", ".join(f"{t.rate:.3g} at {t.members}" for t in timings) or "its model does not stack"
        print(f"train.pack auto: {variant}'s seeds {size} a pack (member-steps/s {rates})", file=sys.stderr)
        return size

    def start_run(
        self,
        job: Job,
        cfg: Config,
        extra_tags: dict[str, str],
        params: dict[str, Any],
        supersede: bool = True,
    ) -> str:
        """Open the trial's MLflow run; returns its id. ``supersede``: look for runs of the same key
        to close first (False only where the queue shows that no other trial of it ever ran)."""
        base = self.study.variants[self.study.spec.report.baseline]
        # A (variant, seed) is trained by one worker at a time: any run of it still open, or
        # finished by a worker that died before telling Optuna, is superseded now.
        index, value = job.index
        if supersede:
            self.tracker.close_unfinished(job.variant, value, role=job.role, key=index)
        # A resumed study's run is RUNNING again; checked once a minute, not per trial (a worker
        # stopped while this one was between trials may have closed it meanwhile).
        if time.monotonic() - self._study_opened_at > STUDY_RECHECK_S:
            self.tracker.open_study(self.parent)
            self._study_opened_at = time.monotonic()
        settings = trained_with(cfg.study, job.variant)  # kept with the run: a reuse checks its fingerprint
        tags = {
            "variant": job.variant,
            "seed": str(job.seed),
            "differs": cfg.variant.differs_from(base),
            "device": self.device.type,
            "ablate.worker": self.worker_id,
            "ablate.fingerprint": fingerprint_of(settings),
            **extra_tags,
            **{f"component.{s}": label for s, label in cfg.variant.components().items()},
        }
        if not cfg.study.task.runs_trials:  # ablate's training loop: its precision (a script keeps its own)
            tags[PRECISION_TAG] = precision_name(cfg.study.spec.train.precision, self.device)
        loss = cfg.study.loss.model_dump(mode="json")  # resolved: its kind and defaults spelt out
        # Flattened by the tracker: model.attention.heads, train.loss.kind, … (search.* and match.*
        # keys are dotted already and stay whole).
        run_params = {
            "variant": job.variant,
            "seed": job.seed,
            "model": model_settings(cfg.variant),
            "train": {**cfg.study.spec.train.model_dump(mode="json"), "loss": loss},
            **{f"search.{k}": v for k, v in params.items()},
            **(cfg.matched.record() if cfg.matched else {}),
        }
        run_id = self.tracker.start_trial(self.parent, job.stem("/"), tags, run_params, role=job.role)
        self.tracker.attach_text(run_id, json.dumps(settings, sort_keys=True, default=str), TRAINED_WITH)
        return run_id

    def checkpoint(self, job: Job, study: Study) -> Checkpoint:
        """Where the trial keeps its mid-training state, signed with what it trains."""
        current, *older = (
            f"{signed}/seed{job.seed}/batch{study.spec.train.batch_size}"
            for signed in fingerprints(study, job.variant)
        )
        path = checkpoint_path(self.output_dir, job)
        return SignedCheckpoint(path, current, every_s=self.checkpoint_s, older=tuple(older))

    def train(self, job: Job, cfg: Config, run_id: str, trial: optuna.Trial) -> TrialResult | Pruned | Failed:
        """Train the trial (pruned, for a search trial, when the pruner says so). A pruned or
        failed trial is recorded here; a finished one is the caller's to record."""
        metric = f"valid.{self.study.metrics[0]}"

        def log_epoch(epoch: int, logged: dict[str, float]) -> bool:
            """Log one epoch's metrics; True when the search's pruner stops this trial."""
            self.tracker.log_metrics(run_id, logged, step=epoch)
            primary = logged.get(metric)
            if primary is not None and math.isfinite(primary):
                trial.report(primary, epoch)
                if job.prunes and trial.should_prune():
                    return True
            self.reporter.epoch(epoch, logged)
            fault_point("train")
            return False

        def on_epoch(epoch: int, logged: dict[str, float]) -> None:
            if log_epoch(epoch, logged):
                raise optuna.TrialPruned(f"pruned at epoch {epoch}")

        study, batch = cfg.study, cfg.study.spec.train.batch_size
        checkpoint = self.checkpoint(job, study)
        for attempt in (1, 2):
            try:
                if study.task.runs_trials:
                    result = own_trial(study, cfg.variant, job.seed, self.device, log_epoch, checkpoint)
                else:
                    result = train_trial(
                        study,
                        cfg.variant,
                        job.seed,
                        self.data.get(),
                        self.device,
                        on_epoch=on_epoch,
                        on_step=self.reporter.step,
                        checkpoint=checkpoint,
                    )
                if result.resumed_from:
                    self.tracker.set_tags(run_id, {"ablate.resumed_from_epoch": str(result.resumed_from)})
                return result
            except optuna.TrialPruned as exc:
                checkpoint.remove()
                self.tracker.fail_trial(run_id, "pruned", status="KILLED")
                trial.study.tell(trial, state=TrialState.PRUNED)
                return Pruned(str(exc))
            except torch.OutOfMemoryError as exc:
                _free_accelerator()
                checkpoint.remove()
                if attempt == 1 and batch > 1:
                    batch //= 2
                    study, _ = study.with_params(job.variant, {"train.batch_size": batch})
                    checkpoint = self.checkpoint(job, study)
                    self.tracker.set_tags(run_id, {"ablate.oom_retry": f"batch size {batch}"})
                    trial.set_user_attr("oom_retry_batch_size", batch)
                    continue
                reason = (
                    f"out of memory at batch size {batch} (after a retry at half the batch size)"
                    if attempt == 2
                    else f"out of memory at batch size {batch}: {str(exc).splitlines()[0]}"
                )
                return self.fail(job, trial, run_id, reason)
            except Exception as exc:  # noqa: BLE001 - a crashing variant fails alone; the study goes on
                if store_failure(exc):  # the disk or a store, not the variant: left running, retrained
                    raise  # on the next run (its checkpoint kept), the run stopped in one line
                checkpoint.remove()  # a retry starts afresh (e.g. after the code was fixed)
                return self.fail(job, trial, run_id, failure_reason(exc))
            except BaseException:
                # Ctrl-C: leave a clean record; the next run re-queues this trial.
                trial.set_user_attr("failure", INTERRUPTED)
                self.tracker.fail_trial(run_id, INTERRUPTED, status="KILLED")
                trial.study.tell(trial, state=TrialState.FAIL)
                raise
        raise AssertionError("unreachable")  # pragma: no cover - the second attempt returns

    def train_packed(
        self, jobs: list[Job], cfg: Config, run_ids: list[str], trials: list[optuna.Trial]
    ) -> list[TrialResult | Failed]:
        """Train final trials of one variant as one pack (:func:`~ablate.training.packed.train_packed`),
        each recorded as :meth:`train` records a trial alone: its epochs in its run, its checkpoint,
        its failure its own. A member that runs out of memory trains again alone (:meth:`train`, with
        its retry at half the batch size); a stop ends every member, each recorded as interrupted."""
        study, metric = cfg.study, f"valid.{self.study.metrics[0]}"
        checkpoints = [self.checkpoint(job, study) for job in jobs]
        packed_with = ",".join(str(job.seed) for job in jobs)

        def logger(run_id: str, trial: optuna.Trial) -> Callable[[int, dict[str, float]], None]:
            def on_epoch(epoch: int, logged: dict[str, float]) -> None:
                self.tracker.log_metrics(run_id, logged, step=epoch)
                primary = logged.get(metric)
                if primary is not None and math.isfinite(primary):
                    trial.report(primary, epoch)
                self.reporter.epoch(epoch, logged)
                fault_point("train")

            return on_epoch

        for run_id in run_ids:
            self.tracker.set_tags(run_id, {PACK_TAG: packed_with})
        try:
            outcomes = train_packed(
                study,
                cfg.variant,
                [job.seed for job in jobs],
                self.data.get(),
                self.device,
                on_epoch=[logger(r, t) for r, t in zip(run_ids, trials, strict=True)],
                on_step=self.reporter.step,
                checkpoints=checkpoints,
            )
        except BaseException:
            # Ctrl-C: clean records, each trial re-queued by the next run.
            for run_id, trial in zip(run_ids, trials, strict=True):
                trial.set_user_attr("failure", INTERRUPTED)
                self.tracker.fail_trial(run_id, INTERRUPTED, status="KILLED")
                trial.study.tell(trial, state=TrialState.FAIL)
            raise
        results: list[TrialResult | Failed] = []
        held = zip(jobs, run_ids, trials, checkpoints, outcomes, strict=True)
        for job, run_id, trial, checkpoint, outcome in held:
            if isinstance(outcome, torch.OutOfMemoryError):
                _free_accelerator()
                checkpoint.remove()
                results.append(self.train(job, cfg, run_id, trial))
            elif isinstance(outcome, Exception):
                checkpoint.remove()  # a retry starts afresh, as a failed trial alone
                results.append(self.fail(job, trial, run_id, failure_reason(outcome)))
            else:
                if outcome.resumed_from:
                    self.tracker.set_tags(run_id, {"ablate.resumed_from_epoch": str(outcome.resumed_from)})
                results.append(outcome)
        return results

    def finish(self, run_id: str, result: TrialResult) -> None:
        """Log a finished trial's metrics and per-unit results and close its run."""
        self.tracker.finish_trial(run_id, {**result.summary, **result.costs()}, result.per_unit)

    def fail(self, job: Job, trial: optuna.Trial, run_id: str, reason: str) -> Failed:
        trial.set_user_attr("failure", reason)
        self.tracker.fail_trial(run_id, reason)
        trial.study.tell(trial, state=TrialState.FAIL)
        self.reporter.failed(job.variant, job.seed, reason)
        return Failed(reason)


def model_settings(variant: Variant) -> dict[str, Any]:
    """The variant's model settings with each component's options resolved, defaults included
    (``attention: {kind: softmax, heads: 1, …}``), as recorded with its trial runs."""
    settings = variant.spec.model_dump(mode="json")
    for slot in COMPONENT_SLOTS:
        held = settings[slot]
        spelt = held if isinstance(held, list) else [held]
        parts = variant.parts(slot)
        resolved = [{**s, **p.options.model_dump(mode="json")} for s, p in zip(spelt, parts, strict=True)]
        settings[slot] = resolved if isinstance(held, list) else resolved[0]
    return settings


def failure_reason(exc: Exception) -> str:
    """A failed trial's reason: a :class:`TrialFailed`'s message, else the error's kind and first line."""
    if isinstance(exc, TrialFailed):
        return str(exc)
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {message}".rstrip(": ")


def _free_accelerator() -> None:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()

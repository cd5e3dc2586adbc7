"""A worker's final trials: one (variant, seed) opened as an MLflow run, copied from a donor or
trained (alone, or with the queued seeds of its variant as one pack, ``train.pack``), then logged
and told to Optuna. Part of :class:`~.driver.Driver`, kept apart so that each file reads whole.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import optuna

from ablate.drive.donor import Donor
from ablate.drive.execution import Config, Failed, Job
from ablate.drive.ledger import DATA_DIGEST, fingerprint
from ablate.faults import fault_point
from ablate.training.trainer import TrialResult

if TYPE_CHECKING:  # pragma: no cover
    from ablate.drive.queue import Queue


class FinalTrials:
    """The driver's steps for a final trial; the driver holds what they use (its study, queues,
    tracker, execution, donors, reporter and summary)."""

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
        attrs = {"fingerprint": fingerprint(cfg.study, job.variant)}
        tags = {"trial": str(trial.number)}
        if self.data_digest:
            attrs[DATA_DIGEST] = self.data_digest
            tags[f"ablate.{DATA_DIGEST}"] = self.data_digest
        attrs = {k: v for k, v in attrs.items() if trial.user_attrs.get(k) != v}  # as the claim read them
        if attrs:  # (the fingerprint was queued with the trial: a call saved, through a proxy a round trip)
            self.final.set_attrs(trial, attrs)
        # A trial whose key no other trial had at the last whole read of the queue (it waited
        # there, never ran) can have left no MLflow run to supersede: no search for one.
        fresh = trial.number in self._fresh
        self._fresh.discard(trial.number)
        run_id = self.execution.start_run(job, cfg, tags, cfg.params, supersede=not fresh)
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
        queue.set_attrs(trial, {**outcome.summary, "wall_s": outcome.wall_s})
        fault_point("tell")  # test hook: MLflow says FINISHED, Optuna does not know yet
        queue.study.tell(trial, self._primary(outcome))
        if donor is not None:
            self.summary.reused += 1
            self.reporter.reused(job.variant, job.seed, outcome, donor.source)
        else:
            self.summary.finished += 1
            self.reporter.finished(job.variant, job.seed, outcome)

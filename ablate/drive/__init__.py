"""The study driver: Optuna queues per ablation study, one trial per (variant, seed).

Exactly once, across any number of worker processes:

* every enqueue happens under a queue lock (a file lock on one host); on shared databases,
  where two hosts may enqueue the same key, the higher-numbered duplicate steps aside when asked;
* a trial RUNNING for a worker that is gone is failed as "interrupted" and enqueued again: on
  one host a worker is alive while it holds its lock file in ``workers/``; on a database shared
  by many machines Optuna's heartbeat finds it (``RetryHeartbeatStaleTrialCallback``), and
  behind Optuna's gRPC proxy the worker's own mark of life (:mod:`.proxy`);
* a trial is taken by one conditional update of its state (WAITING → RUNNING): two workers
  never hold the same one;
* MLflow runs of a (variant, seed) left RUNNING, or FINISHED by a worker killed before it told
  Optuna, are closed as KILLED when the key is trained again, so the report sees one per key.

Modules: :mod:`.stores` (where the queues and results live, local or shared; :mod:`.journal`
checks a journal file as it opens; :mod:`.proxy`, Optuna's gRPC storage proxy), :mod:`.ledger`
(planned trials and their states), :mod:`.queue` (a take whose cost does not grow with the
study), :mod:`.execution` (training one trial), :mod:`.driver` (the
worker loop), :mod:`.reuse` (finished trials copied from another study's store or trial files), :mod:`.status`
(progress and ETA). It imports ``training``, ``tracking`` and the layers below them; never the
report or the commands.
"""

from ablate.drive.driver import Driver, RunSummary
from ablate.drive.ledger import plan
from ablate.drive.reporter import Reporter
from ablate.drive.reuse import Donors, write_trials
from ablate.drive.start import prepare, run_study
from ablate.drive.status import (
    VariantStatus,
    checkpointed_fractions,
    eta_seconds,
    progress,
    projected_walls,
    status_table,
)
from ablate.drive.stores import Stores
from ablate.study.folders import folder_problem

__all__ = [
    "Donors",
    "Driver",
    "Reporter",
    "RunSummary",
    "Stores",
    "VariantStatus",
    "checkpointed_fractions",
    "eta_seconds",
    "projected_walls",
    "folder_problem",
    "plan",
    "prepare",
    "progress",
    "run_study",
    "status_table",
    "write_trials",
]

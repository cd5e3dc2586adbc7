"""A trial of a task that trains its own model (:meth:`~ablate.tasks.Task.run_trial`, the
``function`` task): its epochs logged as ablate's own trials log theirs, its states kept in the
trial's signed checkpoint, its costs measured alike."""

from __future__ import annotations

import copy
import hashlib
import shutil
import time
from collections.abc import Callable, Mapping
from typing import Any

import optuna
import pandas as pd
import torch

from ablate.model.variant import Variant
from ablate.study.load import Study
from ablate.tasks import TrialReporter
from ablate.training.checkpoints import Checkpoint
from ablate.training.memory import PeakMemory
from ablate.training.trainer import TrialFailed, TrialResult, seed_everything

# Logs one epoch's metrics; True when a search's pruner stops the trial.
LogEpoch = Callable[[int, dict[str, float]], bool]


class OwnTrialReporter(TrialReporter):
    """The :class:`~ablate.tasks.TrialReporter` of a trial whose task trains its own model: epochs
    logged as ablate's own trials log theirs (``log_epoch``: MLflow, the pruner, the progress
    bars), states kept in the trial's signed :class:`Checkpoint` (a changed configuration or seed
    never resumes another's state)."""

    def __init__(
        self, seed: int, device: torch.device, checkpoint: Checkpoint, log_epoch: LogEpoch, epochs: int
    ):
        self.seed, self.device = seed, str(device)
        self.checkpoint, self.log_epoch, self.epochs = checkpoint, log_epoch, epochs
        signed = hashlib.sha256(checkpoint.signature.encode()).hexdigest()[:12]
        self.checkpoint_path = checkpoint.path.with_name(f"{checkpoint.path.stem}.{signed}.own")
        self.checkpoint_path.parent.mkdir(parents=True, exist_ok=True)
        self.curves: list[tuple[int, str, float]] = []
        self.pruned_at: int | None = None
        self.resumed_from = 0

    def report(self, epoch: int, metrics: dict[str, float]) -> None:
        values = {str(key): float(value) for key, value in metrics.items()}
        self.curves += [(int(epoch), key, value) for key, value in values.items()]
        if self.pruned_at is None and self.log_epoch(int(epoch), values):
            self.pruned_at = int(epoch)

    def should_prune(self) -> bool:
        return self.pruned_at is not None

    def save_state(self, state: dict[str, Any]) -> None:
        epoch = max((e for e, _, _ in self.curves), default=0)
        self.checkpoint.save({"own": state, "curves": self.curves, "epoch": epoch, "epochs": self.epochs})

    def resume_state(self) -> dict[str, Any] | None:
        saved = self.checkpoint.load()
        if saved is None or "own" not in saved:
            return None
        self.curves = []
        for epoch in sorted({e for e, _, _ in saved["curves"]}):  # a new MLflow run gets the whole curve
            self.report(epoch, {key: value for e, key, value in saved["curves"] if e == epoch})
        self.resumed_from = saved["epoch"]
        return saved["own"]

    def discard(self) -> None:
        """Forget the trial's states and its own checkpoint: it ended, or starts afresh."""
        self.checkpoint.remove()
        if self.checkpoint_path.is_dir():
            shutil.rmtree(self.checkpoint_path, ignore_errors=True)
        else:
            self.checkpoint_path.unlink(missing_ok=True)


def own_trial(
    study: Study,
    variant: Variant,
    seed: int,
    device: torch.device,
    log_epoch: LogEpoch,
    checkpoint: Checkpoint,
) -> TrialResult:
    """A trial of a task that trains its own model (:meth:`~ablate.tasks.Task.run_trial`), given
    the variant's ``model.config``, the seed (the global RNGs seeded with it) and a reporter; the
    costs ablate measures of its own trials (wall and CPU time, peak memory) measured alike.
    Raises :class:`TrialFailed` for metrics missing from what it returns, ``optuna.TrialPruned``."""
    reporter = OwnTrialReporter(seed, device, checkpoint, log_epoch, study.spec.train.epochs)
    start, cpu_start = time.perf_counter(), time.process_time()
    seed_everything(seed)
    try:
        with PeakMemory(device) as memory:
            returned = study.task.run_trial(copy.deepcopy(variant.spec.config), seed, reporter)
        if reporter.pruned_at is not None:
            raise optuna.TrialPruned(f"pruned at epoch {reporter.pruned_at}")
        summary = finished_metrics(returned, study.metrics)
    except torch.OutOfMemoryError as exc:  # its batch size is its own: nothing for ablate to halve
        reporter.discard()
        raise TrialFailed(f"out of memory: {str(exc).strip().splitlines()[0]}") from exc
    except Exception:  # a failed or pruned trial starts afresh when retried
        reporter.discard()
        raise
    reporter.discard()
    epochs = max((e for e, _, _ in reporter.curves), default=0)
    return TrialResult(
        summary=summary,
        per_unit=pd.DataFrame(),
        curves=reporter.curves,
        peak_memory_mb=memory.mb,
        wall_s=time.perf_counter() - start,
        cpu_s=time.process_time() - cpu_start,
        epochs=epochs,
        resumed_from=reporter.resumed_from,
    )


def finished_metrics(returned: Any, metrics: list[str]) -> dict[str, float]:
    """The metrics a trial of one's own returned, as numbers; raises :class:`TrialFailed` where one
    the study names (``valid.<metric>``, ``test.<metric>``) is missing or not a number."""
    if not isinstance(returned, Mapping):
        kind = type(returned).__name__
        raise TrialFailed(f"the training function returned {kind}, not a mapping of metrics")
    summary = {}
    for key, value in returned.items():
        try:
            summary[str(key)] = float(value)
        except (TypeError, ValueError):
            raise TrialFailed(f"metric {key!r} is not a number: {value!r}") from None
    wanted = [f"{split}.{metric}" for metric in metrics for split in ("valid", "test")]
    missing = [key for key in wanted if key not in summary]
    if missing:
        given = ", ".join(summary) or "nothing"
        raise TrialFailed(f"the training function returned no {', '.join(missing)} (it returned {given})")
    return summary

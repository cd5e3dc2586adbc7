"""A trial of a task that trains its own model (:meth:`~ablate.tasks.Task.run_trial`, the
``function`` task): its epochs logged as ablate's own trials log theirs, its states kept in the
trial's signed checkpoint, its costs measured alike."""

from __future__ import annotations

import contextlib
import copy
import gc
import hashlib
import math
import multiprocessing
import os
import pickle
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import optuna
import pandas as pd
import torch

from ablate import stopping
from ablate.model.variant import Variant
from ablate.study.load import Study
from ablate.tasks import PER_UNIT_KEY, TrialReporter
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


# A clean process (no CUDA context, no threads) forked for each trial: what the code does there —
# sys.exit, os._exit, a signal, a hang, parsing sys.argv — ends that trial, not the run.
CHILDREN = multiprocessing.get_context("forkserver")

# Seconds a trial's process has to end after SIGTERM before it is killed.
TERM_GRACE_S = 5.0


def own_trial(
    study: Study,
    variant: Variant,
    seed: int,
    device: torch.device,
    log_epoch: LogEpoch,
    checkpoint: Checkpoint,
) -> TrialResult:
    """A trial of a task that trains its own model (:meth:`~ablate.tasks.Task.run_trial`), given
    the variant's ``model.config``, the seed (the global RNGs seeded with it) and a reporter, run in
    a child process (:data:`CHILDREN`) whose epochs are logged here; the costs ablate measures of
    its own trials (wall and CPU time, peak memory) measured alike. Raises :class:`TrialFailed`
    for metrics missing or not finite, for an exception, an exit or a signal that ended the code;
    ``optuna.TrialPruned``; ``KeyboardInterrupt`` (the process terminated) when a stop is asked for."""
    start = time.perf_counter()
    payload = pickle.dumps(
        (
            study.task,
            copy.deepcopy(variant.spec.config),
            seed,
            str(device),
            checkpoint,
            study.spec.train.epochs,
        )
    )
    setting = (list(sys.path), os.getcwd(), dict(os.environ), study.metrics)
    # Imported once, where each trial's process is forked from (read when that server starts).
    # torch._dynamo too: torch's optimizers import it at their first use (torch._compile), which
    # took 1.9 s of each trial's process on a 2-core machine (examples/item_scores: 0.05 s after).
    preload = [__name__, type(study.task).__module__, type(checkpoint).__module__, "torch._dynamo"]
    CHILDREN.set_forkserver_preload(preload)
    here, there = CHILDREN.Pipe()
    alive, lifeline = CHILDREN.Pipe(duplex=False)
    child = _started(
        CHILDREN.Process(target=_child_trial, args=(there, alive, setting, payload), daemon=True)
    )
    there.close()
    alive.close()
    try:
        outcome = _relay(child, here, log_epoch)
    finally:
        _end(child)
        lifeline.close()
        here.close()
    if outcome is None:
        code = child.exitcode
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with status {code}"
        raise TrialFailed(f"the training code's process {how} before it returned its metrics")
    if outcome[0] == "failed":
        raise TrialFailed(outcome[1])
    _, summary, curves, pruned_at, resumed_from, peak_mb, cpu_s, per_unit = outcome
    if pruned_at is not None:
        raise optuna.TrialPruned(f"pruned at epoch {pruned_at}")
    return TrialResult(
        summary=summary,
        per_unit=per_unit,
        curves=curves,
        peak_memory_mb=peak_mb,
        wall_s=time.perf_counter() - start,
        cpu_s=cpu_s,
        epochs=max((e for e, _, _ in curves), default=0),
        resumed_from=resumed_from,
    )


def _started(child: Any) -> Any:
    """``child`` started from the fork server. A stop signal sent to the whole job (SLURM's
    ``scancel``, a process group's Ctrl-C) also ends the server, whose pipe then closes before
    this process has handled its own signal: the stop wins (``KeyboardInterrupt``, the trial is
    interrupted, not failed); a server lost otherwise is started again, once."""
    for attempt in range(2):
        try:
            with _main_unseen():
                child.start()
            return child
        except (EOFError, ConnectionError) as exc:
            stopping.sleep(1.0)  # the signal's handler runs; a stop raises here
            if attempt:
                raise TrialFailed(f"the training code's process could not start: {exc}") from None
    return child


@contextlib.contextmanager
def _main_unseen() -> Iterator[None]:
    """A trial's process started without the parent's ``__main__``, which multiprocessing would run
    there again: a script calling ``ablate.run`` without an ``if __name__ == "__main__"`` guard."""
    main = sys.modules["__main__"].__dict__
    saved = {key: main[key] for key in ("__file__", "__spec__") if key in main}
    main.pop("__file__", None)
    main["__spec__"] = None
    try:
        yield
    finally:
        main.pop("__spec__", None)
        main.update(saved)


def _relay(child: Any, here: Any, log_epoch: LogEpoch) -> tuple | None:
    """Log the child's epochs (answering whether it is pruned) until it sends its outcome; None
    when it ended without one. A stop asked for here ends it (``KeyboardInterrupt``)."""
    while True:
        stopping.check()
        if here.poll(0.1):
            try:
                message = here.recv()
            except EOFError:
                return None
            if message[0] != "epoch":
                return message
            here.send(log_epoch(*message[1:]))
        elif not child.is_alive() and not here.poll(0):
            return None


def _end(child: Any) -> None:
    """SIGTERM to a trial's process still running, SIGKILL after :data:`TERM_GRACE_S`."""
    if child.is_alive():
        child.terminate()
        child.join(TERM_GRACE_S)
    if child.is_alive():
        child.kill()
    child.join()


def _child_trial(there: Any, alive: Any, setting: tuple, payload: bytes) -> None:
    """The trial's process: the parent's paths, folder and environment, then the task's code; its
    outcome sent back as ("done", summary, curves, pruned_at, resumed_from, peak MB, CPU s, the
    test units' scores) or
    ("failed", reason). It ends when the parent does (the lifeline closes)."""
    # What the fork server imported (torch, ablate) is no trial's garbage: left out of the
    # collection PeakMemory starts with, which walked it and copied its pages, 0.32 s a trial.
    gc.freeze()
    path, cwd, environ, metrics = setting
    sys.path[:], sys.argv = path, [sys.argv[0]]
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(environ)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    threading.Thread(target=_exit_with_parent, args=(alive,), daemon=True).start()

    def log_epoch(epoch: int, values: dict[str, float]) -> bool:
        try:
            there.send(("epoch", epoch, values))
            return there.recv()
        except (EOFError, OSError):  # the parent is gone: end here, the saved state kept for a resume
            os._exit(1)

    try:
        task, config, seed, device, checkpoint, epochs = pickle.loads(payload)
        reporter = OwnTrialReporter(seed, torch.device(device), checkpoint, log_epoch, epochs)
        cpu_start = time.process_time()
        seed_everything(seed)
        with PeakMemory(torch.device(device)) as memory:
            returned = task.run_trial(config, seed, reporter)
        units = returned.pop(PER_UNIT_KEY, None) if isinstance(returned, dict) else None
        summary = finished_metrics(returned, metrics) if reporter.pruned_at is None else {}
        per_unit = unit_scores(units, summary) if reporter.pruned_at is None else pd.DataFrame()
        outcome = ("done", summary, reporter.curves, reporter.pruned_at, reporter.resumed_from)
        outcome += (memory.mb, time.process_time() - cpu_start, per_unit)
        reporter.discard()
    except torch.OutOfMemoryError as exc:  # its batch size is its own: nothing for ablate to halve
        outcome = ("failed", f"out of memory: {str(exc).strip().splitlines()[0]}")
    except TrialFailed as exc:
        outcome = ("failed", str(exc))
    except SystemExit as exc:
        outcome = (
            "failed",
            f"the training code called sys.exit({exc.code!r}) before it returned its metrics",
        )
    except BaseException as exc:  # noqa: BLE001 - whatever ended the code, one line for its trial
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        outcome = ("failed", f"{type(exc).__name__}: {message}".rstrip(": "))
    if outcome[0] == "failed":  # a failed trial starts afresh when retried
        OwnTrialReporter(seed, torch.device(device), checkpoint, log_epoch, epochs).discard()
    there.send(outcome)


def _exit_with_parent(alive: Any) -> None:
    try:
        alive.recv_bytes()
    except (EOFError, OSError):
        os._exit(1)


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
        if not math.isfinite(summary[str(key)]):  # a NaN or ∞ would be a finished trial no report can read
            raise TrialFailed(f"metric {key!r} is {summary[str(key)]}, not a finite number")
    wanted = [f"{split}.{metric}" for metric in metrics for split in ("valid", "test")]
    missing = [key for key in wanted if key not in summary]
    if missing:
        given = ", ".join(summary) or "nothing"
        raise TrialFailed(f"the training function returned no {', '.join(missing)} (it returned {given})")
    return summary


def unit_scores(units: Any, summary: dict[str, float]) -> pd.DataFrame:
    """The test units' scores a trial of one's own returned (metric → {unit id: score}) as the
    per-unit table (``unit`` and a column per metric); raises :class:`TrialFailed` for another
    shape, a score that is not a finite number, or metrics scored on different units."""
    if units is None:
        return pd.DataFrame()
    shape = f"{PER_UNIT_KEY!r} must map each metric to {{unit id: score}}"
    if not isinstance(units, Mapping) or not all(isinstance(v, Mapping) for v in units.values()):
        raise TrialFailed(f"the training function's {shape}; it is {type(units).__name__}")
    columns = {}
    for metric, scores in units.items():
        if f"test.{metric}" not in summary:
            raise TrialFailed(f"{PER_UNIT_KEY}: {metric!r} has unit scores but no test.{metric}")
        values = pd.to_numeric(pd.Series(scores, dtype=object), errors="coerce")
        bad = [str(u) for u, v in values.items() if not math.isfinite(v)]
        if bad:
            raise TrialFailed(
                f"{PER_UNIT_KEY}: {len(bad)} score(s) of {metric!r} not finite numbers, units {bad[:5]}"
            )
        columns[str(metric)] = values.astype(float)
    units_of = {metric: set(map(str, col.index)) for metric, col in columns.items()}
    if len({frozenset(u) for u in units_of.values()}) > 1:
        raise TrialFailed(f"{PER_UNIT_KEY}: the metrics are scored on different units")
    frame = pd.DataFrame(columns)
    return frame.rename_axis("unit").reset_index().astype({"unit": str})

"""A running study's progress: the trial bar (with an ETA) and the epoch bar in a terminal, and
one line per finished trial, failed trial and search trial, printed as each ends (above the
bars, or alone in a log, where no bars are drawn). ``ablate run --workers N`` follows the shared
store instead of a trial loop of its own (:class:`StoreWatch`)."""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path
from statistics import mean

import optuna
from optuna.trial import TrialState
from rich.markup import escape
from rich.progress import Progress
from rich.table import Table

from ablate.commands.console import duration, say, trial_line
from ablate.drive import (
    Reporter,
    Stores,
    checkpointed_fractions,
    eta_seconds,
    progress,
    projected_walls,
    status_table,
)
from ablate.drive.ledger import key_of
from ablate.study.load import Study
from ablate.study.overrides import changes_training
from ablate.study.tuning import search_budget
from ablate.training.trainer import TrialResult, checkpoint_summaries

HEARTBEAT_S = 60.0  # in a log, a line at least this often during a trial (at an epoch's end or a step)


def plan_line(study: Study, stores: Stores, report_dir: Path, workers: int = 1) -> str:
    """The line a run starts with: what it will train, and where everything goes."""
    variants, seeds = len(study.variants), len(study.spec.seed_list)
    design = study.spec.sequential
    trials = f"up to {variants * design.max}" if design else f"{variants * seeds}"
    searched = search_budget(study) if study.spec.search.enabled else 0
    search = f", after {searched} search trials per variant" if searched else ""
    who = f"{workers} workers" if workers > 1 else "this process"
    named = next(filter(changes_training, study.overrides), None)
    own = f"study {study.name} (its own: {named} changes what trials train), " if named else ""
    train = study.spec.train
    # A task that trains its own model runs the epochs its own settings say, not train.epochs.
    epochs = (
        "each trained by the task's own code"
        if study.task.runs_trials
        else f"{'up to ' if train.patience else ''}{train.epochs} epochs each"
    )
    return (
        f"plan: {own}{variants} variants × {seeds} seeds = {trials} trials{search}, {epochs}, in {who}; "
        f"output {stores.output_dir} "
        f"(MLflow {stores.tracking_uri}, Optuna {stores.optuna_url}); report {report_dir}"
    )


class TrialLog:
    """The trial bar and the lines: finished (and failed) trials counted against the plan."""

    def __init__(self, study: Study, bars: Progress, quiet: bool, label: str = "trials"):
        self.bars, self.quiet = bars, quiet
        self.metric = study.metrics[0]
        self.task = bars.add_task(label, total=None, eta="")
        self.total = self.done = 0
        self.walls: list[float] = []  # of the trials trained while watching
        self.copied_walls: list[float] = []  # of trials copied (--reuse): the donors', until one is trained
        self.last_line = time.monotonic()  # when this log last said something

    def plan(self, total: int, done: int) -> None:
        self.total, self.done = total, done
        self.bars.update(self.task, total=total, completed=done)

    def finished(
        self,
        what: str,
        summary: dict[str, float],
        wall: float,
        eta: float | None = None,
        copied: bool = False,
    ) -> None:
        """One trial done (``copied``: from a donor, ``wall`` its); ``eta`` as known to the
        caller, else the mean wall time × trials left."""
        self.done += 1
        (self.copied_walls if copied else self.walls).append(wall)
        eta = self._show(eta)
        value = summary.get(f"test.{self.metric}")
        self.say(trial_line(self.done, self.total, what, self.metric, value, wall, eta))

    def failed(self, what: str, reason: str, eta: float | None = None) -> None:
        self.done += 1
        eta = self._show(eta)
        left = max(self.total - self.done, 0)
        later = f"  ETA {duration(eta)}" if eta is not None and left else ""
        self.say(f"trial {self.done}/{self.total} failed: {what}: {reason}  {left} left{later}")

    def searched(self, what: str, summary: dict[str, float], wall: float | None = None) -> None:
        value = summary.get(f"valid.{self.metric}")
        shown = f"  valid {self.metric} {value:.4f}" if value is not None else ""
        self.say(f"search trial done: {what}{shown}{f'  wall {wall:.1f} s' if wall else ''}")

    def search_failed(self, what: str, reason: str) -> None:
        self.say(f"search trial failed: {what}: {reason}")

    def _show(self, eta: float | None) -> float | None:
        """Advance the bar and show the ETA (the given one, else mean wall time × trials left)."""
        if eta is None and (walls := self.walls or self.copied_walls):
            eta = mean(walls) * max(self.total - self.done, 0)
        shown = f"ETA {duration(eta)}" if eta is not None and self.done < self.total else ""
        self.bars.update(self.task, completed=self.done, eta=shown)
        return eta

    def say(self, line: str) -> None:
        if not self.quiet:
            say(line)
            self.last_line = time.monotonic()


class BarReporter(Reporter):
    """This process's trials: the trial bar and lines (:class:`TrialLog`), the current trial's epochs."""

    def __init__(self, study: Study, bars: Progress, quiet: bool):
        self.log = TrialLog(study, bars, quiet)
        self.bars = bars
        self.variants = set(study.variants)
        self.epochs = None
        self.label = ""
        self.searching = False
        # Where no bars are drawn (a log), a heartbeat line now and then during a trial.
        self.heartbeat = not quiet and bars.disable
        self.planned_epochs, self.epoch_done = 0, 0
        self.started = self.last_line = time.monotonic()

    def study(self, total: int, done: int) -> None:
        self.log.plan(total, done)

    def trial(self, variant: str, seed: int, epochs: int) -> None:
        # A search trial comes labelled ("gelu-mlp · search 3/8"), a final one by its variant's name.
        self.searching = variant not in self.variants
        self.label = variant if self.searching else f"{variant} · seed {seed}"
        if self.epochs is not None:
            self.bars.remove_task(self.epochs)
        self.epochs = self.bars.add_task(self.label, total=epochs)
        self.planned_epochs, self.epoch_done = epochs, 0
        self.started = self.last_line = time.monotonic()

    def epoch(self, epoch: int, logged: dict[str, float]) -> None:
        shown = " ".join(f"{k.split('.', 1)[1]} {v:.4f}" for k, v in logged.items() if k.startswith("valid."))
        self.bars.update(self.epochs, completed=epoch, description=f"{self.label} {shown}")
        self.epoch_done = epoch
        self._beat(f"epoch {epoch}/{self.planned_epochs} done{f', valid {shown}' if shown else ''}")

    def step(self) -> None:
        self._beat(f"in epoch {self.epoch_done + 1}/{self.planned_epochs}")

    def _beat(self, where: str) -> None:
        """A heartbeat line, in a log, once :data:`HEARTBEAT_S` has passed since the last line."""
        now = time.monotonic()
        if self.heartbeat and now - self.last_line >= HEARTBEAT_S:
            self.last_line = now
            into = duration(now - self.started)
            say(f"trial {self.log.done + 1}/{self.log.total} {self.label}: {where} ({into} into the trial)")

    def finished(self, variant: str, seed: int, result: TrialResult) -> None:
        if self.epochs is not None:
            self.bars.update(self.epochs, completed=self.bars.tasks[-1].total)
        if self.searching:
            self.log.searched(variant, result.summary, result.wall_s)
        else:
            self.log.finished(f"{variant} seed {seed}", result.summary, result.wall_s)

    def reused(self, variant: str, seed: int, result: TrialResult, source: str) -> None:
        self.log.finished(
            f"{variant} seed {seed} (reused: {source})", result.summary, result.wall_s, copied=True
        )

    def failed(self, variant: str, seed: int, reason: str) -> None:
        # A search trial whose parameters do not fit fails before it starts, under its label.
        if self.searching or variant not in self.variants:
            self.log.search_failed(self.label if variant in self.variants else variant, reason)
        else:
            self.log.failed(f"{variant} seed {seed}", reason)


class StoreWatch:
    """The parent of ``ablate run --workers N``: its trial bar and lines follow the shared store
    (each poll reads it once more), since the trials train in the worker processes. In a log, a
    heartbeat line per running trial (its last finished epoch, as the worker reported it to the
    store) once :data:`HEARTBEAT_S` has passed without a line."""

    def __init__(self, study: Study, stores: Stores, bars: Progress, quiet: bool, workers: int):
        self.study, self.stores = study, stores
        self.heartbeat = not quiet and bars.disable
        self.running: list[optuna.trial.FrozenTrial] = []  # final trials in flight, as last read
        self.possible = {(v, s) for v in study.variants for s in study.spec.seed_list}
        self.storage = stores.storage()  # one handle: a journal is then read incrementally, not replayed
        self.log = TrialLog(study, bars, quiet, label=f"trials ({workers} workers)")
        rows = progress(study, stores, self.storage)
        self.before = sum(r.done for r in rows.values())
        self.seen = self._complete()
        self.failures = {(v, seed, reason) for v, r in rows.items() for seed, reason in r.failures}
        self.searched = {v: r.searched for v, r in rows.items()}
        self._plan(rows)

    def poll(self) -> None:
        rows = progress(self.study, self.stores, self.storage)
        eta = eta_seconds(rows)
        complete = self._complete()
        for key in sorted(complete.keys() - self.seen.keys(), key=lambda k: complete[k].number):
            trial = complete[key]
            wall = trial.user_attrs.get("wall_s") or 0.0
            self.log.finished(f"{key[0]} seed {key[1]}", trial.user_attrs, wall, eta=eta)
        self.seen = complete
        for variant, r in rows.items():
            for seed, reason in r.failures:
                if (variant, seed, reason) not in self.failures:
                    self.failures.add((variant, seed, reason))
                    self.log.failed(f"{variant} seed {seed}", reason, eta=eta)
            if r.searched > self.searched[variant]:
                self.log.searched(f"{variant} · {r.searched}/{r.search_budget} search trials", {})
                self.searched[variant] = r.searched
        self._plan(rows)
        self._beat()

    def _beat(self) -> None:
        """Heartbeat lines, in a log, once :data:`HEARTBEAT_S` has passed since the last line."""
        now = time.monotonic()
        if not self.heartbeat or now - self.log.last_line < HEARTBEAT_S:
            return
        epochs, metric = self.study.spec.train.epochs, self.log.metric
        lines = [
            f"running {variant} · seed {seed}: {_where(t, epochs, metric)}"
            for t in self.running
            for variant, seed in [key_of(t)]
        ]
        if not lines and self.log.done >= self.log.total:
            return  # all done: the trial lines said so
        done = f"{self.log.done}/{self.log.total} trials done"
        for line in lines or [f"waiting: {done}, no final trial in flight (workers starting or searching)"]:
            self.log.say(line)

    def _plan(self, rows) -> None:
        total = sum(r.planned for r in rows.values())  # a sequential design's total grows with its looks
        self.log.plan(total, sum(r.done + r.failed for r in rows.values()))

    def _complete(self) -> dict[tuple, optuna.trial.FrozenTrial]:
        """(variant, seed) → its complete final trial; the final trials running (live) kept in
        ``running``."""
        names = {s.study_name for s in optuna.get_all_study_summaries(self.storage)}
        if self.study.name not in names:
            return {}
        queue = optuna.load_study(study_name=self.study.name, storage=self.storage)
        trials = [
            t
            for t in queue.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.RUNNING))
            if key_of(t) in self.possible
        ]
        self.running = sorted(
            (t for t in trials if t.state == TrialState.RUNNING and self.stores.is_live(t)),
            key=lambda t: t.number,
        )
        return {key_of(t): t for t in trials if t.state == TrialState.COMPLETE}


def _where(trial: optuna.trial.FrozenTrial, epochs: int, metric: str) -> str:
    """How far a running trial is: its last reported epoch (and validation value), and for how long
    it has trained."""
    reported = trial.intermediate_values
    last = max(reported, default=None)
    where = (
        f"in epoch 1/{epochs}"
        if last is None
        else f"epoch {last}/{epochs} done, valid {metric} {reported[last]:.4f}"
    )
    if trial.datetime_start is None:
        return where
    return f"{where} ({duration((datetime.now() - trial.datetime_start).total_seconds())} into the trial)"


def status_report(study: Study, stores: Stores) -> tuple[Table, list[str]]:
    """``ablate status``'s table (per variant: done, running, failed, left …) and lines: the ETA
    (from finished trials' wall times, else running trials' checkpoints), failures, checkpoints."""
    rows = progress(study, stores)
    planned = sum(r.planned for r in rows.values())
    table = Table(title=f"{study.name}: {sum(r.done for r in rows.values())}/{planned} trials done")
    headers, cells = status_table(study, rows)
    for column in headers:
        table.add_column(column, justify="left" if column in ("variant", "standing") else "right")
    for cell in cells:
        table.add_row(*map(escape, cell))
    saved = checkpoint_summaries(stores.output_dir / "checkpoints")
    eta = eta_seconds(rows, checkpointed_fractions(saved), projected_walls(saved))
    finished = any(r.walls or r.copied_walls for r in rows.values())
    if not sum(r.left + r.running for r in rows.values()):
        lines = ["finished"]
    elif eta is None:
        lines = ["ETA: unknown until a trial finishes or saves a checkpoint"]
    else:
        basis = "finished trials" if finished else "running trials, projected from their checkpoints"
        lines = [
            f"ETA: {duration(eta)} (mean wall time of {basis} × trials left, less checkpointed "
            f"progress, ÷ running workers)"
        ]
    lines += [
        f"failed: {name} seed {seed}: {reason}" for name, r in rows.items() for seed, reason in r.failures
    ]
    for name, summary in saved.items():
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(summary["saved"]))
        lines.append(f"checkpoint: {name} at epoch {summary['epoch']}/{summary['epochs']} (saved {when})")
    return table, lines

"""What the command line shows: its two consoles, progress bars, error lines, durations."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .drive import Reporter

# Piped output (CI logs, files) gets wide tables instead of rich's 80-column default.
out = Console(width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, width=None if sys.stderr.isatty() else 160)


class BarReporter(Reporter):
    """Progress bars: trials overall, epochs of the current trial."""

    def __init__(self, progress: Progress):
        self.progress = progress
        self.trials = progress.add_task("trials", total=None)
        self.epochs = None
        self.label = ""

    def study(self, total: int, done: int) -> None:
        self.progress.update(self.trials, total=total, completed=done)

    def trial(self, variant: str, seed: int, epochs: int) -> None:
        self.label = f"{variant} · seed {seed}"
        if self.epochs is not None:
            self.progress.remove_task(self.epochs)
        self.epochs = self.progress.add_task(self.label, total=epochs)

    def epoch(self, epoch: int, logged: dict[str, float]) -> None:
        shown = " ".join(f"{k.split('.', 1)[1]} {v:.4f}" for k, v in logged.items() if k.startswith("valid."))
        self.progress.update(self.epochs, completed=epoch, description=f"{self.label} {shown}")

    def finished(self, variant: str, seed: int, result) -> None:
        if self.epochs is not None:
            self.progress.update(self.epochs, completed=self.progress.tasks[-1].total)
        self.progress.advance(self.trials)

    def failed(self, variant: str, seed: int, reason: str) -> None:
        self.progress.console.print(f"[red]trial {variant} seed {seed} failed:[/red] {reason}")
        self.progress.advance(self.trials)


def progress_bars(quiet: bool) -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        disable=quiet,
        transient=False,
    )


def say_error(message: str) -> None:
    err.print(f"error: {message}", markup=False, highlight=False, soft_wrap=True)


def duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"

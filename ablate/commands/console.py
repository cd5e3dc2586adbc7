"""What the command line shows: its two consoles, progress bars, the line left per finished
trial, error lines, durations. Cheap to import (no driver, no MLflow): `ablate validate` loads it."""

from __future__ import annotations

import sys

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from rich.text import Text
from typer.core import TyperGroup

# Piped output (CI logs, files) gets wide tables instead of rich's 80-column default.
out = Console(width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, width=None if sys.stderr.isatty() else 160)


STOPPED = 130  # the exit status of a command stopped by Ctrl-C or SIGTERM (a shell's for SIGINT)


class Commands(TyperGroup):
    """The command line's commands: a stop (Ctrl-C, SIGTERM) that a command does not answer with
    a line of its own (as ``run`` says how to resume) is one line and exit status 130, whenever it
    comes — Typer would exit 130 without a word."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            command = " ".join(filter(None, ("ablate", ctx.invoked_subcommand)))
            err.print(f"interrupted: `{command}` stopped before it finished", markup=False, highlight=False)
            raise typer.Exit(STOPPED) from None


class EtaColumn(ProgressColumn):
    """A task's ``eta`` field (the trial bar's, set as trials finish); blank for the others."""

    def render(self, task) -> Text:
        return Text(task.fields.get("eta", ""), style="progress.remaining")


def progress_bars(quiet: bool) -> Progress:
    """Live bars on a terminal; in a log (stderr not a terminal) none, since rich would draw them
    only once, when the run ends: there the finished-trial lines (:func:`say`) are the progress."""
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        EtaColumn(),
        console=err,
        disable=quiet or not err.is_terminal,
        transient=False,
    )


def say(line: str) -> None:
    """A plain progress line on stderr, written (and flushed) now; above the bars while they are live."""
    err.print(line, markup=False, highlight=False, soft_wrap=True)


def print_resolved(study) -> None:
    """The validated study (overrides applied, defaults filled in) as YAML, on stdout."""
    import yaml

    # Each a document of its own (`---`): a sweep prints one per study, read back by safe_load_all.
    text = yaml.safe_dump(
        study.spec.model_dump(mode="json"), sort_keys=False, allow_unicode=True, explicit_start=True
    )
    out.print(text, markup=False, highlight=False, soft_wrap=True, end="")


def variants_table(study, sizes: dict, title: str) -> Table:
    """``ablate validate``'s table: each variant's components, shape and size; for a task that
    trains a model of its own (``Task.runs_trials``), where none of those apply, each variant's
    ``model.config`` instead, the task's options (its callable) under the table."""
    if study.task.runs_trials:
        options = study.task.options.model_dump(mode="json", exclude_defaults=True)
        given = ", ".join(f"{key}: {value}" for key, value in options.items())
        caption = f"task {study.task.kind_name()}: {given}"
        if source := study.task.code_source():  # read, not run: only `ablate run` imports it
            caption += f"\n`ablate run` imports {source}; validate, status, plan and report do not"
        table = Table("variant", "config", title=title, caption=caption)
        for name, variant in study.variants.items():
            table.add_row(escape(name), escape(_flow(variant.spec.config)))
        return table
    table = Table("variant", *next(iter(study.variants.values())).components(), "size (training memory)")
    table.title = title
    for name, variant in study.variants.items():
        table.add_row(*(escape(c) for c in (name, *variant.components().values(), sizes[name].describe())))
    return table


def _flow(config: dict, prefix: str = "") -> str:
    """A nested configuration on one line: ``width: 16, optim.lr: 0.01``."""
    return ", ".join(
        _flow(value, f"{prefix}{key}.") if isinstance(value, dict) and value else f"{prefix}{key}: {value}"
        for key, value in config.items()
    )


def say_error(message: str) -> None:
    """``error: …``, one line per problem (``validate`` reports every independent one at once)."""
    lines = "\n".join(f"error: {line}" for line in message.splitlines() or [""])
    err.print(lines, markup=False, highlight=False, soft_wrap=True)


def duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


def trial_line(
    done: int, total: int, what: str, metric: str, value: float | None, wall: float, eta: float | None
) -> str:
    """``trial 5/12 done: gelu-mlp seed 1  ndcg@10 0.6812  wall 4.1 s  7 left  ETA 0m29s``."""
    left = max(total - done, 0)
    shown = f"  {metric} {value:.4f}" if value is not None else ""
    later = f"  ETA {duration(eta)}" if eta is not None and left else ""
    return f"trial {done}/{total} done: {what}{shown}  wall {wall:.1f} s  {left} left{later}"


# Typer ≥ 0.2x vendors click under a private module; its exception classes are reached through
# the public ``typer.BadParameter`` so that both vendored and plain click work.
UsageError = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")
ClickException = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")


def usage_line(exc: Exception) -> str:
    """A usage error (missing argument, unknown option, out-of-range value) as one line naming
    the command and where its help is, instead of click's usage block and rich's error box."""
    ctx = getattr(exc, "ctx", None)
    command = ctx.command_path if ctx is not None else "ablate"
    return f"{command}: {exc.format_message()} (see '{command} --help')"

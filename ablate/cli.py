"""The ``ablate`` command line: run, validate, report, status, components.

Bad input (study files, data files, arguments) prints one line and exits with status 2.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from . import registry, stopping
from .console import BarReporter, duration, err, out, progress_bars, say_error
from .errors import AblateError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Comparative ablation studies of transformer-style sequence models.",
)
StudyArg = Annotated[Path, typer.Argument(help="Study file (YAML or TOML).", show_default=False)]
OutputOpt = Annotated[
    Path | None,
    typer.Option("--output", "-o", help="Folder for the Optuna and MLflow stores [default: runs/<study>]."),
]
ReportsOpt = Annotated[Path, typer.Option("--reports", help="Folder that receives reports/<study>/.")]


StorageOpt = Annotated[
    str | None,
    typer.Option(
        "--storage",
        help="Optuna storage URL shared by workers, e.g. postgresql://user:pw@host/db "
        "[default: runs/<study>/optuna.journal].",
    ),
]
TrackingOpt = Annotated[
    str | None,
    typer.Option(
        "--tracking-uri",
        help="MLflow tracking URI, e.g. http://host:5000 [default: sqlite runs/<study>/mlflow.db].",
    ),
]


@app.command()
def run(
    study_file: StudyArg,
    output: OutputOpt = None,
    reports: ReportsOpt = Path("reports"),
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars.")] = False,
    retry_failed: Annotated[
        bool, typer.Option(help="Run again trials that failed (not only interrupted ones).")
    ] = False,
    workers: Annotated[
        int, typer.Option("--workers", "-w", min=1, help="Worker processes on this machine.")
    ] = 1,
    storage: StorageOpt = None,
    tracking_uri: TrackingOpt = None,
) -> None:
    """Train every (variant, seed) of a study (searching first if it has a search: section),
    resuming where it stopped, then write the report."""
    from .drive import Stores, run_study
    from .study import load_study

    study = load_study(study_file)
    _warn_duplicates(study)
    stores = Stores.for_study(study, output, tracking_uri, storage)
    with stopping.stop_signals(), _resumable(study_file, quiet=False):  # `kill` or Ctrl-C: a clean stop
        if workers == 1:
            with progress_bars(quiet) as progress:
                summary = run_study(study, stores, BarReporter(progress), retry_failed=retry_failed)
            skipped = summary.skipped
            # Every failure standing in the study, not only this invocation's (a rerun leaves them).
            failed = [f for f in summary.failed if f[1] < 0] + _standing_failures(study, stores)
        else:
            skipped, failed = _run_workers(study_file, study, stores, workers, quiet, retry_failed)
    if skipped:
        err.print(f"resumed: {skipped} trial(s) were already complete and were not retrained")
    paths = _report(stores.tracking_uri, study.name, reports / study.name, study)
    for variant, seed, reason in failed:
        err.print(f"[red]failed[/red] {variant}{f' seed {seed}' if seed >= 0 else ''}: {escape(reason)}")
    out.print(f"report: {paths['html'].resolve()}", markup=False, highlight=False, soft_wrap=True)
    if failed:
        raise typer.Exit(1)


@contextmanager
def _resumable(study_file: Path, quiet: bool) -> Iterator[None]:
    """A stopped run says how to go on (exit status 130, as for any Ctrl-C)."""
    try:
        yield
    except KeyboardInterrupt:
        if not quiet:
            err.print(
                f"interrupted: trials in flight are re-queued; `ablate run {study_file}` resumes",
                markup=False,
                highlight=False,
                soft_wrap=True,
            )
        raise typer.Exit(130) from None


def _run_workers(study_file: Path, study, stores, workers: int, quiet: bool, retry_failed: bool):
    """N ``ablate worker`` processes on this machine, sharing the study's stores."""
    import subprocess

    from .drive import prepare, progress

    prepare(study, stores)  # create the stores and queues once: schema creation must not race
    before = sum(r.done for r in progress(study, stores).values())
    cmd = [
        sys.executable,
        "-m",
        "ablate.cli",
        "worker",
        str(study_file),
        "--output",
        str(stores.output_dir),
        "--storage",
        stores.optuna_url,
        "--tracking-uri",
        stores.tracking_uri,
        "--quiet",
    ]
    if retry_failed:
        cmd.append("--retry-failed")
    procs = [subprocess.Popen(cmd, env={**os.environ, PARENT_ENV: str(os.getpid())}) for _ in range(workers)]
    storage = stores.storage()  # one handle: a journal is then read incrementally, not replayed per poll

    def counts() -> dict[str, int]:  # a sequential design's total grows with its looks
        rows = progress(study, stores, storage).values()
        return {"completed": sum(r.done for r in rows), "total": sum(r.planned for r in rows)}

    try:
        with progress_bars(quiet) as bars:
            task = bars.add_task(f"trials ({workers} workers)", **{**counts(), "completed": before})
            while any(p.poll() is None for p in procs):
                stopping.sleep(2.0)
                if not quiet:
                    bars.update(task, **counts())
            bars.update(task, **counts())
    except BaseException:
        for p in procs:
            p.terminate()
        for p in procs:  # they record their trials as interrupted before this run returns
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pass
        raise
    crashed = [p.returncode for p in procs if p.returncode not in (0, 1)]
    if crashed:
        raise AblateError(
            f"{len(crashed)} of {workers} workers exited with status {crashed[0]}; "
            f"run the study again to resume"
        )
    return before, _standing_failures(study, stores)


def _standing_failures(study, stores) -> list[tuple[str, int, str]]:
    from .drive import progress

    return [(v, seed, reason) for v, r in progress(study, stores).items() for seed, reason in r.failures]


@app.command()
def worker(
    study_file: StudyArg,
    storage: StorageOpt = None,
    tracking_uri: TrackingOpt = None,
    output: OutputOpt = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars.")] = False,
    retry_failed: Annotated[
        bool, typer.Option(help="Run again trials that failed (not only interrupted ones).")
    ] = False,
    heartbeat: Annotated[
        int, typer.Option(min=1, help="Seconds between heartbeats on a shared database.")
    ] = 20,
    grace: Annotated[
        int, typer.Option(min=2, help="Seconds without a heartbeat after which a trial is re-queued.")
    ] = 120,
) -> None:
    """Take trials from a study's shared queue until none is left (start one per machine or GPU,
    all with the same --storage and --tracking-uri); writes no report (run `ablate report`)."""
    from .drive import Stores, run_study
    from .study import load_study

    study = load_study(study_file)
    stores = Stores.for_study(study, output, tracking_uri, storage)
    stores.heartbeat_s, stores.grace_s = heartbeat, grace
    with stopping.stop_signals(), _resumable(study_file, quiet), progress_bars(quiet) as progress:
        _stop_with_parent()
        summary = run_study(study, stores, BarReporter(progress), retry_failed=retry_failed)
    err.print(f"worker done: {summary.finished} trial(s) and {summary.searched} search trial(s) trained here")
    for variant, seed, reason in summary.failed:
        err.print(f"[red]failed[/red] {variant}{f' seed {seed}' if seed >= 0 else ''}: {escape(reason)}")
    if summary.failed:
        raise typer.Exit(1)


@app.command()
def validate(study_file: StudyArg) -> None:
    """Check a study file (keys, types, kinds, compatibility, data files) without training."""
    from .study import load_study

    study = load_study(study_file)
    n, design = len(study.variants), study.spec.sequential
    seeds = [len(study.spec.seed_list)] if design is None else [design.initial, design.max]
    span = lambda times: " to ".join(str(times * k) for k in seeds)  # noqa: E731
    table = Table(title=f"{study.name}: {n} variants × {span(1)} seeds = {span(n)} trials")
    for column in ("variant", *next(iter(study.variants.values())).components()):
        table.add_column(column)
    for name, variant in study.variants.items():
        table.add_row(*(escape(c) for c in (name, *variant.components().values())))
    out.print(table)
    search = study.spec.search
    if search.enabled:
        from .search import search_budget

        out.print(
            f"search: {search_budget(study)} {search.sampler} trial(s) per variant over "
            f"{', '.join(search.space)} (pruner: {search.pruner}), then the best parameters over every seed"
        )
    if study.spec.match_params:
        out.print(
            "match_params: each variant's width knob is scaled to the baseline's backbone parameter count "
            "(±2%) when the run starts"
        )
    if design is not None:
        out.print(f"seeds: {design.describe()}")
    _warn_duplicates(study)
    out.print(f"{study_file}: valid")


def _warn_duplicates(study) -> None:
    from .study import duplicate_warnings

    for line in duplicate_warnings(study):
        err.print(line, markup=False, highlight=False, soft_wrap=True)


@app.command()
def report(
    study_file: Annotated[
        Path | None, typer.Argument(help="Study file (or give --experiment).", show_default=False)
    ] = None,
    output: OutputOpt = None,
    reports: ReportsOpt = Path("reports"),
    experiment: Annotated[
        str | None, typer.Option(help="Experiment (study) name in the tracking store.")
    ] = None,
    tracking_uri: Annotated[
        str | None, typer.Option(help="MLflow tracking URI [default: the study's store].")
    ] = None,
) -> None:
    """Rebuild the report from the tracking store alone (no training)."""
    from .drive import Stores
    from .study import load_study

    if study_file is not None:
        study = load_study(study_file, check_files=False)
        stores = Stores.for_study(study, output, tracking_uri)
        paths = _report(stores.tracking_uri, study.name, reports / study.name, study)
    elif experiment and tracking_uri:
        paths = _report(tracking_uri, experiment, reports / experiment, None)
    else:
        raise AblateError("give a study file, or both --experiment and --tracking-uri")
    out.print(f"report: {paths['html'].resolve()}", markup=False, highlight=False, soft_wrap=True)


@app.command()
def status(study_file: StudyArg, output: OutputOpt = None, storage: StorageOpt = None) -> None:
    """Trials done / running / failed / left per variant (and search progress), with an ETA."""
    import time

    from .drive import Stores, checkpointed_fractions, eta_seconds, plan, progress, status_table
    from .study import load_study
    from .train import checkpoint_summaries

    study = load_study(study_file, check_files=False)
    stores = Stores.for_study(study, output, storage=storage)
    if not stores.started():
        design = study.spec.sequential
        first = f" at the first look, up to {len(study.variants) * design.max}" if design else ""
        out.print(f"{study.name}: not started ({len(plan(study))} trials planned{first})")
        return
    rows = progress(study, stores)
    planned = sum(r.planned for r in rows.values())
    table = Table(title=f"{study.name}: {sum(r.done for r in rows.values())}/{planned} trials done")
    headers, cells = status_table(study, rows)
    for column in headers:
        table.add_column(column, justify="left" if column in ("variant", "standing") else "right")
    for cell in cells:
        table.add_row(*map(escape, cell))
    out.print(table)
    saved = checkpoint_summaries(stores.output_dir / "checkpoints")
    eta = eta_seconds(rows, checkpointed_fractions(saved))
    left = sum(r.left + r.running for r in rows.values())
    if left == 0:
        out.print("finished")
    elif eta is None:
        out.print("ETA: unknown until a trial finishes")
    else:
        out.print(
            f"ETA: {duration(eta)} (mean wall time of finished trials × trials left, less checkpointed "
            f"progress, ÷ running workers)"
        )
    for name, r in rows.items():
        for seed, reason in r.failures:
            out.print(f"failed: {name} seed {seed}: {reason}", markup=False, highlight=False, soft_wrap=True)
    for name, summary in saved.items():
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(summary["saved"]))
        out.print(
            f"checkpoint: {name} at epoch {summary['epoch']}/{summary['epochs']} (saved {when})",
            markup=False,
            highlight=False,
        )


@app.command()
def components(slot: Annotated[str | None, typer.Argument(help="Only this slot.")] = None) -> None:
    """List every registered kind per slot with its options and defaults."""
    slots = [slot] if slot else list(registry.SLOTS)
    table = Table(show_lines=True)
    for column in ("slot", "kind", "options (name: type = default)", "provided by"):
        table.add_column(column)
    for s in slots:
        for kind in registry.kinds(s):
            cls = registry.get(s, kind)
            table.add_row(s, kind, escape(_describe_options(cls.Options)), escape(registry.provider(s, kind)))
    out.print(table)


def _describe_options(options_cls) -> str:
    lines = []
    for name, field in options_cls.model_fields.items():
        annotation = getattr(field.annotation, "__name__", None) or str(field.annotation).replace(
            "typing.", ""
        )
        default = "required" if field.is_required() else repr(field.get_default(call_default_factory=True))
        line = f"{name}: {annotation} = {default}"
        if field.description:
            line += f"  — {field.description}"
        lines.append(line)
    return "\n".join(lines) or "—"


def _report(tracking_uri: str, experiment: str, out_dir: Path, study) -> dict[str, Path]:
    from .report import format_table, write_report
    from .results import load_results
    from .stats import compare
    from .stats.resample import resampled_for_report

    loaded = load_results(tracking_uri, experiment)
    if loaded.results.empty:
        raise AblateError(f"no finished trials for '{experiment}' in {tracking_uri}")
    settings = _settings(loaded.settings, study)
    paths = write_report(
        loaded.results, loaded.units, loaded.curves, settings, out_dir, failures=loaded.failures
    )
    shown, settings = resampled_for_report(loaded.results, loaded.units, settings)  # as the report
    out.print(
        format_table(compare(shown, loaded.units, settings, settings.primary), settings),
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    return paths


def _settings(stored, study):
    """Report settings (``stats.ReportSettings``): the study file's when given (alpha etc. may be
    changed after the run), else those stored with the study in the tracking store (None: none)."""
    settings = study.report_settings() if study is not None else stored
    if settings is None:
        raise AblateError("the tracking store holds no report settings for this study; pass the study file")
    notes = [f"variants: {', '.join(settings.variants)}"] if settings.variants else []
    return settings.model_copy(update={"notes": notes})


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


# Set by `ablate run --workers N` for its workers: the pid they stop with.
PARENT_ENV = "ABLATE_WORKER_OF"


def _stop_with_parent() -> None:
    """On Linux, a worker of `ablate run --workers N` gets SIGTERM (a clean stop, see
    :mod:`ablate.stopping`) when that process dies, even by SIGKILL, instead of training on as
    an orphan."""
    parent = os.environ.get(PARENT_ENV)
    if not parent or not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    if os.getppid() != int(parent):  # it died before the request took effect
        raise KeyboardInterrupt


def main() -> None:
    try:
        # standalone_mode=False: usage errors reach us as exceptions, so they print as one line.
        code = app(standalone_mode=False)
    except AblateError as exc:
        say_error(str(exc))
        sys.exit(exc.exit_code)
    except UsageError as exc:
        if exc.__class__.__name__ == "NoArgsIsHelpError":  # plain `ablate`: the help text
            exc.show()
        else:
            say_error(usage_line(exc))
        sys.exit(exc.exit_code)
    except ClickException as exc:
        say_error(exc.format_message())
        sys.exit(exc.exit_code)
    except typer.Abort:
        say_error("aborted")
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":  # pragma: no cover
    main()

"""The ``ablate`` command line: run, validate, plan, report, compare, status, components, proxy.

Exit statuses, as the README's table has them: 0 done; 1 trials failed, nothing finished to
report, or a worker crashed; 2 bad input (study file, data file, argument, a store or folder that
cannot be used), with one line naming it; 130 stopped by Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import shlex
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

import ablate
from ablate import stopping
from ablate.commands import slurm
from ablate.commands.compare import (
    BaselineOpt,
    DirectionOpt,
    ExperimentOpt,
    GroupByOpt,
    ItemsOpt,
    MarginOpt,
    MetricOpt,
    OutOpt,
    PartialOpt,
    SeedKeyOpt,
    SourceArg,
    UnpairedOpt,
    compare_command,
)
from ablate.commands.console import (
    STOPPED,
    ClickException,
    Commands,
    UsageError,
    err,
    out,
    print_resolved,
    progress_bars,
    say_error,
    usage_line,
)
from ablate.commands.data import app as data_app
from ablate.commands.gate import app as gate_app
from ablate.commands.options import (
    OnlyOpt,
    OutputOpt,
    OverridesArg,
    ReportsOpt,
    ReuseOlderOpt,
    ReuseOpt,
    StorageOpt,
    StudyArg,
    TrackingOpt,
)
from ablate.commands.planning import plan_command
from ablate.commands.validate import PRINT_HELP, validate_command, warn_design
from ablate.errors import AblateError, first_line, root_cause, store_failure
from ablate.study.overrides import command_line

app = typer.Typer(
    cls=Commands,
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    # Click's own help layout: whole option names and wrapped text at any width (rich's panels cut
    # names and defaults at 80 columns), no metavar for a flag.
    rich_markup_mode=None,
    help="Comparative ablation studies of transformer-style sequence models.",
)
app.add_typer(data_app, name="data")  # ablate data list | fetch | path
app.add_typer(gate_app, name="gate")  # ablate gate init | try | status | history | serve


def _show_version(value: bool) -> None:
    if value:
        out.print(f"ablate {ablate.__version__}", markup=False, highlight=False)
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_show_version, is_eager=True, help="Show the version and exit."),
    ] = False,
) -> None:
    pass


# Bounds that catch a typo (an extra digit of workers forks a process each; a heartbeat beyond a
# day overflows a timer) and leave every real setting room.
MAX_WORKERS, MAX_HEARTBEAT_S, MAX_GRACE_S = 1024, 3600, 86_400
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars or lines.")]
RetryFailedOpt = Annotated[
    bool, typer.Option(help="Run again trials that failed (not only interrupted ones).")
]


REBUILD_HELP = "Rebuild a lost Optuna journal from the MLflow store's finished trials (kept) first."


@app.command()
def run(
    study_file: StudyArg,
    overrides: OverridesArg = None,
    output: OutputOpt = None,
    reports: ReportsOpt = None,
    quiet: QuietOpt = False,
    retry_failed: RetryFailedOpt = False,
    workers: Annotated[
        int, typer.Option("--workers", "-w", min=1, max=MAX_WORKERS, help="Worker processes on this machine.")
    ] = 1,
    storage: StorageOpt = None,
    tracking_uri: TrackingOpt = None,
    gpus: Annotated[
        str | None,
        typer.Option(metavar="all|N", help="Spread the workers over GPUs (CUDA_VISIBLE_DEVICES per worker)."),
    ] = None,
    per_gpu: Annotated[
        int | None, typer.Option(min=1, help="Trials at once per GPU.", show_default="as many fit: measured")
    ] = None,
    reuse: ReuseOpt = None,
    reuse_older_kinds: ReuseOlderOpt = False,
    rebuild_queue: Annotated[bool, typer.Option("--rebuild-queue", help=REBUILD_HELP)] = False,
    launcher: slurm.LauncherOpt = slurm.Launcher.local,
    partition: slurm.PartitionOpt = None,
    time: slurm.TimeOpt = None,
    mem: slurm.MemOpt = None,
    cpus: slurm.CpusOpt = None,
    gpus_per_task: slurm.GpusOpt = None,
    account: slurm.AccountOpt = None,
    sbatch: slurm.SbatchOpt = None,
    only: OnlyOpt = None,
    print_config: Annotated[bool, typer.Option("--print-config", help=PRINT_HELP)] = False,
) -> None:
    """Train every (variant, seed) of a study (searching first if it has a search: section),
    resuming where it stopped, then write the report. A comma sweep (train.lr=1e-3,3e-3) runs
    the study once per value, each its own study named <name>.lr_0.001."""
    from ablate.commands.across import run_across
    from ablate.commands.ladder import run_ladder
    from ablate.commands.running import each_point, run_and_report
    from ablate.drive import Donors
    from ablate.study.ladder import laddered
    from ablate.study.load import load_study
    from ablate.study.several import several

    if len(points := command_line(study_file, overrides or (), only)) > 1:  # a sweep: a study per point
        raise typer.Exit(each_point(run, dict(locals()), points))
    with stopping.stop_signals(), _resumable(study_file, False, points[0]):  # it may read the data
        study = load_study(study_file, overrides=(overrides := points[0]))
    if print_config:
        return print_resolved(study)
    warn_design(study, seeds=False)
    reuse = Donors(reuse or (), older_kinds=True) if reuse_older_kinds else reuse  # on to every worker
    jobs = slurm.settings(launcher, study, partition, time, mem, cpus, gpus_per_task, account, sbatch)
    if laddered(study):  # model sizes: a study each, then the ladder report
        if gpus is not None or per_gpu is not None or jobs is not None:
            raise AblateError(
                "ladder: run each rung's study for --gpus or --launcher slurm (`ablate validate` names them)"
            )
        with stopping.stop_signals(), _resumable(study_file, False, overrides):
            args = (quiet, retry_failed, workers, storage, tracking_uri, reuse, rebuild_queue)
            raise typer.Exit(1 if run_ladder(study, output, reports, *args) else 0)
    if several(study):  # task.data lists data sets: a study each, then the across-data-set report
        with stopping.stop_signals(), _resumable(study_file, False, overrides):
            placing = None if gpus is None and per_gpu is None else (gpus, per_gpu)  # per data set
            args = (quiet, retry_failed, workers, storage, tracking_uri, placing, reuse, rebuild_queue, jobs)
            raise typer.Exit(1 if run_across(study, output, reports, *args) else 0)
    placement = None
    if gpus is not None or per_gpu is not None:
        from ablate.commands.gpus import plan_gpus

        placement = plan_gpus(study, gpus, per_gpu, workers)
        workers = placement.workers
        if not quiet:
            err.print(placement.describe(), markup=False, highlight=False, soft_wrap=True)
    with stopping.stop_signals(), _resumable(study_file, False, overrides):  # `kill` or Ctrl-C: a clean stop
        arguments = (output, reports, quiet, retry_failed, workers, storage, tracking_uri, placement, reuse)
        ran = run_and_report(study, *arguments, rebuild_queue=rebuild_queue, slurm=jobs)
    if ran.failed:
        raise typer.Exit(1)


@contextmanager
def _resumable(study_file: Path, quiet: bool, overrides: list[str] | None = None) -> Iterator[None]:
    """A stopped run says how to go on (exit status 130, as for any Ctrl-C)."""
    try:
        yield
    except KeyboardInterrupt:
        if not quiet:
            again = shlex.join(["ablate", "run", str(study_file), *(overrides or ())])
            err.print(
                f"interrupted: trials in flight are re-queued; `{again}` resumes",
                markup=False,
                highlight=False,
                soft_wrap=True,
            )
        raise typer.Exit(STOPPED) from None


@app.command()
def worker(
    study_file: StudyArg,
    overrides: OverridesArg = None,
    storage: StorageOpt = None,
    tracking_uri: TrackingOpt = None,
    output: OutputOpt = None,
    quiet: QuietOpt = False,
    retry_failed: RetryFailedOpt = False,
    heartbeat: Annotated[
        int, typer.Option(min=1, max=MAX_HEARTBEAT_S, help="Seconds between heartbeats on a shared database.")
    ] = 20,
    grace: Annotated[
        int,
        typer.Option(
            min=2, max=MAX_GRACE_S, help="Seconds without a heartbeat after which a trial is re-queued."
        ),
    ] = 120,
    reuse: ReuseOpt = None,
    reuse_older_kinds: ReuseOlderOpt = False,
) -> None:
    """Take trials from a study's shared queue until none is left (start one per machine or GPU,
    all with the same --storage and --tracking-uri); writes no report (run `ablate report`)."""
    from ablate.commands.progress import BarReporter
    from ablate.commands.running import check_folders
    from ablate.commands.workers import stop_with_parent
    from ablate.drive import Donors, Stores, run_study
    from ablate.drive.recovery import check_stores
    from ablate.study.ladder import one_rung
    from ablate.study.load import load_study
    from ablate.study.several import one_dataset

    with stopping.stop_signals(), _resumable(study_file, quiet, overrides):  # it may read the data
        study = load_study(study_file, overrides=overrides or ())
    one_dataset(study, "ablate worker")  # each data set's study has its own queue
    one_rung(study, "ablate worker")  # and each rung's
    stores = Stores.for_study(study, output, tracking_uri, storage)
    stores.heartbeat_s, stores.grace_s = heartbeat, grace
    check_folders(study, stores, output)  # before any training
    check_stores(study, stores)  # a store lost beside the other: one line, nothing retrained
    donors = Donors(reuse or (), reuse_older_kinds)
    with stopping.stop_signals(), _resumable(study_file, quiet, overrides), progress_bars(quiet) as bars:
        stop_with_parent()
        summary = run_study(study, stores, BarReporter(study, bars, quiet), retry_failed, donors=donors)
    trained = f"{summary.finished} trial(s) and {summary.searched} search trial(s) trained here"
    err.print(f"worker done: {trained}{f', {summary.reused} reused (--reuse)' if summary.reused else ''}")
    for variant, seed, reason in summary.failed:
        err.print(f"[red]failed[/red] {variant}{f' seed {seed}' if seed >= 0 else ''}: {escape(reason)}")
    if summary.failed:
        raise typer.Exit(1)


app.command("validate")(validate_command)


app.command("plan")(plan_command)


@app.command()
def report(
    study_file: Annotated[
        Path | None, typer.Argument(help="Study file (or give --experiment).", show_default=False)
    ] = None,
    overrides: OverridesArg = None,
    output: OutputOpt = None,
    reports: ReportsOpt = None,
    experiment: Annotated[
        str | None, typer.Option(help="Experiment (study) name in the tracking store.")
    ] = None,
    tracking_uri: Annotated[
        str | None, typer.Option(help="MLflow tracking URI.", show_default="the study's store")
    ] = None,
    trials: Annotated[
        Path | None,
        typer.Option(metavar="DIR", help="Also write each finished trial to DIR as a file --reuse reads."),
    ] = None,
) -> None:
    """Rebuild the report from the tracking store alone (no training)."""
    with stopping.stop_signals():  # a stop: at the next safe point (reading trials, figures, calibration)
        from ablate.commands.reporting import rebuild_report

        rebuild_report(study_file, overrides, output, reports, experiment, tracking_uri, trials)


@app.command()
def compare(
    sources: SourceArg,
    metric: MetricOpt,
    baseline: BaselineOpt,
    out_dir: OutOpt,
    experiment: ExperimentOpt = None,
    group_by: GroupByOpt = None,
    seed_key: SeedKeyOpt = "seed",
    higher_is_better: DirectionOpt = None,
    margin: MarginOpt = None,
    unpaired: UnpairedOpt = False,
    items: ItemsOpt = False,
    partial: PartialOpt = False,
) -> None:
    """Verdicts for runs already made (an MLflow experiment, a CSV of runs, result files): runs
    grouped by their parameters less the seed, each group against the baseline, the same report;
    with --items, evaluation logs compared item by item."""
    arguments = (sources, metric, baseline, out_dir, experiment, group_by, seed_key, higher_is_better)
    compare_command(*arguments, margin, unpaired, items, partial)


@app.command()
def status(
    study_file: StudyArg, overrides: OverridesArg = None, output: OutputOpt = None, storage: StorageOpt = None
) -> None:
    """Trials done / running / failed / left per variant (and search progress), with an ETA;
    for a study over several data sets, each data set's and the across-data-set step."""
    from ablate.commands.across import show_status
    from ablate.commands.ladder import show_ladder_status
    from ablate.study.ladder import laddered
    from ablate.study.load import load_study

    study = load_study(study_file, check_files=False, overrides=overrides or ())
    (show_ladder_status if laddered(study) else show_status)(study, output, storage)


app.command("cancel")(slurm.cancel_command)


@app.command()
def proxy(
    storage: Annotated[
        str, typer.Option(help="The database the proxy fronts, e.g. postgresql://user:pw@host/db.")
    ],
    host: Annotated[str, typer.Option(help="Where to listen (0.0.0.0: every interface).")] = "0.0.0.0",
    port: Annotated[int, typer.Option(min=1, max=65535, help="The port the workers' grpc:// names.")] = 13000,
) -> None:
    """Serve a shared database to many workers through Optuna's gRPC storage proxy: start it once,
    then give workers --storage grpc://<this host>:<port>; they hold no database connection."""
    from ablate.drive.proxy import PROXY_SCHEME, proxy_problem, serve_proxy
    from ablate.drive.stores import storage_problem

    if "://" not in storage or storage.startswith(PROXY_SCHEME):
        raise AblateError(f"--storage {storage}: the proxy fronts a database (postgresql://…, sqlite:///…)")
    if problem := storage_problem(storage) or proxy_problem(f"{PROXY_SCHEME}{host}:{port}"):
        raise AblateError(f"--storage: {problem}")
    where = f"{PROXY_SCHEME}<this host>:{port}"
    err.print(f"Optuna storage proxy on {host}:{port}; give workers --storage {where}")
    try:
        serve_proxy(storage, host, port)  # until SIGTERM (the default: the process ends) or Ctrl-C
    except KeyboardInterrupt:
        raise typer.Exit(STOPPED) from None


@app.command()
def components(slot: Annotated[str | None, typer.Argument(help="Only this slot.")] = None) -> None:
    """List every registered kind per slot with its options: type, allowed values, default and
    a one-line description."""
    from ablate.commands.listing import show_components

    show_components(slot)


def main() -> None:
    """The command line. SIGTERM is a stop, as Ctrl-C (see :class:`Commands`), for the command's
    whole life; the caller's handler is back after (tests call this in-process)."""
    here = threading.current_thread() is threading.main_thread()  # where a handler can be set
    before = signal.signal(signal.SIGTERM, signal.default_int_handler) if here else None
    try:
        _main()
    finally:
        if before is not None:
            signal.signal(signal.SIGTERM, before)


def _main() -> None:
    try:
        # standalone_mode=False: usage errors reach us as exceptions, so they print as one line.
        code = app(standalone_mode=False, prog_name="ablate")  # also run as `python -m ablate.commands.cli`
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
    except Exception as exc:  # noqa: BLE001 - only a store's or the disk's failure is answered here
        if not store_failure(exc):
            raise  # anything else is a bug: its traceback is what a report of it needs
        why = root_cause(exc)
        say_error(f"{type(why).__name__}: {first_line(why)}; stopped (what finished is kept; rerun resumes)")
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":  # pragma: no cover
    main()

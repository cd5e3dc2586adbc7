"""``ablate run``'s work, shared by the command and :func:`ablate.run`: train a study's trials in
this process or in N worker processes on this machine, then write its report."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rich.markup import escape

from ablate import stopping
from ablate.commands.configurations import record
from ablate.commands.console import err, out, progress_bars, say
from ablate.commands.progress import BarReporter, plan_line
from ablate.commands.workers import run_workers, standing_failures
from ablate.drive import Donors, Stores, run_study
from ablate.drive.records import resolved_yaml
from ablate.drive.recovery import check_stores
from ablate.drive.reference import fill_reference
from ablate.errors import AblateError, RunFailed
from ablate.faults import fault_point
from ablate.study.folders import folder_problem, study_key_error
from ablate.study.load import Study
from ablate.tracking.results import Results, load_results
from ablate.tracking.store import attach_report

if TYPE_CHECKING:
    from ablate.commands.gpus import GpuPlan
    from ablate.study.spec import SlurmSpec


@dataclass
class Ran:
    paths: dict[str, Path]  # the report's files
    results: Results  # the study's finished trials, as the report read them
    failed: list[tuple[str, int, str]]  # (variant, seed or -1, reason) standing in the study
    skipped: int  # trials complete before this run


def run_and_report(
    study: Study,
    output: Path | None = None,
    reports: Path | None = None,
    quiet: bool = False,
    retry_failed: bool = False,
    workers: int = 1,
    storage: str | None = None,
    tracking_uri: str | None = None,
    gpus: GpuPlan | None = None,
    reuse: Sequence[str | Path] | Donors | None = None,
    rebuild_queue: bool = False,
    slurm: SlurmSpec | None = None,
    silent: bool = False,
    submitted: list[str] | None = None,
) -> Ran:
    """Train every (variant, seed) of a study not yet complete, then write the report (to
    ``<reports>/<study>/`` when ``reports`` is given, else to ``report/`` in the study's output
    folder). A stop request (SIGTERM, Ctrl-C) ends it with ``KeyboardInterrupt`` once trials in
    flight are recorded. ``reuse``: other studies' output folders, tracking URIs or folders of trial
    files whose finished trials with the same fingerprint and seed are copied, not trained (or the
    :class:`~ablate.drive.Donors` made of them).
    ``rebuild_queue``: a lost journal is rebuilt from the tracking records first
    (:func:`~ablate.drive.recovery.check_stores`). ``slurm``: the workers are SLURM jobs with
    these settings (:mod:`ablate.commands.slurm`); ``submitted``: their jobs, already submitted.
    ``quiet``: no progress bars or lines; ``silent``
    (``ablate.run(quiet=True)``): nothing printed at all."""
    if workers < 1:
        raise AblateError(f"workers must be at least 1 (got {workers})")
    if slurm is not None and gpus is not None:
        raise AblateError("--gpus places workers on this machine; SLURM jobs ask with --gpus-per-task")
    stores = Stores.for_study(study, output, tracking_uri, storage)
    out_dir = reports / study.name if reports else stores.output_dir / "report"
    check_folders(study, stores, output, reports, out_dir)  # before any training
    record(study, stores.output_dir)  # which configuration this folder holds
    rebuilt = check_stores(study, stores, rebuild_queue)  # a store lost beside the other: one line
    if rebuilt and not silent:
        err.print(f"rebuilt: {rebuilt} finished trial(s) of the queue from the tracking records")
    # A --reuse folder without a store is refused before any training (by the CLI's Donors, or here).
    donors = reuse if isinstance(reuse, Donors) else Donors(reuse or ())
    if not quiet:  # at once: a log is not silent until the first trial ends
        say(plan_line(study, stores, out_dir, workers))
    if slurm is not None:
        from ablate.commands.slurm import run_jobs

        skipped, failed = run_jobs(study, stores, workers, quiet, slurm, retry_failed, donors, submitted)
    elif workers == 1 and gpus is None:
        with progress_bars(quiet) as bars:
            reporter = BarReporter(study, bars, quiet)
            summary = run_study(study, stores, reporter, retry_failed=retry_failed, donors=donors)
        skipped = summary.skipped
        # Every failure standing in the study, not only this invocation's (a rerun leaves them).
        failed = [f for f in summary.failed if f[1] < 0] + standing_failures(study, stores)
    else:
        skipped, failed = run_workers(study, stores, workers, quiet, retry_failed, gpus, donors)
    if skipped and not silent:
        err.print(f"resumed: {skipped} trial(s) were already complete and were not retrained")
    try:
        paths, results = write_study_report(stores.tracking_uri, study.name, out_dir, study, silent)
    except RunFailed:  # no trial finished: the failures say why, above the line that ends the run
        list_failures(failed, silent)
        raise
    list_failures(failed, silent)
    table = results.results
    reused = int(table["reused_from"].notna().sum()) if "reused_from" in table else 0
    if reused and not silent:
        err.print(f"reused: {reused} of the study's trials were copied, not trained (--reuse)")
    if not silent:
        out.print(f"report: {paths['html'].resolve()}", markup=False, highlight=False, soft_wrap=True)
    return Ran(paths, results, failed, skipped)


def each_point(command, given: dict, points: list[list[str]]) -> int:
    """A sweep's studies, one ``command`` call each (``ablate run``): the overrides of each point
    (:func:`ablate.study.overrides.expand_sweeps`), an ``--output`` folder of its own; the worst exit
    status."""
    import click

    codes = []
    for point in points:
        each = {k: given[k] for k in inspect.signature(command).parameters}
        output = each.get("output")
        name = next(text.split("=", 1)[1] for text in point if text.startswith("name="))
        each.update(overrides=point, only=None, output=output / name if output else None)
        try:
            command(**each)
        except click.exceptions.Exit as exc:
            codes.append(exc.exit_code)
    return max(codes, default=0)


def list_failures(failed: list[tuple[str, int, str]], silent: bool = False) -> None:
    for variant, seed, reason in [] if silent else failed:
        err.print(f"[red]failed[/red] {variant}{f' seed {seed}' if seed >= 0 else ''}: {escape(reason)}")


def check_folders(
    study: Study,
    stores: Stores,
    output: Path | None,
    reports: Path | None = None,
    out_dir: Path | None = None,
    trains: bool = True,
) -> None:
    """Stop with one line naming the folder and what chose it (``--output``, the study file's
    ``output:``, ``--reports``) when the output folder (where it ``trains``), or the report
    folder ``out_dir``, cannot be written: before any training, not when the report is due."""
    problem = None
    if trains:
        problem = folder_problem(stores.output_dir)
        for sub in ("workers", "checkpoints"):  # folders the driver makes in it
            problem = problem or folder_problem(stores.output_dir / sub)
    if problem is None and out_dir is not None:
        problem = folder_problem(out_dir)
        if problem is not None and reports is not None:
            raise AblateError(f"--reports {reports}: {problem}")
    if problem is None:
        return
    if output is not None:
        raise AblateError(f"--output {output}: {problem}")
    if study.spec.output is not None:
        raise study_key_error(study, ("output",), problem)
    raise AblateError(
        f"{problem} (the output folder is runs/<name> in the current folder; output: in "
        f"{study.path} or --output puts it elsewhere)"
    )


def write_study_report(
    tracking_uri: str, experiment: str, out_dir: Path, study: Study | None, quiet: bool = False
) -> tuple[dict[str, Path], Results]:
    """The report from the tracking store (its files, and the results it read, with the verdicts
    of comparisons.csv as ``comparisons``); prints the primary metric's comparison table, its
    verdict sentences and the warnings: not converged, mixed precisions (``quiet``: nothing)."""
    import pandas as pd

    from ablate.report import format_table, write_report
    from ablate.report.convergence import not_converged, warning_lines
    from ablate.report.verdicts import headline, verdict_sentences
    from ablate.report.write import precision_warnings
    from ablate.stats import compare, comparisons
    from ablate.stats.resample import resampled_for_report

    fault_point("report")  # test hook
    loaded = load_results(tracking_uri, experiment)
    if study is not None:  # its variants' trials only: one left out (`~variants.x`) is not reported
        loaded = loaded.of_variants(list(study.variants))
    if loaded.results.empty:  # a study that ran but finished nothing: a failed run, not bad input
        failed = 0 if loaded.failures is None else len(loaded.failures)
        why = f" ({failed} failed; `ablate run --retry-failed` trains them again)" if failed else ""
        raise RunFailed(f"no finished trials for '{experiment}' in {tracking_uri}{why}, so no report")
    settings = report_settings(loaded.settings, study)
    fill_reference(tracking_uri, study, loaded.meta)  # trivial baselines a store made before them lacks
    if study is not None and (reported := resolved_yaml(study)) != loaded.meta.get("resolved_study"):
        # e.g. `ablate report STUDY ~variants.x`, or a study file changed since the run: show what is reported
        loaded.meta["resolved_study"], loaded.meta["study_as_reported"] = reported, True
    stopping.check()  # safe points around the report's stages: a stop is honoured while it is written
    paths = write_report(
        loaded.results,
        loaded.units,
        loaded.curves,
        settings,
        out_dir,
        failures=loaded.failures,
        meta=loaded.meta,
    )
    stopping.check()
    attach_report(tracking_uri, experiment, paths)  # to the study's MLflow run
    loaded.comparisons = pd.read_csv(paths["comparisons"])
    if quiet:
        return paths, loaded
    shown, settings = resampled_for_report(loaded.results, loaded.units, settings)  # as the report
    primary = comparisons(shown, loaded.units, settings, settings.primary)
    flags = not_converged(shown, loaded.curves, settings, [r.variant for r in primary])
    table = format_table(compare(shown, loaded.units, settings, settings.primary), settings)
    lines = [table, "", headline(primary, settings)]
    lines += [f"- {sentence}" for sentence in verdict_sentences(primary, settings)]
    lines += [f"warning: {line}" for line in warning_lines(flags, settings) + precision_warnings(shown)]
    out.print("\n".join(lines), markup=False, highlight=False, soft_wrap=True)
    return paths, loaded


def report_settings(stored, study: Study | None):
    """Report settings (``stats.ReportSettings``): the study file's when given (alpha etc. may be
    changed after the run), else those stored with the study in the tracking store (None: none)."""
    settings = study.report_settings() if study is not None else stored
    if settings is None:
        raise AblateError("the tracking store holds no report settings for this study; pass the study file")
    notes = [f"variants: {', '.join(settings.variants)}"] if settings.variants else []
    return settings.model_copy(update={"notes": notes})

"""A study over several data sets (``task.data: [beauty, sports, video]``): one study per data set,
each the study file with ``task.data=<entry>`` and ``name=<study>.<data set>`` as overrides, so
that a trial is a (variant, seed, data set) — its data set's experiment, store and fingerprint —
and workers, resumption and reuse work as for any study. ``ablate run`` trains and reports each
in turn, then writes the across-data-set report (:mod:`ablate.stats.across`,
:mod:`ablate.report.across`) to ``<reports>/<study>/`` (``runs/<study>/report/`` without
``--reports``); the data sets' own reports go to ``<reports>/<study>/<study>.<data set>/`` (their
output folders' ``report/`` without it). ``ablate status`` and ``ablate plan`` show each data
set's study, then the across-data-set step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ablate.commands.console import err, out
from ablate.study.load import Study
from ablate.study.several import data_set_folders, per_dataset, several


def run_across(study: Study, output: Path | None, reports: Path | None, *args: Any) -> list:
    """Train and report every data set's study, one after another (``args``:
    :func:`~ablate.commands.running.run_and_report`'s quiet, retry_failed, workers, storage, tracking_uri,
    then ``(gpus, per_gpu)`` or None, reuse, rebuild_queue and the SLURM settings or None), then
    write the across-data-set report. ``--gpus`` is planned for each data set (its items set the
    embedding's size, so a trial's memory); SLURM jobs are one array per data set, every array
    submitted before the first is followed, so that a lost login shell loses no data set (a rerun
    follows the jobs still queued instead of submitting more). Returns the failures standing in
    any of them."""
    from ablate.commands.running import run_and_report

    quiet, retry_failed, workers, storage, tracking_uri, gpus, reuse, rebuild_queue, jobs = args
    failed, done = [], {}
    submitted = {} if jobs is None else _submit_all(study, output, args)
    for label, sub in per_dataset(study).items():
        err.print(f"data set {label}: study {sub.name}", markup=False, highlight=False)
        sub_output, sub_reports = data_set_folders(study, label, output, reports)
        placement, sub_workers = None, workers
        if gpus is not None:
            from ablate.commands.gpus import plan_gpus

            placement = plan_gpus(sub, *gpus, workers)
            sub_workers = placement.workers
            if not quiet:
                err.print(placement.describe(), markup=False, highlight=False, soft_wrap=True)
        options = dict(quiet=quiet, retry_failed=retry_failed, storage=storage, reuse=reuse, slurm=jobs)
        ran = run_and_report(
            sub,
            sub_output,
            sub_reports,
            workers=sub_workers,
            gpus=placement,
            tracking_uri=tracking_uri,
            rebuild_queue=rebuild_queue,
            submitted=submitted.get(label),
            **options,
        )
        failed += ran.failed
        done[label] = (sub, ran.results, ran.paths["md"])
    write_across_report(study, done, report_dir(study, output, reports))
    return failed


def _submit_all(study: Study, output: Path | None, args: tuple) -> dict[str, list[str]]:
    """Every data set's SLURM array, submitted now (each with its stores and queues made first)."""
    from ablate.commands.running import check_folders
    from ablate.commands.slurm import start_jobs
    from ablate.drive import Donors, Stores

    _, retry_failed, workers, storage, tracking_uri, _, reuse, _, jobs = args
    donors = reuse if isinstance(reuse, Donors) else Donors(reuse or ())
    submitted = {}
    for label, sub in per_dataset(study).items():
        stores = Stores.for_study(sub, data_set_folders(study, label, output, None)[0], tracking_uri, storage)
        check_folders(sub, stores, output)
        submitted[label] = start_jobs(sub, stores, workers, jobs, retry_failed, donors)
    return submitted


def report_across(
    study: Study, output: Path | None, reports: Path | None, tracking_uri: str | None, trials: Path | None
) -> None:
    """Rebuild every data set's report and the across-data-set report from the tracking stores;
    with ``trials``, first write every data set's finished trials there as trial files (one
    folder: a trial file's name holds its fingerprint, which holds the data set, so ``--reuse
    DIR`` finds each data set's own)."""
    subs = {
        label: (sub, *data_set_folders(study, label, output, reports))
        for label, sub in per_dataset(study, check_files=False).items()
    }
    done = report_each(subs, tracking_uri, trials)
    write_across_report(study, done, report_dir(study, output, reports))


def report_each(
    subs: dict[str, tuple[Study, Path | None, Path | None]], tracking_uri: str | None, trials: Path | None
) -> dict[str, tuple[Study, Any, Path]]:
    """The reports of a study's sub-studies (label → its study, --output and --reports folders:
    data sets, ladder rungs) rebuilt from their stores, after writing their finished trials to
    ``trials`` when given (a sub-study that cannot make a report yet still has its trials
    written). Returns label → (study, results, report.md) for the report over them."""
    from ablate.commands.running import check_folders, write_study_report
    from ablate.drive import Stores, write_trials

    wanted = {}
    for label, (sub, sub_output, sub_reports) in subs.items():
        stores = Stores.for_study(sub, sub_output, tracking_uri)
        out_dir = sub_reports / sub.name if sub_reports else stores.output_dir / "report"
        check_folders(sub, stores, sub_output, sub_reports, out_dir, trains=False)
        wanted[label] = (sub, stores, out_dir)
    if trials is not None:
        for label, (sub, stores, _) in wanted.items():
            written, kept = write_trials(stores.tracking_uri, sub.name, trials)
            held = f" ({kept} left as they were: a file there holds the trial from another run)" * bool(kept)
            err.print(f"trials of {label}: {len(written)} file(s) in {trials}{held}", markup=False)
    done = {}
    for label, (sub, stores, out_dir) in wanted.items():
        paths, results = write_study_report(stores.tracking_uri, sub.name, out_dir, sub)
        shown = f"report of {label}: {paths['html'].resolve()}"
        out.print(shown, markup=False, highlight=False, soft_wrap=True)
        done[label] = (sub, results, paths["md"])
    return done


def show_status(study: Study, output: Path | None, storage: str | None) -> None:
    """``ablate status``: the study's trials per variant (done / running / failed / left), its
    ETA and SLURM jobs; for a study over several data sets each data set's, then where the
    across-data-set report stands."""
    if not several(study):
        _status_of(study, output, storage)
        return
    finished = []
    for label, sub in per_dataset(study, check_files=False).items():
        out.print(f"data set {label}:", markup=False, highlight=False)
        if _status_of(sub, data_set_folders(study, label, output, None)[0], storage):
            finished.append(label)
    k = len(study.dataset.entries)
    where = report_dir(study, output, None) / "across_datasets.md"
    if len(finished) < k:
        which = f" ({', '.join(finished)})" if finished else ""
        line = f"{len(finished)} of {k} data sets finished{which}; across_datasets.md follows the last"
    elif where.is_file():
        line = f"every data set finished: {where}"
    else:
        line = (
            f"every data set finished; across_datasets.md is in the --reports folder the run was given "
            f"(`ablate report {study.path}` writes it again)"
        )
    out.print(f"across data sets: {line}", markup=False, highlight=False, soft_wrap=True)


def _status_of(study: Study, output: Path | None, storage: str | None) -> bool:
    """One study's status lines; whether every trial of it has ended (none left or running)."""
    from ablate.commands.configurations import not_here
    from ablate.commands.progress import status_report
    from ablate.commands.slurm import show_jobs
    from ablate.drive import Stores, plan, progress
    from ablate.drive.recovery import check_stores

    stores = Stores.for_study(study, output, storage=storage)
    check_stores(study, stores)  # says what `run` would say of a lost store
    if not stores.started():
        design = study.spec.sequential
        first = f" at the first look, up to {len(study.variants) * design.max}" if design else ""
        where = not_here(study, stores.output_dir, "status")
        out.print(
            f"{study.name}: not started ({len(plan(study))} trials planned{first}){where}", markup=False
        )
        return False
    table, lines = status_report(study, stores)
    out.print(table)
    for line in lines:
        out.print(line, markup=False, highlight=False, soft_wrap=True)
    show_jobs(stores.output_dir)  # `ablate run --launcher slurm`'s jobs: state and log
    return not sum(r.left + r.running for r in progress(study, stores).values())


def report_dir(study: Study, output: Path | None, reports: Path | None) -> Path:
    """Where a study of sub-studies (data sets, ladder rungs) writes the report over them."""
    if reports:
        return reports / study.name
    return Path(output or study.spec.output or Path("runs") / study.name) / "report"


def write_across_report(
    study: Study, done: dict[str, tuple[Study, Any, Path]], out_dir: Path
) -> dict[str, Path]:
    """across_datasets.md / .csv from each data set's study, results and report."""
    from ablate.report.across import write_across
    from ablate.stats import compare
    from ablate.stats.across import across_datasets, dataset_ranks

    settings = next(iter(done.values()))[0].report_settings()
    metric, baseline, alpha = settings.primary, settings.baseline, settings.alpha
    higher = settings.higher(metric)
    per = {label: results.results for label, (_, results, _) in done.items()}
    compared = {
        label: compare(results.results, results.units, sub.report_settings(), metric)
        for label, (sub, results, _) in done.items()
    }
    table = across_datasets(per, compared, metric, baseline, higher, alpha)
    ranks = dataset_ranks(per, metric, higher, alpha)
    paths = write_across(
        out_dir, study.name, table, ranks, metric, baseline, {k: v[2] for k, v in done.items()}
    )
    for row in table.itertuples():
        out.print(f"across data sets: {row.variant}: {row.verdict} ({row.per_dataset})", markup=False)
    out.print(f"across data sets: {paths['md'].resolve()}", markup=False, highlight=False, soft_wrap=True)
    return paths

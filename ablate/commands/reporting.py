"""`ablate report`: a study's report rebuilt from its tracking store alone (no training) — one
study's, each rung's and the ladder's, or each data set's and the across-data-set one — and
with ``--trials`` every finished trial written as a file ``--reuse`` reads."""

from __future__ import annotations

from pathlib import Path

from ablate.commands.across import report_across
from ablate.commands.console import err, out
from ablate.commands.ladder import report_ladder
from ablate.commands.running import check_folders, write_study_report
from ablate.drive import Stores, folder_problem, write_trials
from ablate.errors import AblateError
from ablate.study.ladder import laddered
from ablate.study.load import load_study
from ablate.study.several import several
from ablate.tracking.store import tracking_problem


def rebuild_report(
    study_file: Path | None,
    overrides: list[str] | None,
    output: Path | None,
    reports: Path | None,
    experiment: str | None,
    tracking_uri: str | None,
    trials: Path | None,
) -> None:
    """`ablate report`: the report rebuilt from the tracking store alone (no training), from a study
    file or an experiment in a tracking store; with ``trials``, each finished trial as a file."""
    if trials is not None and (problem := folder_problem(trials)):
        raise AblateError(f"--trials {trials}: {problem}")
    if study_file is not None:
        study = load_study(study_file, check_files=False, overrides=overrides or ())
        if laddered(study):  # each rung's trials and report, then the ladder report
            return report_ladder(study, output, reports, tracking_uri, trials)
        if several(study):  # each data set's trials and report, then the across-data-set report
            return report_across(study, output, reports, tracking_uri, trials)
        stores = Stores.for_study(study, output, tracking_uri)
        out_dir = reports / study.name if reports else stores.output_dir / "report"
        check_folders(study, stores, output, reports, out_dir, trains=False)
        if tracking_uri is None and not stores.started():  # perhaps run with overrides: say where
            from ablate.commands.configurations import not_here

            if where := not_here(study, stores.output_dir, "report"):  # else: the store's own line
                ran = f"{study.name}: no trials in {stores.output_dir} (has the study been run?)"
                raise AblateError(f"{ran}{where}")
        uri, experiment = stores.tracking_uri, study.name
    elif experiment and tracking_uri:
        if problem := tracking_problem(tracking_uri):
            raise AblateError(f"--tracking-uri {tracking_uri}: {problem}")
        out_dir = reports / experiment if reports else Path("runs") / experiment / "report"
        if problem := folder_problem(out_dir):
            raise AblateError(f"--reports {reports}: {problem}" if reports else problem)
        uri, study = tracking_uri, None
    else:
        raise AblateError("give a study file, or both --experiment and --tracking-uri")
    if trials is not None:  # first: a half-finished study may not make a report yet, its trials do
        written, kept = write_trials(uri, experiment, trials)
        held = f" ({kept} left as they were: a file there holds the trial from another run)" if kept else ""
        err.print(f"trials: {len(written)} file(s) in {trials}{held}", markup=False, highlight=False)
    paths, _ = write_study_report(uri, experiment, out_dir, study)
    out.print(f"report: {paths['html'].resolve()}", markup=False, highlight=False, soft_wrap=True)

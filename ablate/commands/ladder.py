"""A study over a ladder of model sizes (``ladder: {rungs: …}``): one study per rung
(:mod:`ablate.study.ladder`), so a trial is a (variant, seed, rung) — its rung's experiment, store
and fingerprint — and workers, resumption and reuse work as for any study. ``ablate run`` trains
and reports each rung in turn (smallest first, as the file lists them), then writes the ladder
report (:mod:`ablate.stats.ladder`, :mod:`ablate.report.ladder`) to ``<reports>/<study>/``
(``runs/<study>/report/`` without ``--reports``); ``ablate report`` rebuilds them all, ``ablate
status`` and ``ablate plan`` show each rung's study. A worker, ``--gpus``, SLURM and ``--pilot``
take one rung's study (its overrides: :func:`~ablate.study.ladder.rung_overrides`)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ablate.commands.across import report_dir, report_each
from ablate.commands.console import err, out
from ablate.errors import AblateError
from ablate.study.ladder import per_rung, rung_folder
from ablate.study.load import Study


def _folders(study: Study, rung: str, output: Path | None, reports: Path | None):
    return rung_folder(study, rung, output), (reports / study.name if reports else None)


def run_ladder(study: Study, output: Path | None, reports: Path | None, *args: Any) -> list:
    """Train and report every rung's study, one after another (``args``: quiet, retry_failed,
    workers, storage, tracking_uri, reuse, rebuild_queue), then write the ladder report. Returns
    the failures standing in any of them."""
    from ablate.commands.running import run_and_report

    quiet, retry_failed, workers, storage, tracking_uri, reuse, rebuild_queue = args
    failed, done = [], {}
    for rung, sub in per_rung(study).items():
        err.print(f"ladder rung {rung}: study {sub.name}", markup=False, highlight=False)
        sub_output, sub_reports = _folders(study, rung, output, reports)
        ran = run_and_report(
            sub,
            sub_output,
            sub_reports,
            quiet=quiet,
            retry_failed=retry_failed,
            workers=workers,
            storage=storage,
            tracking_uri=tracking_uri,
            reuse=reuse,
            rebuild_queue=rebuild_queue,
        )
        failed += ran.failed
        done[rung] = (sub, ran.results, ran.paths["md"])
    write_ladder_report(study, done, report_dir(study, output, reports))
    return failed


def report_ladder(
    study: Study, output: Path | None, reports: Path | None, tracking_uri: str | None, trials: Path | None
) -> None:
    """Rebuild every rung's report and the ladder report from the tracking stores; with
    ``trials``, first write every rung's finished trials there as trial files (one folder: a
    trial file's name holds its fingerprint, which holds the rung's settings)."""
    rungs = per_rung(study, check_files=False)
    subs = {rung: (sub, *_folders(study, rung, output, reports)) for rung, sub in rungs.items()}
    write_ladder_report(study, report_each(subs, tracking_uri, trials), report_dir(study, output, reports))


def show_ladder_status(study: Study, output: Path | None, storage: str | None) -> None:
    """``ablate status`` of a ladder: each rung's study, then where the ladder report stands."""
    from ablate.commands.across import show_status

    for rung, sub in per_rung(study, check_files=False).items():
        out.print(f"ladder rung {rung}:", markup=False, highlight=False)
        show_status(sub, rung_folder(study, rung, output), storage)
    where = report_dir(study, output, None) / "ladder.md"
    state = f"written: {where}" if where.is_file() else "follows the last rung's report"
    out.print(f"ladder report: {state}", markup=False, highlight=False, soft_wrap=True)


def write_ladder_report(
    study: Study, done: dict[str, tuple[Study, Any, Path]], out_dir: Path
) -> dict[str, Path]:
    """ladder.md / .csv from each rung's study, results and report; the margin of each variant is
    the mean of its rungs' comparison margins (metric units)."""
    from ablate.report.ladder import write_ladder
    from ablate.stats import compare
    from ablate.stats.ladder import ladder_table

    settings = next(iter(done.values()))[0].report_settings()
    metric, baseline, alpha = settings.primary, settings.baseline, settings.alpha
    per = {rung: results.results for rung, (_, results, _) in done.items()}
    margins: dict[str, list[float]] = {}
    for sub, results, _ in done.values():
        compared = compare(results.results, results.units, sub.report_settings(), metric)
        for row in compared.itertuples():
            if row.variant != baseline and math.isfinite(row.margin):
                margins.setdefault(row.variant, []).append(float(row.margin))
    mean_margins = {v: sum(m) / len(m) for v, m in margins.items()}
    ladder = study.spec.ladder
    try:
        tables = ladder_table(per, mean_margins, metric, baseline, alpha, ladder.target, ladder.scale)
    except ValueError as exc:  # a rung with no size to place it by (no training GFLOP recorded)
        raise AblateError(f"{study.path}: ladder.scale: {exc}") from None
    trends, rungs, points = tables
    reports = {rung: path for rung, (_, _, path) in done.items()}
    paths = write_ladder(out_dir, study.name, (trends, rungs, points), metric, baseline, reports, alpha)
    for row in trends.itertuples():
        out.print(f"ladder: {row.variant}: trend: {row.trend}", markup=False, highlight=False)
    out.print(f"ladder: {paths['md'].resolve()}", markup=False, highlight=False, soft_wrap=True)
    return paths

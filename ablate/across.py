"""A study over several data sets (``task.data: [beauty, sports, video]``): one study per data set,
each the study file with ``task.data=<entry>`` and ``name=<study>.<data set>`` as overrides, so
that a trial is a (variant, seed, data set) — its data set's experiment, store and fingerprint —
and workers, resumption and reuse work as for any study. ``ablate run`` trains and reports each
in turn, then writes the across-data-set report (:mod:`ablate.stats.across`,
:mod:`ablate.report.across`) to ``<reports>/<study>/`` (``runs/<study>/report/`` without
``--reports``); the data sets' own reports go to ``<reports>/<study>/<study>.<data set>/`` (their
output folders' ``report/`` without it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .console import err, out
from .datasets import entry_override, label_of
from .errors import AblateError
from .study import Study, load_study


def several(study: Study) -> bool:
    """Whether the study lists several data sets."""
    return study.dataset is not None and len(study.dataset.entries) > 1


def dataset_overrides(study: Study, entry: Any) -> list[str]:
    """The overrides that make the study file one data set's study."""
    return [*study.overrides, entry_override(entry), f"name={study.name}.{label_of(entry)}"]


def per_dataset(study: Study, check_files: bool = True) -> dict[str, Study]:
    """Data set → its study (loaded with :func:`dataset_overrides`)."""
    entries = study.dataset.entries if study.dataset is not None else ()
    return {label_of(e): load_study(study.path, check_files, dataset_overrides(study, e)) for e in entries}


def _where(
    study: Study, label: str, output: Path | None, reports: Path | None
) -> tuple[Path | None, Path | None]:
    """A data set's --output (under the study's --output or ``output:``, each its own folder) and
    --reports (under the study's)."""
    base = output or study.spec.output
    return (Path(base) / label if base else None), (reports / study.name if reports else None)


def run_across(study: Study, output: Path | None, reports: Path | None, *args: Any) -> list:
    """Train and report every data set's study (``args``: :func:`~ablate.running.run_and_report`'s
    quiet, retry_failed, workers, storage, tracking_uri, gpus, reuse, rebuild_queue, launcher), then write
    the across-data-set report. Returns the failures standing in any of them."""
    from .running import run_and_report

    quiet, retry_failed, workers, storage, tracking_uri, gpus, reuse, rebuild_queue, launcher = args
    if gpus is not None or getattr(launcher, "value", launcher) != "local":
        raise AblateError("--gpus and --launcher slurm take one data set: add task.data=NAME to run each")
    failed, done = [], {}
    for label, sub in per_dataset(study).items():
        err.print(f"data set {label}: study {sub.name}", markup=False, highlight=False)
        sub_output, sub_reports = _where(study, label, output, reports)
        options = dict(quiet=quiet, retry_failed=retry_failed, workers=workers, storage=storage, reuse=reuse)
        ran = run_and_report(
            sub, sub_output, sub_reports, tracking_uri=tracking_uri, rebuild_queue=rebuild_queue, **options
        )
        failed += ran.failed
        done[label] = (sub, ran.results, ran.paths["md"])
    write_across_report(study, done, _across_dir(study, output, reports))
    return failed


def report_across(study: Study, output: Path | None, reports: Path | None, tracking_uri: str | None) -> None:
    """Rebuild every data set's report and the across-data-set report from the tracking stores."""
    from .drive import Stores
    from .running import write_study_report

    done = {}
    for label, sub in per_dataset(study, check_files=False).items():
        sub_output, sub_reports = _where(study, label, output, reports)
        stores = Stores.for_study(sub, sub_output, tracking_uri)
        out_dir = sub_reports / sub.name if sub_reports else stores.output_dir / "report"
        paths, results = write_study_report(stores.tracking_uri, sub.name, out_dir, sub)
        done[label] = (sub, results, paths["md"])
    write_across_report(study, done, _across_dir(study, output, reports))


def _across_dir(study: Study, output: Path | None, reports: Path | None) -> Path:
    if reports:
        return reports / study.name
    return Path(output or study.spec.output or Path("runs") / study.name) / "report"


def write_across_report(
    study: Study, done: dict[str, tuple[Study, Any, Path]], out_dir: Path
) -> dict[str, Path]:
    """across_datasets.md / .csv from each data set's study, results and report."""
    from .report.across import write_across
    from .stats import compare
    from .stats.across import across_datasets, dataset_ranks

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

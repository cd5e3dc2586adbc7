"""``write_report``: the statistics, tables, figures and text of a study assembled into one
document and written as ``report.md``, ``report.html``, ``table.tex``, the CSV files and
``figures/``.

The document reads like a paper: the results first (the primary verdicts, one table of variants ×
every metric, convergence warnings), then each metric's detail and the analyses that follow from
them, then the Methods (how the numbers were computed, the data, the configuration).

Two steps: :func:`analyse` computes what the report says (:class:`Analysis`: typed comparison rows
per metric, the ranking, the convergence flags, the calibration), :func:`render` writes it as
files; nothing in the second computes a test."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pandas as pd

from ablate import stats, stopping
from ablate.report.baselines import baseline_warnings, trivial_baselines
from ablate.report.cells import isnan
from ablate.report.convergence import NotConverged, not_converged, warning_lines
from ablate.report.document import Element, to_html, to_markdown
from ablate.report.factorial import factorial_elements
from ablate.report.figures import (
    cd_figure,
    cost_figure,
    cost_time,
    cost_work,
    curves_figure,
    pairwise_figure,
    strip_figure,
)
from ablate.report.gradnorms import CAPTION, grad_norm_elements, grad_norm_figure
from ablate.report.methods import calibration, methods_elements, seeds_by_label
from ablate.report.overview import overview_latex, overview_legend, overview_rows
from ablate.report.sequential import sequential_elements
from ablate.report.tables import cost_table, table_rows
from ablate.report.text import friedman_text, pairwise_text
from ablate.report.verdicts import exploratory_text, headline, verdict_sentences
from ablate.stats import ComparisonRow, ReportSettings
from ablate.stats.resample import resampled_for_report


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text.replace("@", "_at_"))


def _failures_section(failures: pd.DataFrame | None) -> list[Element]:
    if failures is None or failures.empty:
        return []
    rows = [[str(r.variant), str(r.seed), str(r.reason)] for r in failures.itertuples()]
    return [
        Element("h2", "Failed trials"),
        Element(
            "p",
            f"{len(rows)} trial(s) failed and are left out of every comparison above; "
            "`ablate run --retry-failed` trains them again.",
        ),
        Element("table", headers=["variant", "seed", "reason"], items=rows, left=3),
    ]


def _tuning_sections(results: pd.DataFrame, names: list[str]) -> list[Element]:
    """Searched parameters and parameter matching per variant, when the study used them."""
    elements = []
    search = [c for c in results.columns if c.startswith("search.")]
    if search:
        rows = [[n, *[str(results.loc[results.variant == n, c].iloc[0]) for c in search]] for n in names]
        elements += [
            Element("h2", "Searched parameters"),
            Element(
                "p",
                "Each variant's best parameters from its own search (equal trial budget "
                "per variant, validation metric), then trained over every seed.",
            ),
            Element(
                "table", headers=["variant", *[c.removeprefix("search.") for c in search]], items=rows, left=1
            ),
        ]
    if "match.params" in results.columns:
        knobs = [c for c in results.columns if c.startswith("match.model.")]
        rows = []
        for n in names:
            first = results[results.variant == n].iloc[0]
            scaled = (
                "; ".join(f"{c.removeprefix('match.')} = {first[c]}" for c in knobs if not isnan(first[c]))
                or "—"
            )
            rows.append(
                [
                    n,
                    f"{int(first['match.before']):,}",
                    f"{int(first['match.params']):,}",
                    f"{int(first['match.base_params']):,}",
                    scaled,
                ]
            )
        elements += [
            Element("h2", "Parameter matching"),
            Element(
                "p",
                "match_params: each variant's width knob scaled so its backbone has the "
                "baseline's parameter count within 2% (embedding and head are shared and "
                "not counted).",
            ),
            Element(
                "table",
                items=rows,
                left=1,
                headers=["variant", "backbone params before", "after", "baseline", "knob"],
            ),
        ]
    return elements


def store_shown(tracking: dict) -> str:
    """The study's tracking store as the report names it, the same on every machine: a SQLite file
    relative to the working folder (else by its name, in the study's output folder); a server
    without its user and password, linked to the study's run where it is MLflow's web UI."""
    uri, run = tracking["uri"], tracking["run"]
    if uri.startswith("sqlite:///"):
        db = Path(uri.removeprefix("sqlite:///"))
        try:
            return f"`{db.resolve().relative_to(Path.cwd().resolve()).as_posix()}`"
        except ValueError:
            return f"`{db.name}` in the study's output folder"
    parts = urlsplit(uri)
    host = (parts.hostname or "") + (f":{parts.port}" if parts.port else "")
    clean = parts._replace(netloc=host).geturl() if parts.username or parts.password else uri
    if parts.scheme in ("http", "https"):
        return f"[{clean}]({clean.rstrip('/')}/#/experiments/{tracking['experiment']}/runs/{run})"
    return f"`{clean}`"


def files_list(paths: dict[str, Path], out_dir: Path, meta: dict | None) -> list[str]:
    """The report's files, each a link relative to the report's folder, and where the study's
    MLflow records are."""
    figures = [p for name, p in paths.items() if p.suffix == ".png"]
    shown = ", ".join(f"[{p.name}]({p.relative_to(out_dir).as_posix()})" for p in figures)
    items = [
        "[results.csv](results.csv): one row per trial (what the report is built from), with each "
        "trial's MLflow run id (`run_id`)",
        "[comparisons.csv](comparisons.csv): every comparison with the baseline, every metric: the verdict "
        "and its numbers, raw and adjusted p-values, and what the tables leave out (the per-unit tests, "
        "the bootstrap interval)",
        "[pairwise.csv](pairwise.csv): every pair of variants on the primary metric",
        "[table.tex](table.tex): the results table, variants × every metric with the verdict marks "
        "(LaTeX: booktabs, graphicx)",
        f"figures/: the figures above as PNG{': ' + shown if shown else ''}",
    ]
    tracking = (meta or {}).get("tracking")
    if tracking:
        run, where = tracking["run"], store_shown(tracking)
        items.append(
            f"MLflow: the study's run `{run}` in {where} (experiment {tracking['experiment']}): the resolved "
            "study, the data summary, the trivial baselines (baselines.json) and this report; each trial's "
            "run holds its parameters, curves and per-unit test results"
        )
    return items


@dataclass(frozen=True)
class Analysis:
    """What a report says, before it is written."""

    results: pd.DataFrame  # the trials as compared (each seed's own test units when resample_units)
    curves: pd.DataFrame | None
    settings: ReportSettings  # as compared (resampling noted)
    tables: dict[str, list[ComparisonRow]]  # metric → each variant against the baseline; primary first
    names: list[str]  # the variants, baseline first
    friedman: dict | None  # stats.friedman on the primary metric (None: fewer than 3 variants or seeds)
    pairs: pd.DataFrame  # stats.pairwise: every pair of variants, primary metric
    flags: list[NotConverged]
    calibrated: dict | None  # the verdicts' simulated error rates (methods.calibration)


def analyse(
    results: pd.DataFrame, units: pd.DataFrame | None, curves: pd.DataFrame | None, settings: ReportSettings
) -> Analysis:
    """The statistics of a report: every comparison, the ranking, convergence, calibration."""
    results, settings = resampled_for_report(results, units, settings)  # report.resample_units
    tables = {}
    for metric in settings.metrics:  # a safe point per metric: its per-unit tests may take a while
        stopping.check()
        tables[metric] = stats.comparisons(results, units, settings, metric)
    primary = tables[settings.primary]
    names = [r.variant for r in primary]
    return Analysis(
        results=results,
        curves=curves,
        settings=settings,
        tables=tables,
        names=names,
        friedman=stats.friedman(results, settings.primary, settings.higher(settings.primary), settings.alpha),
        pairs=stats.pairwise(results, settings),
        flags=not_converged(results, curves, settings, names),
        calibrated=calibration(primary, settings),
    )


def write_report(
    results: pd.DataFrame,
    units: pd.DataFrame | None,
    curves: pd.DataFrame | None,
    settings: ReportSettings,
    out_dir: Path,
    failures: pd.DataFrame | None = None,
    meta: dict | None = None,
) -> dict[str, Path]:
    """Write the report files into ``out_dir``; return their paths by name.

    ``meta``: what the store recorded beside the trials (``Results.meta``: version, commit, data
    summary, resolved study, cost note); each part is shown when present (see :mod:`.methods`).

    Names: ``csv`` (results.csv, the frame as given), ``comparisons`` (every ``stats.compare`` row
    for every metric), ``pairwise`` (every ``stats.pairwise`` row, primary metric), ``tex``
    (table.tex: variants × every metric), ``md``, ``html``, and one per figure drawn: ``seeds``
    (primary metric) and ``seeds:<metric>`` per secondary metric, ``curves`` (when curves are
    non-empty), ``cd`` (when the Friedman test is available), ``pairwise_fig`` (≥ 2 variants),
    ``cost_quality`` (when a time or parameter column exists).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    csv = out_dir / "results.csv"
    results.to_csv(csv, index=False)
    return {"csv": csv} | render(analyse(results, units, curves, settings), out_dir, failures, meta)


def precision_warnings(results: pd.DataFrame) -> list[str]:
    """A line when the trials trained in more than one precision (`train.precision: auto` is bf16
    on CUDA and fp32 elsewhere, and an auto study counts trials trained in either: one continued on
    another device, or trial files reused from one, mix them silently). Trials from before the
    precision was recorded count as unknown and raise nothing."""
    if "precision" not in results or results["precision"].nunique() < 2:
        return []
    recorded = results.dropna(subset=["precision"]).sort_values(["precision", "variant", "seed"])
    trials = zip(recorded["variant"], recorded["seed"], recorded["precision"], strict=True)
    groups = [f"{precision} ({seeds})" for precision, seeds in seeds_by_label(list(trials)).items()]
    return [
        f"the trials trained in more than one precision: {', '.join(groups)}; `train.precision: auto` "
        "is bf16 on CUDA and fp32 elsewhere and counts trials of either, so these verdicts mix the two: set "
        "`train.precision` (fp32 or bf16) and train the others again, or compare within one precision"
    ]


def render(
    analysis: Analysis, out_dir: Path, failures: pd.DataFrame | None = None, meta: dict | None = None
) -> dict[str, Path]:
    """Write ``analysis`` into ``out_dir`` as comparisons.csv, pairwise.csv, table.tex, the
    figures, report.md and report.html (:func:`write_report` names them)."""
    results, curves, settings, tables = analysis.results, analysis.curves, analysis.settings, analysis.tables
    names, fr, pairs, flags = analysis.names, analysis.friedman, analysis.pairs, analysis.flags
    primary = tables[settings.primary]
    fig_dir = out_dir / "figures"
    fig_dir.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {"comparisons": out_dir / "comparisons.csv"}
    frames = [stats.comparison_frame(rows) for rows in tables.values()]
    pd.concat(frames, ignore_index=True).to_csv(paths["comparisons"], index=False)
    paths["pairwise"] = out_dir / "pairwise.csv"
    pairs.to_csv(paths["pairwise"], index=False)
    paths["tex"] = out_dir / "table.tex"
    baselines = trivial_baselines(meta)  # the task's, as the study's run keeps them
    paths["tex"].write_text(overview_latex(tables, settings, baselines), encoding="utf-8")

    overview_headers, overview = overview_rows(tables, settings, baselines)
    elements = [
        Element("h1", f"Ablation report: {settings.study}"),
        Element("p", headline(primary, settings)),
        *[Element("list", items=said) for said in [verdict_sentences(primary, settings)] if said],
        Element("table", headers=overview_headers, items=overview),
        Element("caption", overview_legend(tables, settings, baselines)),
    ]
    below = baseline_warnings(tables, settings, baselines) + precision_warnings(results)
    if flags or below:
        elements.append(Element("warnings", items=warning_lines(flags, settings) + below))
    if flags:
        elements.append(
            Element(
                "p",
                "Variants flagged not converged were still improving when training stopped: their verdicts "
                "compare models that more epochs would change (Methods, Convergence).",
            )
        )

    def figure(name: str, path: Path | None, caption: str) -> None:
        stopping.check()  # a safe point between figures: SIGTERM / Ctrl-C stop the report here
        if path is not None:
            paths[name] = path
            elements.append(Element("figure", caption, path=path))

    for i, (metric, cmp) in enumerate(tables.items()):
        headers, rows = table_rows(cmp, settings, baselines)
        if i == 0:
            elements.append(Element("h2", f"Primary metric: {metric}"))
        else:
            elements.append(Element("h2", f"Secondary metric (exploratory): {metric}"))
            if said := verdict_sentences(cmp, settings):  # a baseline alone has nothing to say here
                elements += [Element("p", exploratory_text(cmp, settings)), Element("list", items=said)]
        elements.append(Element("table", headers=headers, items=rows))
        name, file = ("seeds", "seeds.png") if i == 0 else (f"seeds:{metric}", f"seeds_{_slug(metric)}.png")
        figure(
            name,
            strip_figure(results, settings, names, fig_dir / file, metric),
            f"Test {metric} per seed by variant (box: spread over seeds; dashed: baseline mean).",
        )

    elements += factorial_elements(results, settings)
    elements += sequential_elements(results, settings)  # [] for a fixed list of seeds
    cost = cost_table(results, names)
    if cost:
        elements += [
            Element("h2", "Cost (mean per trial over seeds)"),
            Element("table", headers=cost[0], items=cost[1], left=1),
            Element("p", "How the costs were measured: Methods, Costs."),
        ]
        clock = "CPU time" if cost_time(results)[0] == "cpu_s" else "wall time"
        if cost_work(results)[0]:
            clock = f"training GFLOP (the same at any machine load), {clock}"
        figure(
            "cost_quality",
            cost_figure(results, primary, settings, names, fig_dir / "cost_quality.png"),
            f"Cost vs. quality: test {settings.primary} mean ± sd over seeds against {clock} per "
            "trial (± sd) and parameter count, one point per variant (◆ baseline).",
        )

    elements += _tuning_sections(results, names) + _failures_section(failures)
    elements += [Element("h2", "Ranking"), Element("p", friedman_text(fr, settings, len(names)))]
    if fr is not None:
        figure(
            "cd",
            cd_figure(fr, settings, fig_dir / "cd.png"),
            f"Critical-difference diagram (Demšar 2006) over the seeds: mean rank on test {settings.primary} "
            f"(1 = best); variants joined by a thick line are not separated by the Nemenyi test at "
            f"α = {settings.alpha:g}.",
        )
    if len(pairs):
        elements.append(Element("p", pairwise_text(pairs, settings, fr)))
        figure(
            "pairwise_fig",
            pairwise_figure(pairs, settings, names, fig_dir / "pairwise.png"),
            f"Pairwise {settings.correction_method.label}-adjusted p-values "
            f"(paired t-test across seeds) on test {settings.primary}; * p < {settings.alpha:g}; "
            f"n/a: fewer than {stats.MIN_SEEDS_TEST} paired seeds.",
        )

    curve_path = curves_figure(curves, settings, names, fig_dir / "curves.png")
    if curve_path is not None:
        elements.append(Element("h2", "Learning curves"))
        figure(
            "curves",
            curve_path,
            f"Validation {settings.primary} (and training loss, when logged) "
            "per epoch: mean over seeds, band ± 1 sd.",
        )
    elements += grad_norm_elements(curves, names)  # [] when no gradient norms were logged
    figure("grad_norms", grad_norm_figure(curves, names, fig_dir / "grad_norms.png"), CAPTION)

    has_curves = curve_path is not None
    tested_pairs = int(pairs["p"].notna().sum())
    elements += methods_elements(settings, tables, flags, has_curves, tested_pairs, meta, analysis.calibrated)
    elements += [Element("h2", "Files"), Element("list", items=files_list(paths, out_dir, meta))]

    paths["md"] = out_dir / "report.md"
    paths["md"].write_text(to_markdown(elements, out_dir), encoding="utf-8")
    paths["html"] = out_dir / "report.html"
    paths["html"].write_text(to_html(elements, f"Ablation report: {settings.study}"), encoding="utf-8")
    return paths

"""The across-data-set report of a study listing several data sets: across_datasets.md (each
variant's verdict per data set and over them, the pooled effect, its intervals and heterogeneity,
Demšar's ranks) and across_datasets.csv. The statistics are :mod:`ablate.stats.across`'."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd


def _pct(x: float) -> str:
    return "—" if x is None or math.isnan(x) else f"{100 * x:+.2f}%"


def _interval(low: float, high: float) -> str:
    return "—" if math.isnan(low) or math.isnan(high) else f"[{_pct(low)}, {_pct(high)}]"


def across_markdown(
    name: str, table: pd.DataFrame, ranks: dict | None, metric: str, baseline: str, reports: dict[str, str]
) -> str:
    """The text of across_datasets.md. ``reports``: data set → its report's path, relative."""
    lines = [
        f"# {name}: across data sets",
        "",
        f"Primary metric `test.{metric}`, each variant against `{baseline}` on {len(reports)} data sets "
        f"({', '.join(f'[{d}]({p})' for d, p in reports.items())}: each data set's own report).",
        "",
        "| variant | verdict across data sets | per data set | pooled Δ (relative) | 95% CI (t) "
        "| prediction interval | I² | Q p (bootstrap) |",
        "|---|---|---|---:|---|---|---:|---:|",
    ]
    for r in table.itertuples():
        i2 = "—" if math.isnan(r.i2) else f"{100 * r.i2:.0f}%"
        p = "—" if math.isnan(r.p_homogeneity) else f"{r.p_homogeneity:.3g}"
        lines.append(
            f"| {r.variant} | **{r.verdict}** | {r.per_dataset} | {_pct(r.effect)} | "
            f"{_interval(r.ci_low, r.ci_high)} | {_interval(r.pi_low, r.pi_high)} | {i2} | {p} |"
        )
    lines += ["", "## Ranks over data sets (Demšar 2006)", ""]
    if ranks is None:
        lines.append("Not computed: the Friedman test needs at least 3 variants and 3 data sets.")
    else:
        order = ", ".join(f"{v} {r:.2f}" for v, r in ranks["ranks"].items())
        lines.append(
            f"Mean rank per variant over {ranks['n_seeds']} data sets (1 = best): {order}. Friedman "
            f"χ² = {ranks['statistic']:.3g}, p = {ranks['p']:.3g} ({ranks['method']}); Nemenyi critical "
            f"difference {ranks['cd']:.2f}" + (f" ({ranks['cd_note']})" if ranks.get("cd_note") else "") + "."
        )
    lines += [
        "",
        "## Method",
        "",
        "Per data set, the effect is the relative paired difference of the seeds' test metric, "
        "mean(variant − baseline) / mean(baseline), with the seeds' variance (on seeds − 1 degrees of "
        "freedom). The pooled Δ is the data sets' mean effect with its t interval (k − 1 df): with "
        "variances estimated on a few seeds, inverse-variance weights are not known, and this interval "
        "holds its level whatever the data sets' variances (Bakirov & Székely 2005). Homogeneity: "
        "Cochran's Q, its p-value from a parametric bootstrap under one shared effect that redraws each "
        "data set's mean and variance (Krishnamoorthy, Lu & Mathew 2007; the χ² p-value treats the "
        "variances as known and finds heterogeneity in noise). The prediction interval for a new data "
        "set is the random-effects model's (Paule–Mandel τ², statsmodels `combine_effects`; t, k − 2 "
        "df, around its weighted mean; Higgins et al. 2009). **varies**: the bootstrap Q test rejects "
        "at α; **generalises (better / worse)**: otherwise, when the prediction interval excludes 0 and "
        "the data sets' own verdicts are not both better and worse; **generalises (equivalent)**: when "
        "it lies inside ± the mean relative margin; **unknown**: otherwise. With few data sets the "
        "prediction interval is wide (t with k − 2 df): a verdict of *unknown* says that these data "
        "sets cannot tell, not that the effect is absent.",
        "",
    ]
    return "\n".join(lines)


def write_across(
    out_dir: Path,
    name: str,
    table: pd.DataFrame,
    ranks: dict | None,
    metric: str,
    baseline: str,
    reports: dict[str, Path],
) -> dict[str, Path]:
    """across_datasets.md and .csv in ``out_dir``; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    shown = {}
    for dataset, path in reports.items():
        try:
            shown[dataset] = Path(path).resolve().relative_to(out_dir.resolve()).as_posix()
        except ValueError:
            shown[dataset] = str(path)
    md, csv = out_dir / "across_datasets.md", out_dir / "across_datasets.csv"
    md.write_text(across_markdown(name, table, ranks, metric, baseline, shown), encoding="utf-8")
    table.to_csv(csv, index=False)
    return {"md": md, "csv": csv}

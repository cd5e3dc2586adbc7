"""The ladder report of a study over model sizes: ladder.md (each rung's size and means, how
often its ranking agrees with the top rung's, then each variant's trend over log10(size)
with the effect at the top rung, the slope per decade, their intervals and the projection to a
target size) and ladder.csv. The statistics are :mod:`ablate.stats.ladder`'s."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from ablate.report.cells import number
from ablate.stats.ladder import fitted_band, smallest_predicting


def _interval(low: float, high: float) -> str:
    return "—" if math.isnan(low) or math.isnan(high) else f"[{number(low)}, {number(high)}]"


def ladder_markdown(
    name: str, trends: pd.DataFrame, rungs: pd.DataFrame, metric: str, baseline: str, reports: dict[str, str]
) -> str:
    """The text of ladder.md. ``reports``: rung → its report's path, relative."""
    size = rungs.columns[0]  # the ladder's scale: parameters or training GFLOP (ladder_table)
    variants = [c for c in rungs.columns[1:] if c != "decision_accuracy"]
    lines = [
        f"# {name}: does it hold at scale?",
        "",
        f"Primary metric `test.{metric}`, each variant against `{baseline}` at {len(rungs)} model sizes "
        f"({', '.join(f'[{r}]({p})' for r, p in reports.items())}: each rung's own report and verdicts).",
        "",
        f"| rung | {size} | " + " | ".join(variants) + " | ranking as at the top rung |",
        "|---|---:|" + "---:|" * len(variants) + "---:|",
    ]
    for rung, row in rungs.iterrows():
        accuracy = row["decision_accuracy"]
        shown = "—" if pd.isna(accuracy) else f"{100 * accuracy:.0f}%"
        means = " | ".join(number(row[v]) for v in variants)
        lines.append(f"| {rung} | {row[size]:,.0f} | {means} | {shown} |")
    if len(rungs) > 1 and len(variants) > 1:
        first = smallest_predicting(rungs["decision_accuracy"])
        lines.append("")
        lines.append(
            f"The smallest rung that orders every pair of variants as the top rung does, and every rung "
            f"above it too: **{first}** (its means only: read its verdicts for whether the order is more "
            "than noise)."
            if first
            else "No rung below the top orders every pair of variants as the top rung does (with every "
            "rung above it doing so too): on this ladder a small rung does not predict the ranking."
        )
    lines += [
        "",
        "| variant | trend | Δ at the top rung | 95% CI | slope per decade | 95% CI | margin |",
        "|---|---|---:|---|---:|---|---:|",
    ]
    for r in trends.itertuples():
        lines.append(
            f"| {r.variant} | **trend: {r.trend}** | {number(r.effect)} | "
            f"{_interval(r.effect_low, r.effect_high)} | {number(r.slope)} | "
            f"{_interval(r.slope_low, r.slope_high)} | {number(r.margin)} |"
        )
    if "target" in trends:
        lines.append("")
        for r in trends.itertuples():
            if not pd.isna(r.target):
                lines.append(
                    f"- {r.variant} at {r.target:.3g} {size} ({r.target_kind}): "
                    f"Δ {number(r.target_effect)}, 95% prediction interval "
                    f"{_interval(r.target_low, r.target_high)}."
                )
    lines += [
        "",
        "## Method",
        "",
        "Per rung, the paired differences of the seeds' test metric (variant − baseline); the effect is "
        f"a line in log10 of the baseline's {size}, fitted by least squares to the rung means "
        "weighted by their seeds, its scale from the means' own scatter (t on rungs − 2 df), so a "
        "rung's own deviation from the line widens the intervals instead of being taken for noise. "
        "**holds**: the slope's 90% interval inside ± the margin per decade (TOST) and the effect at the "
        "top rung decided; **grows** / **shrinks**: the slope's 95% interval excludes 0, the effect's "
        "magnitude rising / falling with size; **flips**: the fitted effect excludes 0 at both ends with "
        "opposite signs; fewer than 3 rungs: no trend. A projection outside the ladder is an "
        "extrapolation of that line, its interval widening with the distance. Ranking as at the top "
        "rung: the share of variant pairs ordered as at the largest rung (DataDecide, Magnusson et al. "
        "2025). Error rates measured in `benchmarks/RESULTS.md` (issue 63).",
    ]
    return "\n".join(lines) + "\n"


def ladder_figure(points: pd.DataFrame, size: str, metric: str, alpha: float, path: Path) -> Path | None:
    """Each variant's paired differences against its rung's ``size`` (log axis), the fitted
    line and its 1 − α band; None with no variant of 3 rungs."""
    from ablate.report.figures import Figure  # matplotlib set up (Agg, its cache) as the report's is

    fig = Figure(figsize=(6.5, 4.0))
    ax = fig.add_subplot()
    drawn = False
    for i, (variant, frame) in enumerate(points.groupby("variant", sort=False)):
        xs = np.linspace(frame["scale"].min(), frame["scale"].max(), 50)
        band = fitted_band(frame, xs, alpha)
        colour = f"C{i}"
        ax.scatter(10 ** frame["scale"], frame["diff"], s=14, color=colour, alpha=0.6)
        if len(band):
            ax.plot(10 ** band["scale"], band["effect"], color=colour, label=variant)
            ax.fill_between(10 ** band["scale"], band["low"], band["high"], color=colour, alpha=0.15)
            drawn = True
    if not drawn:
        return None
    ax.axhline(0.0, color="0.4", lw=0.8, ls="--")
    ax.set_xscale("log")
    ax.set_xlabel(f"{size} (baseline)")
    ax.set_ylabel(f"Δ test.{metric} (variant − baseline)")
    ax.legend(frameon=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    return path


def write_ladder(
    out_dir: Path,
    name: str,
    tables: tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame],
    metric: str,
    baseline: str,
    reports: dict[str, Path],
    alpha: float,
) -> dict[str, Path]:
    """ladder.md, ladder.csv (the trends) and figures/ladder.png in ``out_dir``; ``tables``: the
    trends, rungs and paired differences of :func:`~ablate.stats.ladder.ladder_table`."""
    trends, rungs, points = tables
    out_dir.mkdir(parents=True, exist_ok=True)
    shown = {}
    for rung, path in reports.items():
        try:
            shown[rung] = Path(path).resolve().relative_to(out_dir.resolve()).as_posix()
        except ValueError:  # elsewhere (its own output folder): named whole
            shown[rung] = str(path)
    md, csv = out_dir / "ladder.md", out_dir / "ladder.csv"
    text = ladder_markdown(name, trends, rungs, metric, baseline, shown)
    if ladder_figure(points, rungs.columns[0], metric, alpha, out_dir / "figures" / "ladder.png") is not None:
        shown_band = f"{100 * (1 - alpha):.0f}%"
        text += f"\n![each seed's Δ by size, the fitted line and its {shown_band} band](figures/ladder.png)\n"
    md.write_text(text, encoding="utf-8")
    trends.to_csv(csv, index=False)
    return {"md": md, "csv": csv}

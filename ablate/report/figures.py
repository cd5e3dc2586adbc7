"""The report's figures, drawn on ``matplotlib.figure.Figure`` objects (Agg canvas, no pyplot
state, no screen) and saved as PNG under ``figures/``."""

from __future__ import annotations

import os
from pathlib import Path

from ablate.cache import cache_dir

# matplotlib's font cache goes with ablate's own (one documented cache folder), not ~/.cache.
os.environ.setdefault("MPLCONFIGDIR", str(cache_dir() / "matplotlib"))

import matplotlib  # noqa: E402

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import FuncFormatter, MaxNLocator  # noqa: E402

from ablate.report.cells import NA, isnan, p_value  # noqa: E402
from ablate.stats import ComparisonRow, ReportSettings, pairwise_matrix  # noqa: E402


def _save(fig: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    fig.clear()
    return path


def _width(names: list[str]) -> float:
    return max(5.0, 1.0 + 0.9 * len(names) + 0.05 * sum(len(n) for n in names))


def _rotate(ax, names: list[str]) -> None:
    if len(names) > 4 or max(map(len, names), default=0) > 10:
        ax.tick_params(axis="x", labelrotation=30)
        for t in ax.get_xticklabels():
            t.set_ha("right")


def strip_figure(
    results: pd.DataFrame, settings: ReportSettings, names: list[str], path: Path, metric: str | None = None
) -> Path:
    """Per-seed values of ``metric`` (default: primary) by variant: points (coloured by seed) over
    a boxplot."""
    metric = metric or settings.primary
    col = f"test.{metric}"
    data = pd.DataFrame(
        {
            "variant": results["variant"].astype(str),
            "seed": results["seed"].astype(str),
            "value": pd.to_numeric(results[col], errors="coerce"),
        }
    ).dropna()
    fig = Figure(figsize=(_width(names), 4.0))
    ax = fig.add_subplot()
    # plain matplotlib boxes (seaborn 0.13's boxplot passes matplotlib's deprecated ``vert``)
    groups = [data.loc[data["variant"] == v, "value"].to_numpy() for v in names]
    grey = {"color": "0.45"}
    ax.boxplot(
        groups,
        positions=range(len(names)),
        widths=0.6,
        showfliers=False,
        manage_ticks=False,
        medianprops={"color": "0.3"},
        boxprops=grey,
        whiskerprops=grey,
        capprops=grey,
    )
    # seaborn draws the jitter from NumPy's global RNG: fix it so a regenerated report is
    # byte-identical, and restore the caller's RNG state afterwards.
    state = np.random.get_state()
    np.random.seed(0)
    try:
        sns.stripplot(
            data=data,
            x="variant",
            y="value",
            order=names,
            hue="seed",
            dodge=False,
            size=6,
            jitter=0.12,
            ax=ax,
            palette="tab10",
        )
    finally:
        np.random.set_state(state)
    base = data.loc[data["variant"] == settings.baseline, "value"].mean()
    if np.isfinite(base):
        ax.axhline(base, color="0.6", ls="--", lw=1, zorder=0)
    ax.set_xticks(range(len(names)), names)
    better = "higher" if settings.higher(metric) else "lower"
    ax.set(xlabel="", ylabel=f"test {metric} ({better} is better)")
    _rotate(ax, names)
    ax.legend(title="seed", bbox_to_anchor=(1.01, 1), loc="upper left", frameon=False)
    return _save(fig, path)


def curves_figure(
    curves: pd.DataFrame | None, settings: ReportSettings, names: list[str], path: Path
) -> Path | None:
    """Learning curves, mean over seeds with a ± 1 sd band: the validation primary metric per
    epoch, and the training loss beside it when it was logged."""
    if curves is None or curves.empty:
        return None
    c = curves.assign(
        variant=curves["variant"].astype(str),
        metric=curves["metric"].astype(str),
        value=pd.to_numeric(curves["value"], errors="coerce"),
    ).dropna(subset=["value"])
    panels = [
        (c[c["metric"].isin([settings.primary, f"valid.{settings.primary}"])], f"valid {settings.primary}"),
        (c[c["metric"] == "train.loss"], "train loss"),
    ]
    panels = [(frame, label) for frame, label in panels if not frame.empty]
    if not panels or panels[0][1] != f"valid {settings.primary}":
        return None
    present = set().union(*(set(f["variant"]) for f, _ in panels))
    order = [n for n in names if n in present] + sorted(present - set(names))
    fig = Figure(figsize=(5.2 * len(panels) + 1.6, 4.0))
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for i, (ax, (frame, label)) in enumerate(zip(axes, panels, strict=True)):
        sns.lineplot(
            data=frame,
            x="epoch",
            y="value",
            hue="variant",
            hue_order=order,
            errorbar="sd",
            ax=ax,
            legend=i == len(panels) - 1,
        )
        ax.set(xlabel="epoch", ylabel=label)
    axes[-1].legend(title="variant", bbox_to_anchor=(1.01, 1), loc="upper left", frameon=False)
    fig.tight_layout()
    return _save(fig, path)


def cd_figure(fr: dict, settings: ReportSettings, path: Path) -> Path | None:
    """Demšar's critical-difference diagram: mean ranks on an axis (1 = best, left), a bar as long
    as the Nemenyi critical difference, and a thick line under each largest run of variants whose
    mean ranks lie within it of each other (the test does not separate them). None when the seeds
    do not support the diagram (``fr['cd_note']`` says why)."""
    if fr["cd_note"] is not None:
        return None
    names, r = list(fr["ranks"]), np.array(list(fr["ranks"].values()))
    k, cd = fr["n_variants"], fr["cd"]
    runs = []  # (first, last) indices in rank order; a run inside the previous one adds nothing
    for i in range(len(r)):
        last = int(np.searchsorted(r, r[i] + cd, side="right")) - 1
        if last > i and (not runs or last > runs[-1][1]):
            runs.append((i, last))
    left = (len(names) + 1) // 2  # the better half is named on the left, the rest on the right
    top = -0.35 - 0.18 * len(runs)  # below the axis and the runs' lines
    fig = Figure(figsize=(7.0, 1.3 + 0.28 * max(left, len(names) - left) + 0.12 * len(runs)))
    ax = fig.add_subplot()
    ax.set_axis_off()
    ax.plot([1, k], [0, 0], color="0.2", lw=1)
    for tick in range(1, k + 1):
        ax.plot([tick, tick], [0, 0.1], color="0.2", lw=1)
        ax.text(tick, 0.16, str(tick), ha="center", va="bottom", fontsize=9)
    ax.plot([1, 1 + cd], [0.65, 0.65], color="0.2", lw=1.5)
    for end in (1, 1 + cd):
        ax.plot([end, end], [0.6, 0.7], color="0.2", lw=1)
    ax.text(1 + cd / 2, 0.74, f"CD = {cd:.2f}", ha="center", va="bottom", fontsize=9)
    ax.text(k, 0.74, f"mean rank, test {settings.primary} (1 = best)", ha="right", va="bottom", fontsize=9)
    for j, (i, last) in enumerate(runs):
        y = -0.22 - 0.18 * j
        ax.plot([r[i] - 0.04, r[last] + 0.04], [y, y], color="0.1", lw=3.5, solid_capstyle="round")
    for i, (name, rank) in enumerate(zip(names, r, strict=True)):
        on_left = i < left
        y = top - 0.28 * (i if on_left else len(names) - 1 - i)
        edge = 0.6 if on_left else k + 0.4
        ax.plot([rank, rank, edge], [0, y, y], color="C0", lw=1)
        ax.text(
            edge + (-0.05 if on_left else 0.05),
            y,
            f"{name} ({rank:.2f})",
            ha="right" if on_left else "left",
            va="center",
            fontsize=9,
        )
    ax.set_xlim(0.6, k + 0.4)
    ax.set_ylim(top - 0.28 * max(left, len(names) - left), 1.0)
    return _save(fig, path)


def pairwise_figure(
    pairs: pd.DataFrame, settings: ReportSettings, names: list[str], path: Path
) -> Path | None:
    """Heatmap of the corrected pairwise p-values (colour: −log10 p; * significant; n/a: < 3 seeds)."""
    if pairs.empty:
        return None
    p_adj = pairwise_matrix(pairs, names, "p_adj")
    sig = pairwise_matrix(pairs.assign(significant=pairs["significant"].astype(float)), names, "significant")
    with np.errstate(divide="ignore"):
        heat = -np.log10(p_adj.clip(lower=1e-4))
    labels = pd.DataFrame("", index=names, columns=names)
    for a in names:
        for b in names:
            if a != b:
                p = p_adj.loc[a, b]
                labels.loc[a, b] = NA if isnan(p) else p_value(p) + ("*" if sig.loc[a, b] == 1 else "")
    size = max(4.5, 0.75 * len(names) + 2.2)
    fig = Figure(figsize=(size + 1.2, size))
    ax = fig.add_subplot()
    ax.set_facecolor("0.93")  # NaN cells (diagonal, n/a) show the background
    sns.heatmap(
        heat,
        mask=heat.isna(),
        vmin=0,
        vmax=4,
        cmap="rocket_r",
        square=True,
        linewidths=0.5,
        linecolor="white",
        ax=ax,
        cbar_kws={"label": "−log10 adjusted p", "shrink": 0.8},
    )
    for i, a in enumerate(names):
        for j, b in enumerate(names):
            if labels.loc[a, b]:
                dark = not isnan(heat.loc[a, b]) and heat.loc[a, b] > 2.2
                ax.text(
                    j + 0.5,
                    i + 0.5,
                    labels.loc[a, b],
                    ha="center",
                    va="center",
                    fontsize=8 if len(names) < 8 else 6.5,
                    color="white" if dark else "0.15",
                )
    ax.set(xlabel="", ylabel="")
    ax.set_xticks(np.arange(len(names)) + 0.5, names)
    ax.set_yticks(np.arange(len(names)) + 0.5, names, rotation=0)
    _rotate(ax, names)
    return _save(fig, path)


def _label_points(ax, pts: pd.DataFrame) -> None:
    """Name each point; labels point inwards, and a label that would sit on an earlier one moves down."""
    if pts.empty:
        return
    x0, x1 = pts["x"].min(), pts["x"].max()
    y0, y1 = pts["y"].min(), pts["y"].max()
    mid = (x0 + x1) / 2
    placed: list[tuple[float, float]] = []
    for r in pts.sort_values("y", ascending=False).itertuples(index=False):
        fx = (r.x - x0) / (x1 - x0) if x1 > x0 else 0.5
        fy = (r.y - y0) / (y1 - y0) if y1 > y0 else 0.5
        shift = sum(1 for px, py in placed if abs(px - fx) < 0.15 and abs(py - fy) < 0.06)
        placed.append((fx, fy - 0.06 * shift))
        right = len(pts) > 1 and r.x > mid
        ax.annotate(
            r.variant,
            (r.x, r.y),
            xytext=(-6 if right else 6, 4 - 11 * shift),
            textcoords="offset points",
            fontsize=8,
            ha="right" if right else "left",
        )


def _logged(frame: pd.DataFrame, column: str) -> bool:
    return column in frame.columns and pd.to_numeric(frame[column], errors="coerce").notna().any()


def _every(frame: pd.DataFrame, column: str) -> bool:
    return column in frame.columns and pd.to_numeric(frame[column], errors="coerce").notna().all()


def cost_work(results: pd.DataFrame) -> tuple[str | None, str]:
    """The training FLOPs the cost figure plots first, when every trial counted them
    (ablate.training.flops)."""
    return ("train_gflop", "training GFLOP per trial") if _every(results, "train_gflop") else (None, "")


def cost_time(results: pd.DataFrame) -> tuple[str | None, str]:
    """The time the cost figure plots: CPU time when every trial logged it (it does not grow when
    other work shares the machine), else wall time; (None, …) when neither was logged."""
    if _every(results, "cpu_s"):
        return "cpu_s", "CPU s per trial"
    return ("wall_s" if _logged(results, "wall_s") else None), "wall s per trial"


def cost_figure(
    results: pd.DataFrame, cmp: list[ComparisonRow], settings: ReportSettings, names: list[str], path: Path
) -> Path | None:
    """Cost vs. quality, one point per variant: x the training FLOPs where every trial counted them,
    the mean time per trial (± sd) and the parameter count, y the primary metric's mean ± sd over
    seeds. The time is CPU time where it was logged (:func:`cost_time`)."""
    frame = results.assign(variant=results["variant"].astype(str))
    panels = (cost_work(results), cost_time(results), ("params", "parameters"))
    costs = [(c, label) for c, label in panels if c and _logged(frame, c)]
    if not costs:
        return None
    quality = {r.variant: r for r in cmp}
    fig = Figure(figsize=(5.0 * len(costs) + 0.5, 4.2))
    axes = fig.subplots(1, len(costs), squeeze=False, sharey=True)[0]
    palette = dict(
        zip(
            names,
            sns.color_palette("tab10", len(names))
            if len(names) <= 10
            else sns.color_palette("husl", len(names)),
            strict=True,
        )
    )
    for ax, (c, label) in zip(axes, costs, strict=True):
        by = frame.assign(x=pd.to_numeric(frame[c], errors="coerce")).groupby("variant")["x"]
        pts = pd.DataFrame({"x": by.mean(), "xsd": by.std(ddof=1)}).reindex(names)
        shown = [quality.get(v) for v in pts.index]
        pts["y"] = [np.nan if r is None else r.mean for r in shown]
        pts["ysd"] = [np.nan if r is None else r.sd for r in shown]
        pts = pts.dropna(subset=["x", "y"]).reset_index(names="variant")
        for r in pts.itertuples(index=False):
            ax.errorbar(
                r.x,
                r.y,
                xerr=None if isnan(r.xsd) or c == "params" else r.xsd,
                yerr=None if isnan(r.ysd) else r.ysd,
                fmt="none",
                ecolor="0.6",
                capsize=3,
                zorder=1,
            )
        sns.scatterplot(
            data=pts,
            x="x",
            y="y",
            hue="variant",
            palette=palette,
            s=70,
            ax=ax,
            legend=False,
            style=pts["variant"] == settings.baseline,
            markers={True: "D", False: "o"},
            zorder=2,
        )
        _label_points(ax, pts)
        if c == "params" and len(pts) and pts["x"].min() > 0 and pts["x"].max() / pts["x"].min() > 20:
            ax.set_xscale("log")
        else:
            ax.xaxis.set_major_locator(MaxNLocator(5))
            ax.xaxis.set_major_formatter(
                FuncFormatter(lambda v, _: f"{v:,.0f}" if abs(v) >= 100 else f"{v:g}")
            )
        ax.margins(x=0.18, y=0.1)  # room for the labels
        better = "higher" if settings.higher(settings.primary) else "lower"
        ax.set(xlabel=label, ylabel=f"test {settings.primary} ({better} is better)")
        ax.grid(color="0.92")
    fig.tight_layout()
    return _save(fig, path)

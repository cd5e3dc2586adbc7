"""The study report: ``results.csv``, ``comparisons.csv``, ``pairwise.csv``, ``table.tex``,
``report.md``, ``report.html``, ``figures/``.

The report is one list of blocks (heading, paragraph, list, table, figure) rendered twice: to
Markdown (figures linked from ``figures/``) and to a self-contained HTML page (figures embedded as
base64 PNG). ``table.tex`` is the primary metric's table as a booktabs LaTeX table. Numbers come
from :mod:`ablate.stats`; nothing here computes a test.

Figures are drawn on ``matplotlib.figure.Figure`` objects (Agg canvas, no pyplot state, no screen).
"""

from __future__ import annotations

import base64
import html
import math
import re
from dataclasses import dataclass
from typing import Callable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import FuncFormatter, MaxNLocator  # noqa: E402

from . import stats  # noqa: E402
from .stats import ReportSettings  # noqa: E402

COSTS = [("params", "params", "{:,.0f}"), ("tokens_per_s", "tokens/s", "{:,.0f}"),
         ("peak_memory_mb", "peak memory MB", "{:,.1f}"), ("wall_s", "wall s", "{:,.1f}"),
         ("epochs", "epochs", "{:,.1f}")]
CALIBRATION_BOOTSTRAP = 2000  # resamples per CI in the report's calibration simulation (at most)
CORRECTION_NAMES = {"holm": "Holm", "fdr_bh": "Benjamini–Hochberg (FDR)"}
NA = "n/a"


# ---------------------------------------------------------------- cells


def _isnan(x) -> bool:
    return x is None or (isinstance(x, float) and np.isnan(x))


def _seeds(k: int) -> str:
    return f"{NA} ({k} seed{'' if k == 1 else 's'})"


def _num(x: float, signed: bool = False) -> str:
    if _isnan(x):
        return NA
    if np.isinf(x):
        return "+∞" if x > 0 else "−∞"
    body = f"{x:+.4f}" if signed else f"{x:.4f}"
    return body if abs(x) < 100 else (f"{x:+,.1f}" if signed else f"{x:,.1f}")


def _p(p: float) -> str:
    return NA if _isnan(p) else ("<0.001" if p < 0.001 else f"{p:.3f}")


def _p_is(p: float) -> str:
    """'p = 0.012' / 'p < 0.001' for running text."""
    text = _p(p)
    return f"p {text[0]} {text[1:]}" if text.startswith("<") else f"p = {text}"


def _mean_sd(row) -> str:
    if row.n_seeds == 0:
        return _seeds(0)
    if _isnan(row.sd):
        return f"{_num(row.mean)} (1 seed)"
    return f"{_num(row.mean)} ± {_num(row.sd)}"


def _delta(row, method: str = "smoothed-bootstrap-t") -> str:
    if row.n_paired < stats.min_seeds_ci(method) or _isnan(row.ci_low):
        ci = _seeds(row.n_paired)
    else:
        ci = f"{_num(row.ci_low, True)}, {_num(row.ci_high, True)}"
    return f"{_num(row.delta, True)} [{ci}]"


def _p_seeds(row) -> str:
    return _seeds(row.n_paired) if row.n_paired < stats.MIN_SEEDS_TEST else _p(row.p_seeds_adj)


def _p_units(row) -> str:
    return f"{NA} (no units)" if row.n_units == 0 else _p(row.p_units_adj)


def _d(d: float) -> str:
    if _isnan(d):
        return NA
    return ("+∞" if d > 0 else "−∞") if np.isinf(d) else f"{d:+.2f}"


def _mark(row, higher: bool) -> str:
    if not row.significant:
        return ""
    return "▲" if (row.delta > 0) == higher else "▼"


def _table_rows(cmp: pd.DataFrame, settings: ReportSettings) -> tuple[list[str], list[list[str]]]:
    metric = cmp["metric"].iloc[0] if "metric" in cmp.columns and len(cmp) else settings.primary
    higher = settings.higher(metric)
    better = f"P({'>' if higher else '<'}base)"
    headers = ["variant", "differs", f"{metric} mean ± sd", f"Δ [{settings.confidence:.0%} CI]",
               "rel. change", "p seeds (adj)", "p units (adj)", "d", better, "sig."]
    rows = []
    for row in cmp.itertuples(index=False):
        if row.variant == settings.baseline:
            rows.append([row.variant, row.differs, _mean_sd(row)] + ["—"] * 7)
            continue
        rows.append([
            row.variant, row.differs, _mean_sd(row), _delta(row, settings.ci),
            NA if _isnan(row.rel_change) else f"{row.rel_change:+.1%}",
            _p_seeds(row), _p_units(row),
            _d(row.d_seeds),
            NA if _isnan(row.p_better_units) else f"{row.p_better_units:.2f}",
            _mark(row, higher),
        ])
    return headers, rows


def _md_table(headers: list[str], rows: list[list[str]], left: int = 2) -> str:
    esc = lambda s: str(s).replace("|", "\\|")  # noqa: E731
    lines = ["| " + " | ".join(esc(h) for h in headers) + " |",
             "|" + "|".join("---" if i < left else "---:" for i in range(len(headers))) + "|"]
    lines += ["| " + " | ".join(esc(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def format_table(compare_df: pd.DataFrame, settings: ReportSettings) -> str:
    """The Markdown table of one ``stats.compare`` frame (the CLI prints the primary metric's)."""
    return _md_table(*_table_rows(compare_df, settings))


# ---------------------------------------------------------------- document model


@dataclass
class Block:
    kind: str  # h1 | h2 | p | list | table | figure
    text: str = ""
    items: list | None = None
    headers: list[str] | None = None
    path: Path | None = None
    left: int = 2  # tables: leading text columns; the rest are right-aligned numbers


# One renderer per block kind and format: adding a block kind is one entry in each table.
MARKDOWN: dict[str, Callable[[Block, Path], str]] = {
    "h1": lambda b, out: f"# {b.text}",
    "h2": lambda b, out: f"## {b.text}",
    "p": lambda b, out: b.text,
    "list": lambda b, out: "\n".join(f"- {i}" for i in b.items),
    "table": lambda b, out: _md_table(b.headers, b.items, b.left),
    "figure": lambda b, out: f"![{b.text}]({b.path.relative_to(out).as_posix()})\n\n*{b.text}*",
}


def _to_md(blocks: list[Block], out_dir: Path) -> str:
    return "\n\n".join(MARKDOWN[b.kind](b, out_dir) for b in blocks) + "\n"


CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;max-width:1200px;margin:2em auto;
padding:0 1em;color:#222;line-height:1.45}
h1{border-bottom:2px solid #444;padding-bottom:.2em}h2{margin-top:1.8em;border-bottom:1px solid #ccc}
.wrap{overflow-x:auto;margin:1em 0}table{border-collapse:collapse;font-size:.88em}
th,td{padding:.3em .55em;border-bottom:1px solid #ddd;white-space:nowrap}
th{background:#f3f3f3;text-align:left;vertical-align:bottom;white-space:normal}
td.txt{white-space:normal;min-width:4em;max-width:16em}td.txt:first-child{white-space:nowrap;max-width:none}
th.num,td.num{text-align:right;font-variant-numeric:tabular-nums}
tr:nth-child(even) td{background:#fafafa}
figure{margin:1.5em 0}figure img{max-width:100%;height:auto}figcaption{color:#555;font-size:.9em}
ul{padding-left:1.4em}li{margin:.25em 0}code{font-size:.95em}
"""


def _html_table(b: Block) -> str:
    e = html.escape
    head = "".join(f'<th{" class=num" if j >= b.left else ""}>{e(h)}</th>' for j, h in enumerate(b.headers))
    body = "".join(
        "<tr>" + "".join(f'<td class={"num" if j >= b.left else "txt"}>{e(str(c))}</td>'
                         for j, c in enumerate(r)) + "</tr>"
        for r in b.items)
    return f'<div class="wrap"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def _html_figure(b: Block) -> str:
    data = base64.b64encode(b.path.read_bytes()).decode("ascii")
    return (f'<figure><img alt="{html.escape(b.text)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{html.escape(b.text)}</figcaption></figure>")


HTML: dict[str, Callable[[Block], str]] = {
    "h1": lambda b: f"<h1>{html.escape(b.text)}</h1>",
    "h2": lambda b: f"<h2>{html.escape(b.text)}</h2>",
    "p": lambda b: f"<p>{html.escape(b.text)}</p>",
    "list": lambda b: "<ul>" + "".join(f"<li>{html.escape(str(i))}</li>" for i in b.items) + "</ul>",
    "table": _html_table,
    "figure": _html_figure,
}


def _to_html(blocks: list[Block], title: str) -> str:
    e = html.escape
    parts = [HTML[b.kind](b) for b in blocks]
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{e(title)}</title>'
            f"<style>{CSS}</style></head><body>\n" + "\n".join(parts) + "\n</body></html>\n")


# ---------------------------------------------------------------- LaTeX

TEX_SPECIALS = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
                "<": r"\textless{}", ">": r"\textgreater{}"}
# the report's non-ASCII glyphs, in plain LaTeX (no packages beyond booktabs)
TEX_GLYPHS = {"±": r"$\pm$", "−": r"$-$", "∞": r"$\infty$", "—": "---", "–": "--", "Δ": r"$\Delta$",
              "▲": r"$\uparrow$", "▼": r"$\downarrow$", "≥": r"$\geq$", "≤": r"$\leq$", "α": r"$\alpha$"}


def tex_escape(text) -> str:
    """``text`` as LaTeX text: the ten specials (and < >) escaped, the report's glyphs as math."""
    return "".join(TEX_SPECIALS.get(c, TEX_GLYPHS.get(c, c)) for c in str(text))


def latex_table(cmp: pd.DataFrame, settings: ReportSettings) -> str:
    """The Markdown table of one ``stats.compare`` frame as a booktabs ``table`` environment."""
    headers, rows = _table_rows(cmp, settings)
    metric = cmp["metric"].iloc[0] if len(cmp) else settings.primary
    corr = CORRECTION_NAMES.get(settings.correction, settings.correction)
    n = int(cmp["n_paired"].max()) if len(cmp) else 0
    caption = (f"Ablation study {settings.study}: test {metric}, mean ± sd over seeds; "
               f"Δ = variant − {settings.baseline} with a {settings.confidence:.0%} {_ci_name(settings)} CI "
               f"over paired seeds (up to {n}); p-values {corr}-adjusted over the "
               f"{int((cmp['variant'] != settings.baseline).sum())} comparisons with {settings.baseline}; "
               f"d = paired Cohen's d; ▲/▼: significantly better/worse at α = {settings.alpha:g}.")
    label = re.sub(r"[^A-Za-z0-9_:.-]+", "-", f"tab:ablate:{settings.study}:{metric}")
    spec = "l" * 2 + "r" * (len(headers) - 3) + "c"
    lines = [
        f"% ablate report: {tex_escape(settings.study)}, primary metric {tex_escape(metric)}.",
        r"% Needs \usepackage{booktabs}.",
        r"\begin{table}[t]",
        r"\centering",
        r"\small",
        rf"\caption{{{tex_escape(caption)}}}",
        rf"\label{{{label}}}",
        rf"\begin{{tabular}}{{{spec}}}",
        r"\toprule",
        " & ".join(tex_escape(h) for h in headers) + r" \\",
        r"\midrule",
        *[" & ".join(tex_escape(c) for c in r) + r" \\" for r in rows],
        r"\bottomrule",
        r"\end{tabular}",
        r"\end{table}",
    ]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- figures


def _save(fig: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    fig.clear()
    return path


def _width(names: list[str]) -> float:
    return max(5.0, 1.0 + 0.9 * len(names) + 0.05 * sum(len(n) for n in names))


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text.replace("@", "_at_"))


def _rotate(ax, names: list[str]) -> None:
    if len(names) > 4 or max(map(len, names), default=0) > 10:
        ax.tick_params(axis="x", labelrotation=30)
        for t in ax.get_xticklabels():
            t.set_ha("right")


def strip_figure(results: pd.DataFrame, settings: ReportSettings, names: list[str], path: Path,
                 metric: str | None = None) -> Path:
    """Per-seed values of ``metric`` (default: primary) by variant: points (coloured by seed) over
    a boxplot."""
    metric = metric or settings.primary
    col = f"test.{metric}"
    data = pd.DataFrame({"variant": results["variant"].astype(str), "seed": results["seed"].astype(str),
                         "value": pd.to_numeric(results[col], errors="coerce")}).dropna()
    fig = Figure(figsize=(_width(names), 4.0))
    ax = fig.add_subplot()
    # plain matplotlib boxes (seaborn 0.13's boxplot passes matplotlib's deprecated ``vert``)
    groups = [data.loc[data["variant"] == v, "value"].to_numpy() for v in names]
    grey = {"color": "0.45"}
    ax.boxplot(groups, positions=range(len(names)), widths=0.6, showfliers=False, manage_ticks=False,
               medianprops={"color": "0.3"}, boxprops=grey, whiskerprops=grey, capprops=grey)
    # seaborn draws the jitter from NumPy's global RNG: fix it so a regenerated report is
    # byte-identical, and restore the caller's RNG state afterwards.
    state = np.random.get_state()
    np.random.seed(0)
    try:
        sns.stripplot(data=data, x="variant", y="value", order=names, hue="seed", dodge=False, size=6,
                      jitter=0.12, ax=ax, palette="tab10")
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


def curves_figure(curves: pd.DataFrame | None, settings: ReportSettings, names: list[str],
                  path: Path) -> Path | None:
    """Learning curves, mean over seeds with a ± 1 sd band: the validation primary metric per
    epoch, and the training loss beside it when it was logged."""
    if curves is None or curves.empty:
        return None
    c = curves.assign(variant=curves["variant"].astype(str), metric=curves["metric"].astype(str),
                      value=pd.to_numeric(curves["value"], errors="coerce")).dropna(subset=["value"])
    panels = [(c[c["metric"].isin([settings.primary, f"valid.{settings.primary}"])],
               f"valid {settings.primary}"),
              (c[c["metric"] == "train.loss"], "train loss")]
    panels = [(frame, label) for frame, label in panels if not frame.empty]
    if not panels or panels[0][1] != f"valid {settings.primary}":
        return None
    present = set().union(*(set(f["variant"]) for f, _ in panels))
    order = [n for n in names if n in present] + sorted(present - set(names))
    fig = Figure(figsize=(5.2 * len(panels) + 1.6, 4.0))
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for i, (ax, (frame, label)) in enumerate(zip(axes, panels)):
        sns.lineplot(data=frame, x="epoch", y="value", hue="variant", hue_order=order, errorbar="sd",
                     ax=ax, legend=i == len(panels) - 1)
        ax.set(xlabel="epoch", ylabel=label)
    axes[-1].legend(title="variant", bbox_to_anchor=(1.01, 1), loc="upper left", frameon=False)
    fig.tight_layout()
    return _save(fig, path)


def cd_figure(fr: dict, settings: ReportSettings, path: Path) -> Path:
    """Mean Friedman ranks with ± CD/2 bars: two variants differ (Nemenyi) iff their bars do not overlap."""
    ranks = fr["ranks"]
    names = list(ranks)
    fig = Figure(figsize=(6.5, 0.45 * len(names) + 1.2))
    ax = fig.add_subplot()
    y = np.arange(len(names))[::-1]
    ax.errorbar(list(ranks.values()), y, xerr=fr["cd"] / 2, fmt="o", color="C0", capsize=4)
    ax.set_yticks(y, names)
    r, h = np.array(list(ranks.values())), fr["cd"] / 2
    ax.set_xlim(min(0.5, r.min() - h - 0.1), max(fr["n_variants"] + 0.5, r.max() + h + 0.1))
    ax.set_xlabel(f"mean rank on test {settings.primary} (1 = best); bars ± CD/2, CD = {fr['cd']:.2f}")
    ax.grid(axis="x", color="0.9")
    return _save(fig, path)


def pairwise_figure(pairs: pd.DataFrame, settings: ReportSettings, names: list[str],
                    path: Path) -> Path | None:
    """Heatmap of the corrected pairwise p-values (colour: −log10 p; * significant; n/a: < 3 seeds)."""
    if pairs.empty:
        return None
    p_adj = stats.pairwise_matrix(pairs, names, "p_adj")
    sig = stats.pairwise_matrix(pairs.assign(significant=pairs["significant"].astype(float)), names,
                                "significant")
    with np.errstate(divide="ignore"):
        heat = -np.log10(p_adj.clip(lower=1e-4))
    labels = pd.DataFrame("", index=names, columns=names)
    for a in names:
        for b in names:
            if a != b:
                p = p_adj.loc[a, b]
                labels.loc[a, b] = NA if _isnan(p) else _p(p) + ("*" if sig.loc[a, b] == 1 else "")
    size = max(4.5, 0.75 * len(names) + 2.2)
    fig = Figure(figsize=(size + 1.2, size))
    ax = fig.add_subplot()
    ax.set_facecolor("0.93")  # NaN cells (diagonal, n/a) show the background
    sns.heatmap(heat, mask=heat.isna(), vmin=0, vmax=4, cmap="rocket_r", square=True, linewidths=0.5,
                linecolor="white", ax=ax, cbar_kws={"label": "−log10 adjusted p", "shrink": 0.8})
    for i, a in enumerate(names):
        for j, b in enumerate(names):
            if labels.loc[a, b]:
                dark = not _isnan(heat.loc[a, b]) and heat.loc[a, b] > 2.2
                ax.text(j + 0.5, i + 0.5, labels.loc[a, b], ha="center", va="center",
                        fontsize=8 if len(names) < 8 else 6.5, color="white" if dark else "0.15")
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
        ax.annotate(r.variant, (r.x, r.y), xytext=(-6 if right else 6, 4 - 11 * shift),
                    textcoords="offset points", fontsize=8, ha="right" if right else "left")


def cost_figure(results: pd.DataFrame, cmp: pd.DataFrame, settings: ReportSettings, names: list[str],
                path: Path) -> Path | None:
    """Cost vs. quality, one point per variant: x the mean wall time per trial (± sd) and the
    parameter count, y the primary metric's mean ± sd over seeds."""
    frame = results.assign(variant=results["variant"].astype(str))
    costs = [(c, label) for c, label in (("wall_s", "wall s per trial"), ("params", "parameters"))
             if c in frame.columns and pd.to_numeric(frame[c], errors="coerce").notna().any()]
    if not costs:
        return None
    quality = cmp.set_index("variant")
    fig = Figure(figsize=(5.0 * len(costs) + 0.5, 4.2))
    axes = fig.subplots(1, len(costs), squeeze=False, sharey=True)[0]
    palette = dict(zip(names, sns.color_palette("tab10", len(names)) if len(names) <= 10
                       else sns.color_palette("husl", len(names))))
    for ax, (c, label) in zip(axes, costs):
        by = frame.assign(x=pd.to_numeric(frame[c], errors="coerce")).groupby("variant")["x"]
        pts = pd.DataFrame({"x": by.mean(), "xsd": by.std(ddof=1)}).reindex(names)
        pts["y"], pts["ysd"] = quality["mean"].reindex(names), quality["sd"].reindex(names)
        pts = pts.dropna(subset=["x", "y"]).reset_index(names="variant")
        for r in pts.itertuples(index=False):
            ax.errorbar(r.x, r.y, xerr=None if _isnan(r.xsd) or c == "params" else r.xsd,
                        yerr=None if _isnan(r.ysd) else r.ysd, fmt="none", ecolor="0.6", capsize=3, zorder=1)
        sns.scatterplot(data=pts, x="x", y="y", hue="variant", palette=palette, s=70, ax=ax, legend=False,
                        style=pts["variant"] == settings.baseline, markers={True: "D", False: "o"}, zorder=2)
        _label_points(ax, pts)
        if c == "params" and len(pts) and pts["x"].min() > 0 and pts["x"].max() / pts["x"].min() > 20:
            ax.set_xscale("log")
        else:
            ax.xaxis.set_major_locator(MaxNLocator(5))
            ax.xaxis.set_major_formatter(
                FuncFormatter(lambda v, _: f"{v:,.0f}" if abs(v) >= 100 else f"{v:g}"))
        ax.margins(x=0.18, y=0.1)  # room for the labels
        better = "higher" if settings.higher(settings.primary) else "lower"
        ax.set(xlabel=label, ylabel=f"test {settings.primary} ({better} is better)")
        ax.grid(color="0.92")
    fig.tight_layout()
    return _save(fig, path)


# ---------------------------------------------------------------- content


CI_NAMES = {"smoothed-bootstrap-t": "smoothed studentized bootstrap (bootstrap-t)",
            "bootstrap-t": "studentized bootstrap (bootstrap-t)", "percentile": "percentile bootstrap"}


def _ci_name(settings: ReportSettings) -> str:
    return CI_NAMES.get(settings.ci, settings.ci)


def _settings_text(settings: ReportSettings, family: int, seeds: int) -> list[str]:
    higher = "higher" if settings.higher(settings.primary) else "lower"
    corr = CORRECTION_NAMES.get(settings.correction, settings.correction)
    min_ci = stats.min_seeds_ci(settings.ci)
    return [
        f"Primary metric: {settings.primary} ({higher} is better); secondary: "
        f"{', '.join(settings.metrics[1:]) or 'none'}. Baseline: {settings.baseline}.",
        "Seed test (primary): paired t-test across seeds (seeds are the replication unit; with ≤ 5 seeds "
        "an exact Wilcoxon test cannot reach p < 0.05, so Wilcoxon across seeds is only listed in "
        "comparisons.csv). Unit test: paired Wilcoxon signed-rank across evaluation units, pooled over "
        "seeds (pairs = (seed, unit) present for both variant and baseline); it is conditional on the "
        "trained models and does not see seed-to-seed variation, so it does not decide significance.",
        f"Correction: {corr} over the family of {family} comparison{'s' if family != 1 else ''} "
        f"(every variant vs. {settings.baseline}), separately per metric and per test; "
        f"the p-values shown are adjusted. Significant: adjusted seed-test p < α = {settings.alpha:g} "
        f"(▲ better, ▼ worse than the baseline).",
        f"Δ = variant − baseline, mean over paired seeds, with a {settings.confidence:.0%} "
        f"{_ci_name(settings)} CI over seeds ({settings.bootstrap:,} resamples, RNG seed {settings.seed}); "
        "rel. change = Δ / baseline mean; d = paired Cohen's d over seeds; "
        "P(>base) = share of (seed, unit) pairs where the variant is better (ties count half). "
        f"Too few seeds for a test (< {stats.MIN_SEEDS_TEST}) or a CI (< {min_ci}) is shown as n/a.",
    ] + ([f"With {seeds} seeds a percentile bootstrap interval is narrower than its nominal level "
          "(it never reaches beyond the observed differences): read significance from the seed test, "
          "not from whether the CI excludes 0."] if settings.ci == "percentile" and 1 < seeds < 10 else [])


def _findings(cmp: pd.DataFrame, settings: ReportSettings) -> str:
    higher = settings.higher(settings.primary)
    sig = cmp[cmp["significant"]]
    if sig.empty:
        return (f"No variant differs significantly from {settings.baseline} on {settings.primary} "
                f"(adjusted seed-test p < {settings.alpha:g}).")
    parts = [f"{r.variant} {_mark(r, higher)} ({r.rel_change:+.1%}, {_p_is(r.p_seeds_adj)})"
             for r in sig.itertuples(index=False)]
    return f"Significant on {settings.primary}: " + "; ".join(parts) + "."


def _cost_table(results: pd.DataFrame, names: list[str]) -> tuple[list[str], list[list[str]]] | None:
    cols = [(c, label, fmt) for c, label, fmt in COSTS if c in results.columns]
    if not cols:
        return None
    frame = results.assign(variant=results["variant"].astype(str))
    means = frame.groupby("variant")[[c for c, _, _ in cols]].agg(
        lambda s: pd.to_numeric(s, errors="coerce").mean())
    rows = []
    for v in names:
        row = [v]
        for c, _, fmt in cols:
            x = means.loc[v, c] if v in means.index else np.nan
            row.append(NA if _isnan(float(x)) else fmt.format(x))
        rows.append(row)
    return ["variant"] + [label for _, label, _ in cols], rows


def _friedman_text(fr: dict | None, settings: ReportSettings, n_variants: int) -> str:
    if fr is None:
        return (f"Friedman test: not available ({n_variants} variant{'s' if n_variants != 1 else ''}; "
                "needs ≥ 3 variants and ≥ 3 seeds where every variant finished).")
    ranks = ", ".join(f"{v} {r:.2f}" for v, r in fr["ranks"].items())
    return (f"Friedman test on test {settings.primary} over {fr['n_variants']} variants × "
            f"{fr['n_seeds']} seeds: χ² = {fr['statistic']:.2f}, {_p_is(fr['p'])}. "
            f"Mean ranks (1 = best): {ranks}. Nemenyi critical difference at α = {settings.alpha:g}: "
            f"{fr['cd']:.2f}.")


def _pairwise_text(pairs: pd.DataFrame, settings: ReportSettings) -> str:
    corr = CORRECTION_NAMES.get(settings.correction, settings.correction)
    tested = int(pairs["p"].notna().sum())
    sig = pairs[pairs["significant"]]
    found = ("none" if sig.empty else
             "; ".join(f"{r.b} − {r.a} = {_num(r.delta, True)} ({_p_is(r.p_adj)})" for r in sig.itertuples()))
    return (f"All pairs on test {settings.primary}: paired t-test across the seeds both variants have, "
            f"{corr} over the family of {tested} pair{'s' if tested != 1 else ''} with a test "
            f"({len(pairs) - tested} n/a: < {stats.MIN_SEEDS_TEST} paired seeds); a separate family from "
            f"the comparisons with {settings.baseline}. Significant at α = {settings.alpha:g}: {found}.")


def _rate(x: float, n: int) -> str:
    """A simulated rate with its binomial 95% margin."""
    if _isnan(x):
        return NA
    return f"{x:.1%} (± {1.96 * math.sqrt(max(x * (1 - x), 1 / n) / n):.1%}, n = {n})"


def _calibration_text(cal: dict | None, settings: ReportSettings, tables: dict[str, pd.DataFrame],
                      n_pairs: int) -> list[str]:
    corr = CORRECTION_NAMES.get(settings.correction, settings.correction)
    a = settings.alpha
    primary = tables[settings.primary]
    family = int((primary["variant"] != settings.baseline).sum())
    n_seed = sum(int(t["p_seeds"].notna().sum()) for t in tables.values())
    n_unit = sum(int(t["p_units"].notna().sum()) for t in tables.values())
    lines = [
        "Tests: paired t-test across seeds (two-sided; decides significance); Wilcoxon signed-rank "
        "across seeds (comparisons.csv); Wilcoxon signed-rank across evaluation units pooled over seeds; "
        "Friedman test over seeds × variants with the Nemenyi critical difference; pairwise paired "
        "t-tests (heatmap).",
        f"α = {a:g}; correction: {corr}. Families: {family} comparison{'s' if family != 1 else ''} with "
        f"{settings.baseline} per metric and per test; with a p-value: {n_seed} seed-test and {n_unit} "
        f"unit-test comparisons over the {len(tables)} metric{'s' if len(tables) != 1 else ''}; "
        f"{n_pairs} pair{'s' if n_pairs != 1 else ''} in the pairwise family. CIs are per comparison "
        "(not adjusted for multiplicity).",
        f"CI: {settings.confidence:.0%} {_ci_name(settings)} of the mean paired difference over seeds, "
        f"{settings.bootstrap:,} resamples; needs ≥ {stats.min_seeds_ci(settings.ci)} paired seeds.",
    ]
    if cal is None:
        return lines + ["Simulation: not run (no comparison, or report.calibration = 0)."]
    k, m, n = cal["n_seeds"], cal["n_variants"], cal["comparisons"]
    lines.append(
        f"Simulation at report time, through the same code path (ablate.stats.compare with these settings, "
        f"{cal['bootstrap']} bootstrap resamples, RNG seed {settings.seed}): {n} null comparisons in "
        f"{cal['studies']} synthetic studies shaped like this one ({k} seeds × {m} variant"
        f"{'s' if m != 1 else ''} + baseline), every variant identical in distribution to the baseline "
        "(normal seed-to-seed differences; all tests and intervals are location-scale invariant, so "
        "the metric's scale does not matter).")
    if k < stats.MIN_SEEDS_TEST:
        lines.append(f"False-positive rate: {_seeds(k)}: no seed test to calibrate.")
    else:
        lines += [
            f"Raw seed-test p < α: {_rate(cal['fpr_raw'], n)} of null comparisons (expected {a:.0%}).",
            f"Flagged significant after {corr}: {_rate(cal['fpr_adj'], n)} of null comparisons; studies with "
            f"any false positive (family-wise rate): {_rate(cal['fwer'], cal['studies'])} "
            f"(≤ {a:.0%} expected).",
            f"Power: a planted effect of paired d = {cal['planted_d']:.2f} (the size a t-test at α/{m} "
            "detects "
            f"{cal['power']:.0%} of the time with {k} seeds; smaller effects are likely missed) was "
            f"flagged in {_rate(cal['power_measured'], cal['planted_studies'])} of studies.",
        ]
    if _isnan(cal["ci_coverage"]):
        lines.append(f"CI coverage: {_seeds(k)}: the {_ci_name(settings)} interval needs "
                     f"≥ {stats.min_seeds_ci(settings.ci)} seeds.")
    else:
        lines.append(f"CI coverage: the {settings.confidence:.0%} interval contained the true Δ = 0 in "
                     f"{_rate(cal['ci_coverage'], n)} of null comparisons (nominal "
                     f"{settings.confidence:.0%}).")
    lines.append("Not simulated here: the unit test. Its (seed, unit) pairs are not independent "
                 "replications; it is calibrated in the test suite (tests/test_calibration.py), which also "
                 "shows it over-rejecting when trained models vary by seed — hence it never sets the mark.")
    return lines


def _failures_block(failures: pd.DataFrame | None) -> list[Block]:
    if failures is None or failures.empty:
        return []
    rows = [[str(r.variant), str(r.seed), str(r.reason)] for r in failures.itertuples()]
    return [Block("h2", "Failed trials"),
            Block("p", f"{len(rows)} trial(s) failed and are left out of every comparison above; "
                       "`ablate run --retry-failed` trains them again."),
            Block("table", headers=["variant", "seed", "reason"], items=rows, left=3)]


def _tuning_blocks(results: pd.DataFrame, names: list[str]) -> list[Block]:
    """Searched parameters and parameter matching per variant, when the study used them."""
    blocks = []
    search = [c for c in results.columns if c.startswith("search.")]
    if search:
        rows = [[n, *[str(results.loc[results.variant == n, c].iloc[0]) for c in search]] for n in names]
        blocks += [Block("h2", "Searched parameters"),
                   Block("p", "Each variant's best parameters from its own search (equal trial budget per "
                              "variant, validation metric), then trained over every seed."),
                   Block("table", headers=["variant", *[c.removeprefix("search.") for c in search]], items=rows, left=1)]
    if "match.params" in results.columns:
        knobs = [c for c in results.columns if c.startswith("match.model.")]
        rows = []
        for n in names:
            first = results[results.variant == n].iloc[0]
            scaled = "; ".join(f"{c.removeprefix('match.')} = {first[c]}" for c in knobs if not _isnan(first[c])) or "—"
            rows.append([n, f"{int(first['match.before']):,}", f"{int(first['match.params']):,}",
                         f"{int(first['match.base_params']):,}", scaled])
        blocks += [Block("h2", "Parameter matching"),
                   Block("p", "match_params: each variant's width knob scaled so its backbone has the baseline's "
                              "parameter count within 2% (embedding and head are shared and not counted)."),
                   Block("table", headers=["variant", "backbone params before", "after", "baseline", "knob"],
                         items=rows, left=1)]
    return blocks


def write_report(results: pd.DataFrame, units: pd.DataFrame | None, curves: pd.DataFrame | None,
                 settings: ReportSettings, out_dir: Path, failures: pd.DataFrame | None = None) -> dict[str, Path]:
    """Write the report files into ``out_dir``; return their paths by name.

    Names: ``csv`` (results.csv, the frame as given), ``comparisons`` (every ``stats.compare`` row
    for every metric), ``pairwise`` (every ``stats.pairwise`` row, primary metric), ``tex``
    (table.tex), ``md``, ``html``, and one per figure drawn: ``seeds`` (primary metric) and
    ``seeds:<metric>`` per secondary metric, ``curves`` (when curves are non-empty), ``cd`` (when
    the Friedman test is available), ``pairwise_fig`` (≥ 2 variants), ``cost_quality`` (when a
    wall-time or parameter column exists).
    """
    out_dir = Path(out_dir)
    fig_dir = out_dir / "figures"
    fig_dir.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {"csv": out_dir / "results.csv"}
    results.to_csv(paths["csv"], index=False)

    tables = {m: stats.compare(results, units, settings, m) for m in settings.metrics}
    paths["comparisons"] = out_dir / "comparisons.csv"
    pd.concat(tables.values(), ignore_index=True).to_csv(paths["comparisons"], index=False)
    primary = tables[settings.primary]
    names = list(primary["variant"])
    family = int((primary["variant"] != settings.baseline).sum())
    fr = stats.friedman(results, settings.primary, settings.higher(settings.primary), settings.alpha)
    pairs = stats.pairwise(results, settings)
    paths["pairwise"] = out_dir / "pairwise.csv"
    pairs.to_csv(paths["pairwise"], index=False)
    paths["tex"] = out_dir / "table.tex"
    paths["tex"].write_text(latex_table(primary, settings), encoding="utf-8")

    seeds = int(primary["n_paired"].max())
    cal = stats.calibrate(settings, seeds, family, bootstrap=min(settings.bootstrap, CALIBRATION_BOOTSTRAP))

    blocks = [Block("h1", f"Ablation report: {settings.study}"), Block("p", _findings(primary, settings)),
              Block("h2", "Settings"), *[Block("p", t) for t in _settings_text(settings, family, seeds)]]
    if settings.notes:
        blocks.append(Block("list", items=list(settings.notes)))

    def figure(name: str, path: Path | None, caption: str) -> None:
        if path is not None:
            paths[name] = path
            blocks.append(Block("figure", caption, path=path))

    for i, (metric, cmp) in enumerate(tables.items()):
        headers, rows = _table_rows(cmp, settings)
        blocks += [Block("h2", f"{'Primary' if i == 0 else 'Secondary'} metric: {metric}"),
                   Block("table", headers=headers, items=rows)]
        name, file = ("seeds", "seeds.png") if i == 0 else (f"seeds:{metric}", f"seeds_{_slug(metric)}.png")
        figure(name, strip_figure(results, settings, names, fig_dir / file, metric),
               f"Test {metric} per seed by variant (box: spread over seeds; dashed: baseline mean).")

    cost = _cost_table(results, names)
    if cost:
        blocks += [Block("h2", "Cost (mean per trial over seeds)"),
                   Block("table", headers=cost[0], items=cost[1], left=1)]
        figure("cost_quality", cost_figure(results, primary, settings, names, fig_dir / "cost_quality.png"),
               f"Cost vs. quality: test {settings.primary} mean ± sd over seeds against wall time per "
               "trial (± sd) and parameter count, one point per variant (◆ baseline).")

    blocks += _tuning_blocks(results, names) + _failures_block(failures)
    blocks += [Block("h2", "Ranking"), Block("p", _friedman_text(fr, settings, len(names)))]
    if fr is not None:
        figure("cd", cd_figure(fr, settings, fig_dir / "cd.png"),
               "Mean Friedman ranks with ± CD/2 bars (Nemenyi): non-overlapping bars differ.")
    if len(pairs):
        blocks.append(Block("p", _pairwise_text(pairs, settings)))
        figure("pairwise_fig", pairwise_figure(pairs, settings, names, fig_dir / "pairwise.png"),
               f"Pairwise {CORRECTION_NAMES.get(settings.correction, settings.correction)}-adjusted p-values "
               f"(paired t-test across seeds) on test {settings.primary}; * p < {settings.alpha:g}; "
               f"n/a: fewer than {stats.MIN_SEEDS_TEST} paired seeds.")

    curve_path = curves_figure(curves, settings, names, fig_dir / "curves.png")
    if curve_path is not None:
        blocks.append(Block("h2", "Learning curves"))
        figure("curves", curve_path, f"Validation {settings.primary} (and training loss, when logged) "
                                     "per epoch: mean over seeds, band ± 1 sd.")

    blocks += [Block("h2", "Calibration"),
               Block("list", items=_calibration_text(cal, settings, tables, int(pairs["p"].notna().sum())))]
    blocks += [Block("h2", "Files"), Block("list", items=[
        "results.csv: one row per trial (what the report is built from)",
        "comparisons.csv: every comparison with the baseline, every metric, raw and adjusted p-values",
        "pairwise.csv: every pair of variants on the primary metric",
        "table.tex: the primary metric's table (LaTeX, booktabs)",
        "figures/: the figures above as PNG"])]

    paths["md"] = out_dir / "report.md"
    paths["md"].write_text(_to_md(blocks, out_dir), encoding="utf-8")
    paths["html"] = out_dir / "report.html"
    paths["html"].write_text(_to_html(blocks, f"Ablation report: {settings.study}"), encoding="utf-8")
    return paths

"""The report's tables: one ``stats.compare`` frame as rows of cells, as Markdown (also what
``ablate report`` prints) and as a booktabs LaTeX table; the cost table."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from ablate.report.baselines import Trivial
from ablate.report.cells import NA, confidence, interval, isnan, mdd, mean_sd, number, p_decision, verdict
from ablate.report.document import md_table
from ablate.stats import ComparisonRow, ReportSettings, comparison_rows

COSTS = [
    ("params", "params", "{:,.0f}"),
    ("tokens_per_s", "tokens/s", "{:,.0f}"),
    ("peak_memory_mb", "peak memory MB", "{:,.1f}"),
    ("wall_s", "wall s", "{:,.1f}"),
    ("cpu_s", "CPU s", "{:,.1f}"),
    ("train_gflop", "train GFLOP", "{:,.1f}"),
    ("epochs", "epochs", "{:,.1f}"),
]
# Costs a trial records as 0 where it has no figure (a task's own training: its model's size and
# throughput are its own), shown as "—" rather than 0.
NONE_WHEN_ZERO = {"params", "tokens_per_s"}


def table_rows(
    cmp: list[ComparisonRow], settings: ReportSettings, baselines: list[Trivial] = ()
) -> tuple[list[str], list[list[str]]]:
    """Headers and rows of one metric's comparisons, baseline first: the verdict and the one
    interval it reads (the per-unit tests and the bootstrap interval stay in comparisons.csv); then
    the trivial ``baselines``' values, without a comparison."""
    metric = cmp[0].metric if cmp else settings.primary
    higher = settings.higher(metric)
    headers = [
        "variant",
        "differs",
        f"{metric} mean ± sd",
        "Δ [interval]",
        "conf.",
        "rel. change",
        "MDD",
        # a sequential primary metric's p is raw, read against its look's nominal level
        "p (vs look level)" if settings.sequential is not None and metric == settings.primary else "p (adj)",
        "verdict",
    ]
    base_mean = next((r.mean for r in cmp if r.variant == settings.baseline), float("nan"))
    rows = []
    for row in cmp:
        if row.variant == settings.baseline:
            rows.append([row.variant, row.differs, mean_sd(row)] + ["—"] * (len(headers) - 3))
            continue
        rows.append(
            [
                row.variant,
                row.differs,
                mean_sd(row),
                interval(row),
                confidence(row),
                NA if isnan(row.rel_change) else f"{row.rel_change:+.1%}",
                mdd(row, base_mean),
                p_decision(row),
                verdict(row, higher),
            ]
        )
    for b in baselines:
        rows.append(
            [b.label, f"trivial baseline: {b.about}", number(b.value(metric))] + ["—"] * (len(headers) - 3)
        )
    return headers, rows


def format_table(compare_df: pd.DataFrame, settings: ReportSettings) -> str:
    """The Markdown table of one ``stats.compare`` frame (the CLI prints the primary metric's)."""
    return md_table(*table_rows(comparison_rows(compare_df), settings))


TEX_SPECIALS = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "<": r"\textless{}",
    ">": r"\textgreater{}",
}
# the report's non-ASCII glyphs, in plain LaTeX (no packages beyond booktabs)
TEX_GLYPHS = {
    "±": r"$\pm$",
    "−": r"$-$",
    "∞": r"$\infty$",
    "—": "---",
    "–": "--",
    "Δ": r"$\Delta$",
    "▲": r"$\uparrow$",
    "▼": r"$\downarrow$",
    "△": r"$\bigtriangleup$",
    "▽": r"$\bigtriangledown$",
    "≥": r"$\geq$",
    "≤": r"$\leq$",
    "α": r"$\alpha$",
    "≈": r"$\approx$",
    "†": r"$\dagger$",
}


def tex_escape(text) -> str:
    """``text`` as LaTeX text: the ten specials (and < >) escaped, the report's glyphs as math."""
    return "".join(TEX_SPECIALS.get(c, TEX_GLYPHS.get(c, c)) for c in str(text))


def latex_table(cmp: list[ComparisonRow], settings: ReportSettings) -> str:
    """The Markdown table of one metric's comparisons as a booktabs ``table`` environment."""
    headers, rows = table_rows(cmp, settings)
    metric = cmp[0].metric if cmp else settings.primary
    n = max((r.n_paired for r in cmp), default=0)
    tested = sum(r.verdict is not None for r in cmp)
    margin = [r.margin for r in cmp if not isnan(r.margin)]
    within = f"±{number(margin[0])}" if margin else "the margin"
    caption = (
        f"Ablation study {settings.study}: test {metric}, mean ± sd over seeds (up to {n} paired); "
        f"Δ = variant − {settings.baseline} with its paired t interval at the comparison's "
        f"{settings.correction_method.label}-adjusted level (conf.), which the verdict reads: better / worse "
        f"when it excludes 0 (▲/▼), equivalent when the two one-sided tests' interval (shown instead, at "
        f"its own conf.) lies within {within}, else inconclusive; "
        f"MDD = the difference detected with 80% power at that level; p {settings.correction_method.label}-"
        f"adjusted over the {tested} tested comparisons with {settings.baseline}, α = {settings.alpha:g}."
    )
    label = re.sub(r"[^A-Za-z0-9_:.-]+", "-", f"tab:ablate:{settings.study}:{metric}")
    spec = "l" * 2 + "r" * (len(headers) - 3) + "l"
    what = f"{tex_escape(settings.study)}, primary metric {tex_escape(metric)}"
    cells = [[tex_escape(c) for c in r] for r in rows]
    return booktabs_table(what, caption, label, spec, headers, cells)


def booktabs_table(
    what: str,
    caption: str,
    label: str,
    spec: str,
    headers: list[str],
    cells: list[list[str]],
    rule_before: int | None = None,
) -> str:
    """A standalone ``table`` environment (booktabs rules) of already-escaped ``cells``, scaled
    down to the column's width when it is wider (graphicx's ``\\resizebox``; a narrower table keeps
    its size); ``rule_before``: a ``\\midrule`` before that row (e.g. between variants and baselines)."""
    body = [" & ".join(r) + r" \\" for r in cells]
    if rule_before is not None and 0 < rule_before < len(body):
        body.insert(rule_before, r"\midrule")
    lines = [
        f"% ablate report: {what}.",
        r"% Needs \usepackage{booktabs} and \usepackage{graphicx}.",
        r"\begin{table}[t]",
        r"\centering",
        r"\small",
        rf"\caption{{{tex_escape(caption)}}}",
        rf"\label{{{label}}}",
        r"\setlength{\tabcolsep}{4pt}",
        rf"\sbox0{{\begin{{tabular}}{{{spec}}}",
        r"\toprule",
        " & ".join(tex_escape(h) for h in headers) + r" \\",
        r"\midrule",
        *body,
        r"\bottomrule",
        r"\end{tabular}}%",
        r"\ifdim\wd0>\linewidth\resizebox{\linewidth}{!}{\usebox0}\else\usebox0\fi",
        r"\end{table}",
    ]
    return "\n".join(lines) + "\n"


def cost_table(results: pd.DataFrame, names: list[str]) -> tuple[list[str], list[list[str]]] | None:
    """Mean cost per trial over seeds, per variant; None when no cost column was logged."""
    cols = [(c, label, fmt) for c, label, fmt in COSTS if c in results.columns]
    if not cols:
        return None
    frame = results.assign(variant=results["variant"].astype(str))
    for c in NONE_WHEN_ZERO & set(frame.columns):  # a trial of the task's own code counts neither
        values = pd.to_numeric(frame[c], errors="coerce").to_numpy(dtype=float, na_value=np.nan)
        frame[c] = np.where(values == 0, np.nan, values)
    means = frame.groupby("variant")[[c for c, _, _ in cols]].agg(
        lambda s: pd.to_numeric(s, errors="coerce").mean()
    )
    rows = []
    for v in names:
        row = [v]
        for c, _, fmt in cols:
            x = means.loc[v, c] if v in means.index else np.nan
            row.append(NA if isnan(float(x)) else fmt.format(x))
        rows.append(row)
    return ["variant"] + [label for _, label, _ in cols], rows

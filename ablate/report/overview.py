"""The report's first table: variants × every metric, mean ± sd over seeds with each verdict's mark
against the baseline and the best mean per metric in bold; as Markdown / HTML cells and as the
booktabs LaTeX table written to ``table.tex``."""

from __future__ import annotations

import re

from ablate.report.baselines import Trivial, baseline_legend
from ablate.report.cells import isnan, mean_sd, number
from ablate.report.document import Strong
from ablate.report.tables import booktabs_table, tex_escape
from ablate.stats import ComparisonRow, ReportSettings, Verdict

# A verdict's mark in the overview; a comparison without a verdict (too few seeds, a duplicate) has none.
VERDICT_MARKS = {Verdict.BETTER: "▲", Verdict.WORSE: "▼", Verdict.EQUIVALENT: "=", Verdict.INCONCLUSIVE: "?"}
# A secondary metric's verdicts are exploratory (its own family, not corrected across the metrics):
# open triangles, so that they do not read as findings beside the primary metric's.
EXPLORATORY_MARKS = VERDICT_MARKS | {Verdict.BETTER: "△", Verdict.WORSE: "▽"}


def _best(cmp: list[ComparisonRow], higher: bool) -> str | None:
    """The best mean as shown (ties at the shown precision are all best); None: no mean."""
    means = [r.mean for r in cmp if not isnan(r.mean)]
    if not means:
        return None
    return number(max(means) if higher else min(means))


def overview_rows(
    tables: dict[str, list[ComparisonRow]], settings: ReportSettings, baselines: list[Trivial] = ()
) -> tuple[list[str], list[list[str]]]:
    """Headers and rows, variants in the primary table's order, then the trivial ``baselines``
    (their value, no sd, no mark); a metric's best variant cells are ``Strong``."""
    primary = tables[settings.primary]
    headers = ["variant", "differs", "seeds"] + [
        f"{m} (primary)" if m == settings.primary else m for m in tables
    ]
    best = {m: _best(cmp, settings.higher(m)) for m, cmp in tables.items()}
    by_variant = {m: {r.variant: r for r in cmp} for m, cmp in tables.items()}
    rows = []
    for row in primary:
        cells = [row.variant, row.differs, str(row.n_seeds)]
        for m in tables:
            r = by_variant[m][row.variant]
            marks = VERDICT_MARKS if m == settings.primary else EXPLORATORY_MARKS
            mark = "" if row.variant == settings.baseline else marks.get(r.verdict, "")
            shown = mean_sd(r) + (f" {mark}" if mark else "")
            is_best = best[m] is not None and r.n_seeds > 0 and number(r.mean) == best[m]
            cells.append(Strong(shown) if is_best else shown)
        rows.append(cells)
    for b in baselines:
        rows.append([b.label, f"trivial baseline: {b.about}", "—", *[number(b.value(m)) for m in tables]])
    return headers, rows


def _directions(tables: dict[str, list[ComparisonRow]], settings: ReportSettings) -> str:
    lower = [m for m in tables if not settings.higher(m)]
    if not lower:
        return "higher is better for every metric"
    higher = [m for m in tables if settings.higher(m)]
    said = f"lower is better for {', '.join(lower)}"
    return said + (f", higher for {', '.join(higher)}" if higher else "")


def overview_legend(
    tables: dict[str, list[ComparisonRow]], settings: ReportSettings, baselines: list[Trivial] = ()
) -> str:
    """What the marks and the bold mean (the same words as table.tex's caption)."""
    secondary = [m for m in tables if m != settings.primary]
    exploratory = (
        f"; the secondary metrics ({', '.join(secondary)}) are exploratory, each corrected over its "
        "own family, and marked △ better, ▽ worse"
        if secondary
        else ""
    )
    return (
        f"Test metrics, mean ± sd over seeds. Marks against {settings.baseline}, from each metric's verdict "
        f"(its paired t interval at the {settings.correction_method.label}-adjusted level, "
        f"α = {settings.alpha:g}): ▲ better, ▼ worse, = equivalent within the margin, ? inconclusive; "
        f"no mark: not tested (fewer than 3 paired seeds, or a duplicate). Bold: the best mean per "
        f"metric ({_directions(tables, settings)}){exploratory}.{baseline_legend(baselines)}"
    )


def _tex_cell(cell) -> str:
    text = tex_escape(cell)
    return rf"\textbf{{{text}}}" if isinstance(cell, Strong) else text


def latex_caption(
    tables: dict[str, list[ComparisonRow]], settings: ReportSettings, seeds: str, marks: bool
) -> str:
    """table.tex's caption, short (two or three lines in a paper): the legend's words in brief."""
    secondary = " (△ ▽: secondary, exploratory)" if len(tables) > 1 else ""
    lower = [m for m in tables if not settings.higher(m)]
    direction = f"; lower is better for {', '.join(lower)}" if lower else ""
    return (
        f"{settings.study}: test metrics, mean ± sd over {seeds}; against {settings.baseline} "
        f"({settings.correction_method.label}, α = {settings.alpha:g}): ▲ better, ▼ worse, = equivalent, "
        f"? inconclusive{secondary}; bold: best{direction}{'; †: trivial baseline' if marks else ''}."
    )


def overview_latex(
    tables: dict[str, list[ComparisonRow]], settings: ReportSettings, baselines: list[Trivial] = ()
) -> str:
    """The overview as a booktabs ``table`` environment (needs ``\\usepackage{booktabs}`` and
    ``graphicx``), scaled down to the column's width when wider (``\\resizebox``).

    Narrower than the Markdown table, to fit a paper's column: no ``differs`` column (the paper's
    text names what each variant changes), the seed count in the caption when every variant has the
    same, the trivial baselines under a rule."""
    headers, rows = overview_rows(tables, settings, baselines)
    variants = rows[: len(rows) - len(baselines)]
    seeds = {r[2] for r in variants}
    keep = [0] + ([2] if len(seeds) > 1 else []) + list(range(3, len(headers)))
    headers, rows = [headers[i] for i in keep], [[r[i] for i in keep] for r in rows]
    shown = f"{next(iter(seeds))} seeds" if len(seeds) == 1 else "seeds"
    caption = latex_caption(tables, settings, shown, bool(baselines))
    label = re.sub(r"[^A-Za-z0-9_:.-]+", "-", f"tab:ablate:{settings.study}")
    spec = "l" + "r" * (len(headers) - 1)
    cells = [[_tex_cell(c) for c in r] for r in rows]
    what = f"{tex_escape(settings.study)}, every metric"
    return booktabs_table(what, caption, label, spec, headers, cells, rule_before=len(variants))

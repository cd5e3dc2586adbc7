"""The study report: ``results.csv``, ``comparisons.csv``, ``pairwise.csv``, ``table.tex``,
``report.md``, ``report.html``, ``figures/``.

The report is one list of document elements (headings, paragraph, list, warnings, table, figure,
code) rendered twice: to Markdown (figures linked from ``figures/``) and to a self-contained HTML
page (figures embedded as base64 PNG). It reads like a paper: results first (the primary verdicts,
one table of variants × every metric, convergence warnings), the Methods after them.
``table.tex`` is that first table as a booktabs LaTeX table. Numbers come from
:mod:`ablate.stats`; nothing here computes a test.

Modules: :mod:`.cells` (numbers as text), :mod:`.document` (elements and their renderers),
:mod:`.overview` (the first table, also as LaTeX), :mod:`.tables` (each metric's detail table,
Markdown and LaTeX; cost), :mod:`.convergence` (not-converged warnings), :mod:`.figures`,
:mod:`.verdicts` (the verdicts in words: opening lines, settings, calibration), :mod:`.text` (the
ranking paragraphs), :mod:`.sequential`, :mod:`.factorial`, :mod:`.methods` (the Methods section:
data, verdicts, convergence, costs, calibration, software and configuration), :mod:`.write`
(``analyse``: the statistics as typed data; ``render``: them written; ``write_report``: both),
:mod:`.foreign` (runs ablate did not make, read and reported the same way). It imports ``stats``,
``tracking`` and the layers below; never the driver or the commands.
"""

from __future__ import annotations

from ablate_namesake import stop_if_clashing

# The unrelated PyPI `ablate`'s __init__, once it has replaced ours, imports this package as its
# own `report` module: the one line about the clash (ablate_namesake) before any import below fails.
stop_if_clashing()
# ruff: noqa: E402 (the imports below follow that check on purpose)

from ablate.report.cells import NA
from ablate.report.convergence import NotConverged, not_converged
from ablate.report.document import CSS, HTML, MARKDOWN, Element, Strong
from ablate.report.figures import cd_figure, cost_figure, curves_figure, pairwise_figure, strip_figure
from ablate.report.overview import VERDICT_MARKS, overview_latex, overview_rows
from ablate.report.tables import COSTS, TEX_GLYPHS, TEX_SPECIALS, format_table, latex_table, tex_escape
from ablate.report.write import Analysis, analyse, render, write_report

__all__ = [
    "COSTS",
    "CSS",
    "HTML",
    "MARKDOWN",
    "NA",
    "TEX_GLYPHS",
    "TEX_SPECIALS",
    "VERDICT_MARKS",
    "Analysis",
    "Element",
    "NotConverged",
    "Strong",
    "cd_figure",
    "cost_figure",
    "analyse",
    "curves_figure",
    "format_table",
    "latex_table",
    "not_converged",
    "overview_latex",
    "overview_rows",
    "pairwise_figure",
    "render",
    "strip_figure",
    "tex_escape",
    "write_report",
]

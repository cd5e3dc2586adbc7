"""The study report: ``results.csv``, ``comparisons.csv``, ``pairwise.csv``, ``table.tex``,
``report.md``, ``report.html``, ``figures/``.

The report is one list of document elements (heading, paragraph, list, table, figure) rendered
twice: to Markdown (figures linked from ``figures/``) and to a self-contained HTML page (figures
embedded as base64 PNG). ``table.tex`` is the primary metric's table as a booktabs LaTeX table.
Numbers come from :mod:`ablate.stats`; nothing here computes a test.

Modules: :mod:`.cells` (numbers as text), :mod:`.document` (elements and their renderers),
:mod:`.tables` (Markdown, LaTeX, cost), :mod:`.figures`, :mod:`.verdicts` (the verdicts in words:
opening lines, settings, calibration), :mod:`.text` (the ranking paragraphs), :mod:`.write`
(``write_report``: everything assembled and written).
"""

from __future__ import annotations

from .cells import NA
from .document import CSS, HTML, MARKDOWN, Element
from .figures import cd_figure, cost_figure, curves_figure, pairwise_figure, strip_figure
from .tables import COSTS, TEX_GLYPHS, TEX_SPECIALS, format_table, latex_table, tex_escape
from .write import write_report

__all__ = [
    "COSTS",
    "CSS",
    "HTML",
    "MARKDOWN",
    "NA",
    "TEX_GLYPHS",
    "TEX_SPECIALS",
    "Element",
    "cd_figure",
    "cost_figure",
    "curves_figure",
    "format_table",
    "latex_table",
    "pairwise_figure",
    "strip_figure",
    "tex_escape",
    "write_report",
]

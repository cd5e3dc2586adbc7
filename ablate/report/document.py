"""The report as one list of elements (headings, paragraph, list, warnings, table, figure, code),
rendered to Markdown (figures linked from ``figures/``) and to a self-contained HTML page (figures
embedded as base64 PNG, code folded in ``<details>``)."""

from __future__ import annotations

import base64
import html
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


class Strong(str):
    """A table cell shown in bold (the best value of its column)."""


@dataclass
class Element:
    """One piece of the report document."""

    kind: str  # h1 | h2 | h3 | p | caption | list | warnings | table | figure | code
    text: str = ""  # code: the code itself
    items: list | None = None
    headers: list[str] | None = None
    path: Path | None = None
    left: int = 2  # tables: leading text columns; the rest are right-aligned numbers
    title: str = ""  # code: what it is (the HTML page folds the code under this line)
    language: str = ""  # code: its language, for Markdown's fence


def md_table(headers: list[str], rows: list[list[str]], left: int = 2) -> str:
    def esc(cell) -> str:
        text = str(cell).replace("|", "\\|")
        return f"**{text}**" if isinstance(cell, Strong) else text

    lines = [
        "| " + " | ".join(esc(h) for h in headers) + " |",
        "|" + "|".join("---" if i < left else "---:" for i in range(len(headers))) + "|",
    ]
    lines += ["| " + " | ".join(esc(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def _md_code(e: Element) -> str:
    fence = "````" if "```" in e.text else "```"
    return f"{fence}{e.language}\n{e.text.rstrip()}\n{fence}"


# One renderer per element kind and format: adding a kind is one entry in each table.
MARKDOWN: dict[str, Callable[[Element, Path], str]] = {
    "h1": lambda e, out: f"# {e.text}",
    "h2": lambda e, out: f"## {e.text}",
    "h3": lambda e, out: f"### {e.text}",
    "p": lambda e, out: e.text,
    "caption": lambda e, out: f"*{e.text}*",
    "list": lambda e, out: "\n".join(f"- {i}" for i in e.items),
    "warnings": lambda e, out: "\n".join(f"- ⚠ {i}" for i in e.items),
    "table": lambda e, out: md_table(e.headers, e.items, e.left),
    "figure": lambda e, out: f"![{e.text}]({e.path.relative_to(out).as_posix()})\n\n*{e.text}*",
    "code": lambda e, out: _md_code(e),
}


def to_markdown(elements: list[Element], out_dir: Path) -> str:
    return "\n\n".join(MARKDOWN[e.kind](e, out_dir) for e in elements) + "\n"


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
figure{margin:1.5em 0}figure img{max-width:100%;height:auto}figcaption,p.caption{color:#555;font-size:.9em}
ul{padding-left:1.4em}li{margin:.25em 0}code{font-size:.95em}h3{margin-top:1.4em}
ul.warn{list-style:none;padding:.5em .9em;background:#fff6e0;border-left:4px solid #e0a100}
details{margin:1em 0}summary{cursor:pointer;color:#333}
pre{background:#f6f6f6;padding:.7em;overflow-x:auto;font-size:.85em;line-height:1.35}
"""


def _html_cell(cell) -> str:
    text = html.escape(str(cell))
    return f"<strong>{text}</strong>" if isinstance(cell, Strong) else text


def _html_table(e: Element) -> str:
    esc = html.escape
    head = "".join(f"<th{' class=num' if j >= e.left else ''}>{esc(h)}</th>" for j, h in enumerate(e.headers))
    body = "".join(
        "<tr>"
        + "".join(
            f"<td class={'num' if j >= e.left else 'txt'}>{_html_cell(c)}</td>" for j, c in enumerate(r)
        )
        + "</tr>"
        for r in e.items
    )
    return f'<div class="wrap"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def _html_figure(e: Element) -> str:
    data = base64.b64encode(e.path.read_bytes()).decode("ascii")
    return (
        f'<figure><img alt="{html.escape(e.text)}" src="data:image/png;base64,{data}">'
        f"<figcaption>{html.escape(e.text)}</figcaption></figure>"
    )


def _html_code(e: Element) -> str:
    return (
        f"<details><summary>{html.escape(e.title)}</summary>"
        f"<pre><code>{html.escape(e.text.rstrip())}</code></pre></details>"
    )


HTML: dict[str, Callable[[Element], str]] = {
    "h1": lambda e: f"<h1>{html.escape(e.text)}</h1>",
    "h2": lambda e: f"<h2>{html.escape(e.text)}</h2>",
    "h3": lambda e: f"<h3>{html.escape(e.text)}</h3>",
    "p": lambda e: f"<p>{html.escape(e.text)}</p>",
    "caption": lambda e: f'<p class="caption">{html.escape(e.text)}</p>',
    "list": lambda e: "<ul>" + "".join(f"<li>{html.escape(str(i))}</li>" for i in e.items) + "</ul>",
    "warnings": lambda e: (
        '<ul class="warn">' + "".join(f"<li>⚠ {html.escape(str(i))}</li>" for i in e.items) + "</ul>"
    ),
    "table": _html_table,
    "figure": _html_figure,
    "code": _html_code,
}


def to_html(elements: list[Element], title: str) -> str:
    esc = html.escape
    parts = [HTML[e.kind](e) for e in elements]
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>'
        f"<style>{CSS}</style></head><body>\n" + "\n".join(parts) + "\n</body></html>\n"
    )

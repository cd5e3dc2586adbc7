"""The report as one list of elements (headings, paragraph, list, warnings, table, figure, code),
rendered to Markdown (figures linked from ``figures/``) and to a self-contained HTML page (figures
embedded as base64 PNG, code folded in ``<details>``)."""

from __future__ import annotations

import base64
import html
import re
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
nav.toc{background:#f7f7f7;padding:.5em 1em;margin:1em 0;font-size:.92em}nav.toc ul{margin:.2em 0}
nav.toc li{margin:.1em 0}
pre{background:#f6f6f6;padding:.7em;overflow-x:auto;font-size:.85em;line-height:1.35}
"""


_CODE = re.compile(r"`([^`]+)`")
_LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)")


def inline(text: str) -> str:
    """Running text as HTML: escaped, Markdown's `code` as ``<code>``, ``[label](href)`` as a link."""
    escaped = _CODE.sub(r"<code>\1</code>", html.escape(str(text), quote=False))
    return _LINK.sub(lambda m: f'<a href="{html.escape(m.group(2))}">{m.group(1)}</a>', escaped)


def anchor(text: str) -> str:
    """A heading's id: lower case, words joined by '-'."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "section"


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
    file = f"{e.path.parent.name}/{e.path.name}"
    return (
        f'<figure><img alt="{html.escape(e.text)}" src="data:image/png;base64,{data}">'
        f'<figcaption>{inline(e.text)} (<a href="{html.escape(file)}">{html.escape(file)}</a>)</figcaption>'
        "</figure>"
    )


def _html_code(e: Element) -> str:
    return (
        f"<details><summary>{html.escape(e.title)}</summary>"
        f"<pre><code>{html.escape(e.text.rstrip())}</code></pre></details>"
    )


HTML: dict[str, Callable[[Element], str]] = {
    "h1": lambda e: f"<h1>{html.escape(e.text)}</h1>",
    "h2": lambda e: f'<h2 id="{anchor(e.text)}">{html.escape(e.text)}</h2>',
    "h3": lambda e: f'<h3 id="{anchor(e.text)}">{html.escape(e.text)}</h3>',
    "p": lambda e: f"<p>{inline(e.text)}</p>",
    "caption": lambda e: f'<p class="caption">{inline(e.text)}</p>',
    "list": lambda e: "<ul>" + "".join(f"<li>{inline(i)}</li>" for i in e.items) + "</ul>",
    "warnings": lambda e: '<ul class="warn">' + "".join(f"<li>⚠ {inline(i)}</li>" for i in e.items) + "</ul>",
    "table": _html_table,
    "figure": _html_figure,
    "code": _html_code,
}


def contents(elements: list[Element]) -> str:
    """The page's table of contents: a link to each section (h2), its subsections (h3) under it."""
    items, open_sub = [], False
    for e in elements:
        link = f'<a href="#{anchor(e.text)}">{html.escape(e.text)}</a>'
        if e.kind == "h2":
            items.append(("</ul></li>" if open_sub else "</li>" if items else "") + f"<li>{link}")
            open_sub = False
        elif e.kind == "h3" and items:
            items.append(("" if open_sub else "<ul>") + f"<li>{link}</li>")
            open_sub = True
    if not items:
        return ""
    return (
        '<nav class="toc"><strong>Contents</strong><ul>'
        + "".join(items)
        + ("</ul></li>" if open_sub else "</li>")
        + "</ul></nav>"
    )


def to_html(elements: list[Element], title: str) -> str:
    esc = html.escape
    parts = [HTML[e.kind](e) for e in elements]
    toc = contents(elements)
    if toc:  # after the title
        first = next((i for i, e in enumerate(elements) if e.kind == "h1"), -1)
        parts.insert(first + 1, toc)
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>'
        f"<style>{CSS}</style></head><body>\n" + "\n".join(parts) + "\n</body></html>\n"
    )

"""Writing one benchmark's section into benchmarks/RESULTS.md, leaving the others as they are."""

from __future__ import annotations

from pathlib import Path

RESULTS = Path(__file__).with_name("RESULTS.md")


def write_section(title: str, section: str) -> None:
    """Replace the section headed ``title`` (up to the next ``## ``) with ``section``, or
    append it when RESULTS.md has none yet."""
    text = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n"
    if title in text:
        start = text.index(title)
        end = text.find("\n## ", start + len(title))
        text = text[:start] + section + (text[end + 1 :] if end != -1 else "")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    RESULTS.write_text(text)

"""Writing one benchmark's section into benchmarks/RESULTS.md, leaving the others as they are, and
what the two-form benchmarks (the package's form of an operation beside the one it replaced,
interleaved in one run) share: their command-line options and their table."""

from __future__ import annotations

import argparse
import platform
import statistics
from datetime import date
from pathlib import Path

import torch

RESULTS = Path(__file__).with_name("RESULTS.md")


def cpu() -> str:
    """The CPU, as a figure measured on it needs naming: its model (Linux's /proc/cpuinfo) and the
    widest vector instructions torch's kernels use on it. Timings differ several-fold between the
    machines these benchmarks run on (bf16 on a CPU without bf16 instructions: 8× slower than fp32
    on 2026-11-29's AVX2 machine, faster than fp32 on 2026-11-23's)."""
    model = platform.processor() or platform.machine()
    info = Path("/proc/cpuinfo")
    if info.is_file():
        lines = info.read_text().splitlines()
        names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
        model = names[0] if names else model
    return f"{model}, {torch.backends.cpu.get_cpu_capability()}"


def cpu_class() -> str:
    """``""`` on a CPU with AVX-512 (where the sections were measured before CPUs were named), else
    ``", <capability> CPU"``: a figure from another class of CPU keeps a section of its own."""
    capability = torch.backends.cpu.get_cpu_capability()
    return "" if capability.startswith("AVX512") else f", {capability} CPU"


def write_section(title: str, section: str) -> None:
    """Replace the section headed ``title`` (up to the next ``## ``; ``title`` with
    :func:`cpu_class` added) with ``section``, or append it when RESULTS.md has none yet."""
    if suffix := cpu_class():
        section, title = section.replace(title, title + suffix, 1), title + suffix
    text = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n"
    if title in text:
        start = text.index(title)
        end = text.find("\n## ", start + len(title))
        text = text[:start] + section + (text[end + 1 :] if end != -1 else "")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    RESULTS.write_text(text)


def two_form_options(parser: argparse.ArgumentParser, steps: int) -> None:
    """``--steps``, ``--reps``, ``--threads`` (torch threads, default 1), ``--note``, ``--no-write``."""
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--note", default="", help="what else was running, for the record")
    parser.add_argument("--no-write", action="store_true")


def two_form_table(results: dict[str, dict[str, list[float]]], forms: list[str]) -> list[str]:
    """Markdown rows, one per variant: the median step of ``forms[0]`` (the package's) and of
    ``forms[1]``, their ratio and every repetition's step."""
    ours, other = forms
    out = [
        f"| variant | step s, {ours} | step s, {other} | {other} / {ours} | runs, {ours} | runs, {other} |",
        "|---|---:|---:|---:|---|---|",
    ]
    for variant, times in results.items():
        fast, slow = (statistics.median(times[form]) for form in forms)
        runs = {form: " ".join(f"{t:.3f}" for t in times[form]) for form in forms}
        out.append(
            f"| {variant} | {fast:.3f} | {slow:.3f} | {slow / fast:.2f}× | {runs[ours]} | {runs[other]} |"
        )
    return out


def section_text(title: str, command: str, setting: str, loads: tuple, note: str, rows: list[str]) -> str:
    """A RESULTS.md section: ``title``, the command with the date, torch, threads and machine,
    ``setting`` (what was timed, how), the load average before and after, ``note``, ``rows``."""
    head = (
        f"`{command}` — {date.today()}, torch {torch.__version__}, {torch.get_num_threads()} CPU thread(s) "
        f"({cpu()}); {setting} Load average (1 min) {loads[0]:.1f} "
        f"before, {loads[1]:.1f} after.{(' ' + note) if note else ''}"
    )
    return "\n".join([title, "", head, "", *rows]) + "\n"


def publish(title: str, section: str, write: bool) -> None:
    """Print ``section``; with ``write``, put it into RESULTS.md under ``title``."""
    print(section)
    if write:
        write_section(title, section)

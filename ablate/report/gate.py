"""A research loop's history as a report (``history.md`` / ``history.html``): every candidate in
order with what changed, its seeds, Δ and interval, the level it was tested at and the decision;
the incumbent's trajectory with intervals on its own fresh seeds; the compute each kind of answer
took, the undecided ones' included."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

from ablate.report.cells import number
from ablate.report.document import Element, to_html, to_markdown
from ablate.stats.gate import GateDecision, GateSettings, Outcome

METHOD = (
    "Each candidate is trained at the incumbent's seeds (paired), {initial} to {max} seeds, {step} at a "
    "time while its comparison is open (group-sequential boundaries, {spending}-type α spending), and "
    "kept when its paired interval shows it better, or when it is equivalent (TOST inside ±{margin}) and "
    "declared simpler. Each is tested at the level LORD++ gives it (Ramdas et al. 2017), which keeps the "
    "false discovery rate of the loop's keeps at {alpha} over the whole stream (for independent tests; "
    "candidates share the incumbent's seeds). After a keep the incumbent is measured on a fresh block of "
    "seeds, never on the seeds it won with."
)


def _interval(d: GateDecision) -> str:
    if math.isnan(d.low):
        return "—"
    return f"[{number(d.low, True)}, {number(d.high, True)}]"


def elements(history: list[GateDecision], settings: GateSettings, title: str, start: str) -> list[Element]:
    out = [Element("h1", title), Element("p", METHOD.format(**settings.model_dump()))]
    kept = [d for d in history if d.outcome is Outcome.KEEP]
    counts = Counter(str(d.outcome) for d in history)
    summary = ", ".join(f"{n} {o}" for o, n in counts.items()) or "none yet"
    out.append(Element("p", f"{len(history)} candidate(s): {summary}; {len(kept)} change(s) kept."))
    out.append(Element("h2", "Candidates in order"))
    rows = [
        [
            str(d.number),
            d.description or d.key[:12],
            str(d.outcome),
            d.reason,
            str(len(d.seeds)),
            number(d.delta, True) if d.seeds else "—",
            _interval(d),
            f"{d.level:.3g}" if d.test is not None else "—",
        ]
        for d in history
    ]
    headers = ["#", "change", "decision", "why", "seeds", "Δ", "interval", "level"]
    out.append(Element("table", headers=headers, items=rows, left=4))
    out.append(
        Element(
            "caption",
            "Δ: candidate − incumbent on their paired seeds; interval: the paired t interval its last look "
            "read, at that look's nominal level; level: the one-sided level of its test for 'better' "
            "(LORD++'s α_t).",
        )
    )
    out.append(Element("h2", "The incumbent"))
    trajectory, current = [], f"the start ({start[:12]})"
    for d in history:
        if d.seeds and not math.isnan(d.incumbent_mean):
            low, high = number(d.incumbent_low), number(d.incumbent_high)
            seeds = f"{d.seeds[0]}–{d.seeds[-1]}"
            trajectory.append([str(d.number), current, seeds, number(d.incumbent_mean), f"[{low}, {high}]"])
        if d.outcome is Outcome.KEEP:
            current = f"#{d.number} {d.description or d.key[:12]}"
    headers = ["at #", "incumbent", "seeds", "mean", "95 % interval"]
    out.append(Element("table", headers=headers, items=trajectory, left=3))
    out.append(
        Element(
            "caption",
            "The incumbent on the seeds each candidate was compared at (after a keep: a fresh block of "
            "seeds).",
        )
    )
    if kept:
        rows = [
            [
                str(d.number),
                d.description or d.key[:12],
                number(d.delta, True),
                number(d.delta_adjusted, True),
            ]
            for d in kept
        ]
        out.append(Element("h3", "Kept changes"))
        out.append(Element("table", headers=["#", "change", "Δ observed", "Δ median-unbiased"], items=rows))
    out.append(Element("h2", "Compute"))
    spent = Counter()
    for d in history:
        spent[str(d.outcome)] += len(d.seeds)
    rows = [[o, str(counts[o]), str(spent[o])] for o in counts]
    out.append(Element("table", headers=["decision", "candidates", "paired seeds"], items=rows, left=1))
    undecided = spent[str(Outcome.UNDECIDED)]
    out.append(Element("p", f"{undecided} paired seed(s) went to candidates left undecided at the budget."))
    return out


def write_history(
    history: list[GateDecision], settings: GateSettings, folder: Path, title: str, start: str
) -> dict[str, Path]:
    """history.md and history.html in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    parts = elements(history, settings, title, start)
    paths = {"md": folder / "history.md", "html": folder / "history.html"}
    paths["md"].write_text(to_markdown(parts, folder), encoding="utf-8")
    paths["html"].write_text(to_html(parts, title), encoding="utf-8")
    return paths

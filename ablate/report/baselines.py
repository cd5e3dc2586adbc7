"""The task's trivial baselines in the report (popularity, repeat-last, majority class, a linear
model, as the task has them: :meth:`ablate.tasks.Task.baselines`): rows beside the variants, marked
†, with no verdict; warnings where a variant does not beat one, or where the practical margin is
wider than the gap between the baseline variant and one; and the task's protocol in Methods.

``reference`` is what the study's run keeps (``meta["reference"]``, :mod:`ablate.drive.reference`):
``{"protocol": text, "baselines": [{"name", "about", "values": {metric: value}}]}``."""

from __future__ import annotations

from dataclasses import dataclass

from ablate.margins import WIDE_SHARE, wide_margin
from ablate.report.cells import isnan, number
from ablate.report.document import Element
from ablate.stats import ComparisonRow, ReportSettings

MARK = "†"  # a trivial baseline's row


@dataclass(frozen=True)
class Trivial:
    """One trivial baseline: its name, how it predicts, its test value per metric."""

    name: str
    about: str
    values: dict[str, float]

    @property
    def label(self) -> str:
        return f"{self.name} {MARK}"

    def value(self, metric: str) -> float:
        found = self.values.get(metric)
        return float("nan") if found is None else float(found)


def trivial_baselines(meta: dict | None) -> list[Trivial]:
    reference = (meta or {}).get("reference") or {}
    return [
        Trivial(b["name"], b.get("about", ""), dict(b.get("values", {})))
        for b in reference.get("baselines", [])
    ]


def _beats(mean: float, value: float, higher: bool) -> bool:
    return mean > value if higher else mean < value


def baseline_warnings(
    tables: dict[str, list[ComparisonRow]], settings: ReportSettings, baselines: list[Trivial]
) -> list[str]:
    """Per metric and trivial baseline, the variants whose mean does not beat it; per metric, a
    margin wider than the gap between the baseline variant and a trivial baseline it beats."""
    lines = []
    for metric, cmp in tables.items():
        higher = settings.higher(metric)
        for b in baselines:
            value = b.value(metric)
            if isnan(value):
                continue
            losing = [r for r in cmp if r.n_seeds and not isnan(r.mean) and not _beats(r.mean, value, higher)]
            if losing:
                who = ", ".join(f"{r.variant} ({number(r.mean)})" for r in losing)
                verb = "does" if len(losing) == 1 else "do"
                lines.append(f"{who} {verb} not beat {b.name} on {metric} ({number(value)})")
        lines += _margin_lines(cmp, settings, metric, baselines)
    return lines


def _margin_lines(
    cmp: list[ComparisonRow], settings: ReportSettings, metric: str, baselines: list[Trivial]
) -> list[str]:
    base = next((r for r in cmp if r.variant == settings.baseline and r.n_seeds), None)
    if base is None or isnan(base.mean):
        return []
    margin = settings.margin_for(base.mean, metric)
    higher = settings.higher(metric)
    if all(isnan(b.value(metric)) for b in baselines):  # no row shows how far base is from trivial
        wide = wide_margin(metric, margin, base.mean)
        if wide is None:
            return []
        distance, what = wide
        return [
            f"the ±{number(margin)} margin on {metric} is {margin / distance:.0%} of {settings.baseline}'s "
            f"{what.removeprefix('its ')}, {number(distance)} (over {WIDE_SHARE:.0%}), and no trivial "
            f"baseline's row shows what doing nothing scores: 'equivalent' may hide a real difference; "
            f"set report.margin (--margin) to a share of that distance"
        ]
    gaps = [
        (abs(base.mean - b.value(metric)), b)
        for b in baselines
        if not isnan(b.value(metric)) and _beats(base.mean, b.value(metric), higher)
    ]
    if not gaps:
        return []
    gap, b = min(gaps, key=lambda found: found[0])
    if margin < gap:
        return []
    return [
        f"the ±{number(margin)} margin on {metric} is wider than the gap between {settings.baseline} and "
        f"{b.name} ({number(gap)}): a variant 'equivalent' to {settings.baseline} may be no better than "
        f"{b.name}; set report.margin below the gap"
    ]


def baseline_legend(baselines: list[Trivial]) -> str:
    if not baselines:
        return ""
    names = ", ".join(b.name for b in baselines)
    return (
        f" {MARK}: a trivial baseline ({names}; Methods, Data), computed once on the same test units, "
        "without a seed or a verdict."
    )


def reference_elements(meta: dict | None) -> list[Element]:
    """Methods: the task's protocol and its trivial baselines, as recorded."""
    reference = (meta or {}).get("reference") or {}
    elements = []
    if reference.get("protocol"):
        elements.append(Element("p", f"Protocol. {reference['protocol']}"))
    baselines = trivial_baselines(meta)
    if baselines:
        said = "; ".join(f"{b.name}: {b.about}" for b in baselines)
        elements.append(
            Element(
                "p",
                f"Trivial baselines ({MARK} in the tables), fitted (where they fit anything) on nothing "
                "after the test point (the training split unless the baseline's words say more) and "
                "evaluated on the same test units under the same protocol as the "
                f"variants, deterministic (no seed): "
                f"{said}.",
            )
        )
    return elements

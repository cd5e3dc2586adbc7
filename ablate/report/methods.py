"""The report's Methods section, after the results: the data, how a verdict is reached (intervals,
margins, MDD), how convergence was judged, how costs were measured, the verdicts' calibration, and
the software and resolved configuration that produced the study.

``meta`` is what the tracking store recorded beside the trials (``Results.meta``): keys
``ablate_version``, ``git_commit`` (None: not in a repository), ``git_dirty``, ``data_summary``
(label → value), ``resolved_study`` (YAML text), ``cost_note``, ``conditions`` ((label, value) of the
machine's conditions, :func:`ablate.tracking.provenance.described`), ``trained_conditions`` and
``copied_conditions`` (the trained and the copied trials' conditions by group where they differ:
[count, [[label, value], ...]]), ``reused`` ((variant, seed, source) of trials copied from another
study's store or trial files). Each part renders only when its key is present."""

from __future__ import annotations

import numpy as np

from ablate import stats
from ablate.report.baselines import reference_elements
from ablate.report.cells import isnan
from ablate.report.convergence import NotConverged, method_text
from ablate.report.document import Element
from ablate.report.verdicts import calibration_text, settings_text
from ablate.stats import ComparisonRow, ReportSettings

# How costs were measured, when the store recorded no note of its own.
DEFAULT_COST_NOTE = (
    "Costs are what each trial logged, averaged over its seeds: wall s is the trial's elapsed time "
    "(training and evaluation), which grows when other work shares the machine, as does tokens/s "
    "(training tokens over training wall time); CPU s, where logged, is the CPU time of the trial's "
    "process, which does not count time spent waiting for a core and so compares variants trained on "
    "a shared machine more fairly; params counts the backbone's parameters."
)


def calibration(primary: list[ComparisonRow], settings: ReportSettings) -> dict | None:
    """``stats.calibrate`` for a study of this one's shape on the primary metric: its seeds, the
    variants in its family, the baseline's mean and the paired differences' pooled sd."""
    rest = [r for r in primary if r.variant != settings.baseline and r.variant not in settings.duplicates]
    spread = [r.sd_diff for r in rest if not isnan(r.sd_diff)]
    sd = float(np.sqrt(np.mean(np.square(spread)))) if spread else float("nan")
    seeds = max(r.n_paired for r in primary)
    return stats.calibrate(settings, seeds, len(rest), mean=primary[0].mean, sd=sd)


def _value(x) -> str:
    if isinstance(x, bool) or x is None:
        return str(x)
    if isinstance(x, int | np.integer):
        return f"{int(x):,}"
    if isinstance(x, float | np.floating):
        return "n/a" if isnan(float(x)) else (f"{x:,.0f}" if float(x).is_integer() else f"{x:,.4g}")
    return str(x)


def data_elements(meta: dict) -> list[Element]:
    summary = meta.get("data_summary")
    if not summary:
        return []
    rows = [[str(label), _value(value)] for label, value in summary.items()]
    return [Element("h3", "Data"), Element("table", headers=["data", "value"], items=rows, left=1)]


def cost_note(meta: dict) -> str:
    """The recorded note as a sentence (a recorded fragment gets its capital and full stop)."""
    note = (meta.get("cost_note") or "").strip()
    if not note:
        return DEFAULT_COST_NOTE
    note = note[0].upper() + note[1:]
    return note if note.endswith((".", "!", "?")) else note + "."


def software_elements(meta: dict) -> list[Element]:
    """The ablate version, the study repository's commit, the resolved study as YAML."""
    said = []
    if meta.get("ablate_version"):
        said.append(f"ablate {meta['ablate_version']}")
    if "git_commit" in meta:
        commit = meta["git_commit"]
        dirty = " (with uncommitted changes)" if meta.get("git_dirty") else ""
        said.append(
            f"the study's repository at commit {commit}{dirty}"
            if commit
            else "no commit recorded (the study file is not in a git repository)"
        )
    elements = [Element("p", "Built with " + "; ".join(said) + ".")] if said else []
    if meta.get("trained_conditions"):
        elements += trained_conditions_elements(meta["trained_conditions"], len(meta.get("reused", [])))
    elif meta.get("conditions"):
        elements += [
            Element("p", conditions_text(len(meta.get("reused", [])), meta.get("trained_here"))),
            Element("list", items=conditions_items(meta["conditions"])),
        ]
    if meta.get("copied_conditions"):
        elements += [
            Element("p", "The copied trials' conditions, as their sources recorded them:"),
            Element("list", items=[conditions_group_item(n, c) for n, c in meta["copied_conditions"]]),
        ]
    if meta.get("reused"):
        elements.append(Element("p", reuse_text(meta["reused"])))
    if meta.get("older_kinds"):
        elements.append(Element("p", older_kinds_text(meta["older_kinds"])))
    if meta.get("resolved_study"):
        elements += [
            Element("p", STUDY_AS_REPORTED if meta.get("study_as_reported") else STUDY_AS_RUN),
            Element("code", meta["resolved_study"], title="Resolved study (YAML)", language="yaml"),
        ]
    return [Element("h3", "Software and configuration"), *elements] if elements else []


STUDY_AS_RUN = "The study as it ran: the study file as validated, with any command-line overrides applied."
STUDY_AS_REPORTED = (
    "The study as reported: the study file given to `ablate report`, with its overrides applied. It is not "
    "the study the run stored (a variant left out or added, or a setting spelt differently since); the "
    "tables hold the store's trials of these variants."
)

# What the recorded conditions fix, and what another machine's change (said once for every case below).
SAME_CONDITIONS = "the same torch build, thread count, CPU instruction set and fast paths"
ROUNDING_TEXT = (
    "Another thread count, CPU, BLAS or torch version changes the float rounding, and rounding moves "
    "ranking metrics where two items' scores nearly tie."
)
CONDITIONS_TEXT = (
    "The numbers reproduce bit for bit with this code and study file under the conditions below, as "
    f"the trials recorded them (MLflow tags ablate.env.*): {SAME_CONDITIONS}. {ROUNDING_TEXT}"
)


def conditions_text(copied: int, trained_here: int | None) -> str:
    """:data:`CONDITIONS_TEXT`, said of the trials it is true of: the trained trials' conditions
    (their runs' tags), so trials copied in (``--reuse``) ran under their source's, not these."""
    if not copied:
        return CONDITIONS_TEXT
    if not trained_here:
        return (
            "No trial was trained in this study: each was copied in (below), so the conditions its "
            "numbers reproduce under are their sources', not recorded here. The conditions of the run "
            "that copied them and wrote this report (MLflow tags ablate.env.*):"
        )
    return (
        f"The {trained_here} trial(s) trained in this study reproduce bit for bit with this code and study "
        "file under the conditions below, as their runs recorded them (MLflow tags ablate.env.*): "
        f"{SAME_CONDITIONS}; the {copied} copied in (below) under their sources'. {ROUNDING_TEXT}"
    )


def trained_conditions_elements(groups: list, copied: int) -> list[Element]:
    """The trained trials' conditions where they differ between trials (a study resumed on another
    machine, workers on several hosts): what all share, then each group's own, with its count."""
    sets = [dict(map(tuple, items)) for _, items in groups]
    labels = list(dict.fromkeys(label for conditions in sets for label in conditions))
    shared = [label for label in labels if len({c.get(label) for c in sets}) == 1]
    differing = [label for label in labels if label not in shared]
    trained = sum(n for n, _ in groups)
    copies = f"; the {copied} copied in (below) under their sources'" if copied else ""
    text = (
        f"The {trained} trial(s) trained in this study ran under {len(groups)} different sets of conditions "
        "(a study resumed on another machine, or workers on several hosts), as their runs recorded them "
        "(MLflow tags ablate.env.*): each reproduces bit for bit with this code and study file under its "
        f"own — {SAME_CONDITIONS}{copies}. {ROUNDING_TEXT} Times (wall, CPU, tokens per second) compare "
        "only between trials of one set."
    )
    differs = [
        conditions_group_item(n, [(label, c.get(label, "not recorded")) for label in differing])
        for (n, _), c in zip(groups, sets, strict=True)
    ]
    elements = [Element("p", text)]
    if shared:
        elements += [
            Element("p", "Shared by all of them:"),
            Element("list", items=conditions_items([(label, sets[0][label]) for label in shared])),
        ]
    return [*elements, Element("p", "Where they differ:"), Element("list", items=differs)]


def conditions_group_item(count: int, conditions: list) -> str:
    """A group of trials' conditions, ``3 trial(s): torch: 2.13.0; CPU: …`` ((label, value) pairs); a
    copied trial's source that recorded none (a trial file written before trial files carried
    them) says so."""
    said = "; ".join(f"{label}: {value}" for label, value in conditions)
    return f"{count} trial(s): {said or 'not recorded by their source'}"


def conditions_items(conditions: list[tuple[str, str]]) -> list[str]:
    """One item per recorded condition: ``threads (intra-op / inter-op): 2 / 2``."""
    return [f"{label}: {value}" for label, value in conditions]


def reuse_text(reused: list[tuple[str, int, str]]) -> str:
    """Which trials were copied from other studies' stores or trial files (``--reuse``), by source."""
    by_store: dict[str, list[str]] = {}
    for variant, seed, source in reused:
        by_store.setdefault(source.rsplit(", run ", 1)[0], []).append(f"{variant} seed {seed}")
    where = "; ".join(f"{', '.join(trials)} from {store}" for store, trials in by_store.items())
    return (
        f"{len(reused)} trial(s) were copied, not trained in this study (ablate run --reuse): each was "
        f"trained elsewhere with the same model, training, task, metrics and seed: {where}."
    )


def seeds_by_label(trials: list[tuple[str, int, str]]) -> dict[str, str]:
    """(variant, seed, label) triples as label → 'base seeds 0, 1, mlp seeds 2', in first-seen order."""
    grouped: dict[str, dict[str, list[int]]] = {}
    for variant, seed, label in trials:
        grouped.setdefault(label, {}).setdefault(variant, []).append(int(seed))

    def listed(variants: dict[str, list[int]]) -> str:
        return ", ".join(f"{name} seeds {', '.join(map(str, sorted(s)))}" for name, s in variants.items())

    return {label: listed(variants) for label, variants in grouped.items()}


def older_kinds_text(older: list[tuple[str, int, str]]) -> str:
    """Which copied trials were trained under earlier versions of their kinds (``--reuse-older-kinds``)."""
    said = "; ".join(f"{trials} under {versions}" for versions, trials in seeds_by_label(older).items())
    return (
        f"{len(older)} of them were trained under earlier versions of their kinds, which changed what "
        f"those kinds train (ablate run --reuse-older-kinds; --reuse alone trains them again): {said}. "
        "Their numbers are as those versions trained them; the run that wrote this report trained nothing."
    )


def methods_elements(
    settings: ReportSettings,
    tables: dict[str, list[ComparisonRow]],
    flags: list[NotConverged],
    has_curves: bool,
    tested_pairs: int,
    meta: dict | None,
    calibrated: dict | None,
) -> list[Element]:
    """The Methods section, everything present in ``meta`` included; ``calibrated``: the verdicts'
    simulated error rates (:func:`calibration`)."""
    meta = meta or {}
    elements = [Element("h2", "Methods"), *data_elements(meta), *reference_elements(meta)]
    elements.append(Element("h3", "Verdicts, intervals, margins"))
    elements += [Element("p", t) for t in settings_text(settings, tables)]
    if settings.notes:
        elements.append(Element("list", items=list(settings.notes)))
    elements += [
        Element("h3", "Convergence"),
        Element("p", method_text(flags, settings, has_curves)),
        Element("h3", "Costs"),
        Element("p", cost_note(meta)),
        Element("h3", "Calibration"),
        Element(
            "list",
            items=calibration_text(calibrated, settings, tables, tested_pairs),
        ),
    ]
    return elements + software_elements(meta)

"""``ablate validate``: a study file checked without training, as ``ablate run`` would check it
before its first trial; the variants' table, sizes and data summary printed."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated

import typer

from ablate import stopping
from ablate.commands.console import err, out, print_resolved, variants_table
from ablate.commands.options import OnlyOpt, OverridesArg, StudyArg
from ablate.study.overrides import command_line

PRINT_HELP = "Print the resolved study (overrides applied, defaults filled in) as YAML."


def validate_command(
    study_file: StudyArg,
    overrides: OverridesArg = None,
    only: OnlyOpt = None,
    resolved: Annotated[bool, typer.Option("--resolved", help=PRINT_HELP)] = False,
) -> dict | None:
    """Check a study file without training: keys, types, kinds, compatibility, every model's
    shapes and size, and the data (read as `ablate run` reads them, through the same cache).
    Returns each variant's size (None for several studies)."""
    return _validate(study_file, overrides, only, resolved)


def _validate(
    study_file: Path, overrides: list[str] | None, only: str | None, resolved: bool, warn_once: bool = True
) -> dict | None:
    """:func:`validate_command`; ``warn_once``: say what the design cannot tell (:func:`warn_design`),
    once for a study of several data sets or rungs, not once for each."""
    from ablate.errors import warn
    from ablate.study.folders import output_problem
    from ablate.study.ladder import laddered
    from ablate.study.load import load_study
    from ablate.study.several import dataset_overrides, several
    from ablate.study.sizes import machine_memory
    from ablate.training.preflight import preflight

    if len(points := command_line(study_file, overrides or (), only)) > 1:  # a sweep: each point's study
        for point in points:
            _validate(study_file, point, None, resolved)
        return None
    with stopping.stop_signals():  # reading the data may take a while: Ctrl-C / SIGTERM stop it
        study = load_study(study_file, overrides=(overrides := points[0]))
        if resolved:
            print_resolved(study)
        if several(study):  # each data set's study, in turn
            for entry in study.dataset.entries:
                _validate(study_file, dataset_overrides(study, entry), None, False, warn_once=False)
            warn_design(study)
            return None
        if laddered(study):  # each rung's study, then the ladder's sizes
            validate_ladder(study)
            warn_design(study)
            return None
        data = study.task.load()
    sizes = preflight(study, data)
    problem = output_problem(study)  # as `ablate run` would, without --output
    if problem is not None:
        raise problem
    n, design = len(study.variants), study.spec.sequential
    seeds = [len(study.spec.seed_list)] if design is None else [design.initial, design.max]
    span = lambda times: " to ".join(str(times * k) for k in seeds)  # noqa: E731
    title = f"{study.name}: {n} variants × {span(1)} seeds = {span(n)} trials"
    out.print(variants_table(study, sizes, title))
    summary = ", ".join(f"{label} {value}" for label, value in study.task.data_summary(data).items())
    out.print(f"data: {summary or 'loaded'}", markup=False, highlight=False, soft_wrap=True)
    largest = max(sizes.values(), key=lambda size: size.memory)
    if largest.memory > machine_memory():
        warn(f"the largest variant needs {largest.describe()}, more than this machine's memory")
    search = study.spec.search
    if search.enabled:
        from ablate.study.tuning import search_budget

        out.print(
            f"search: {search_budget(study)} {search.sampler} trial(s) per variant over "
            f"{', '.join(search.space)} (pruner: {search.pruner}), then the best parameters over every seed"
        )
    if study.spec.match_params:
        out.print(
            "match_params: each variant's width knob is scaled to the baseline's backbone parameter count "
            "(±2%) when the run starts"
        )
    if design is not None:
        out.print(f"seeds: {design.describe()}")
    if warn_once:
        warn_design(study)
    given = f" with {shlex.join(overrides)}" if overrides else ""
    out.print(f"{study_file}{given}: valid", markup=False, highlight=False, soft_wrap=True)
    return sizes


def validate_ladder(study) -> None:
    """Each rung's study validated (a rung that breaks the model refused, named), then one line
    per rung with the baseline's parameters, training GFLOP a trial and memory, and the ladder's
    span on its scale; rungs of one size on that scale are refused at ``ladder.scale``."""
    from ablate.schema import Locator
    from ablate.stats.settings import LADDER_SCALES
    from ablate.study.file import read_study
    from ablate.study.ladder import per_rung, rung_overrides
    from ablate.study.sizes import amount, in_bytes
    from ablate.training.preflight import trial_gflop

    subs = per_rung(study, check_files=False)  # every rung's shapes first: one refused names its rung
    baseline, ladder = study.spec.report.baseline, study.spec.ladder
    sizes, gflop = {}, {}
    for rung, sub in subs.items():
        sized = _validate(study.path, rung_overrides(study, rung), None, False, warn_once=False)
        sizes[rung] = sized[baseline]
        gflop[rung] = trial_gflop(sub, baseline, sub.task.load())
    # each rung's figures by the column a trial records them in, one of them its place on the scale
    recorded = {"params": {r: size.parameters for r, size in sizes.items()}, "train_gflop": gflop}
    on_scale = recorded[LADDER_SCALES[ladder.scale].column]
    for rung in sorted(subs, key=on_scale.get):
        groups = subs[rung].spec.train.param_groups if ladder.lr_base_dim else []
        scaled = f"; attention and FFN matrices at lr {groups[0].lr:.3g} (μP-style)" if groups else ""
        size = sizes[rung]
        line = f"{size.parameters:,} parameters, ≈ {in_bytes(size.memory)} to train, "
        shown = amount(gflop[rung]) if gflop[rung] >= 100 else f"{gflop[rung]:.3g}"  # small rungs: 3 digits
        line += f"{shown} training GFLOP a trial"
        out.print(f"ladder rung {rung} ({baseline}): {line}{scaled}", markup=False, highlight=False)
    alike = [r for r in on_scale if sum(abs(v / on_scale[r] - 1) < 1e-3 for v in on_scale.values()) > 1]
    if alike:
        _, lines = read_study(study.path)
        other = " or ".join(name for name in LADDER_SCALES if name != ladder.scale)
        raise Locator(study.path, lines).error(
            ("ladder", "scale"),
            f"rungs {', '.join(alike)} have the same {ladder.scale} ({amount(on_scale[alike[0]])}), so the "
            f"trend has nothing to read; set ladder.scale: {other}, or make the rungs differ",
            fallback=("ladder",),
        )
    span = max(on_scale.values()) / max(min(on_scale.values()), 1e-12)
    note = "" if len(subs) >= 3 else "; the trend needs ≥ 3 rungs"
    out.print(f"ladder: {len(subs)} rungs spanning {span:.1f}× in {ladder.scale}{note}", markup=False)


def warn_design(study, seeds: bool = True) -> None:
    """What the study's design cannot tell: variants configured alike, and (``seeds``: `validate`'s
    warning; a run's first lines stay the plan or the one error line) seeds too few for a verdict."""
    from ablate.stats.sequential import MIN_SEEDS_VERDICT  # the schema's own: no scipy loaded
    from ablate.study.load import duplicate_warnings

    lines = duplicate_warnings(study)
    given = len(study.spec.seed_list)
    if seeds and study.spec.sequential is None and given < MIN_SEEDS_VERDICT:
        lines.append(
            f"warning: {given} seed(s) give no verdict: a verdict needs at least {MIN_SEEDS_VERDICT} "
            f"paired seeds; the report will show the numbers only (`ablate plan` says how many it needs)"
        )
    for line in lines:
        err.print(line, markup=False, highlight=False, soft_wrap=True)

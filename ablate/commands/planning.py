"""``ablate plan``: before a study runs, the seeds per variant and trials its design needs for
80 % power to call a difference of the effect worth detecting, and for an 80 % chance to call no
difference equivalent — each figure with the assumptions it rests on (:mod:`.stats.power`).

The noise is the sd of one seed's paired difference (variant − baseline), given (``--sd``) or
estimated from an earlier study's finished trials (``--pilot``): a report's results.csv, or an
output folder's tracking store. A pilot's sd is an estimate on few degrees of freedom: its plan
averages the power over the sd's sampling distribution (expected power) and says how sure it is
(:mod:`.stats.planned`). The chance to call no difference equivalent comes from studies simulated
through the report's own decisions. A pilot's wall times give the expected compute.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ablate.commands.compare import ItemsOpt, MarginOpt, PartialOpt
from ablate.commands.options import OverridesArg, StudyArg
from ablate.errors import AblateError

if TYPE_CHECKING:  # pragma: no cover
    from ablate.commands.pilots import Pilot
    from ablate.stats import ReportSettings
    from ablate.stats.planned import Noise

# An amount is in the metric's units, or "N%" of the baseline's mean.
EffectOpt = Annotated[
    str | None,
    typer.Option(
        help="The smallest true Δ worth detecting: in the metric's units (0.005) or of the baseline's "
        "mean ('1%').",
        show_default="the study's practical margin",
    ),
]
SdOpt = Annotated[
    str | None,
    typer.Option(
        "--sd",
        help="The sd of one seed's paired difference (variant − baseline): in the metric's units or "
        "of the baseline's mean ('3%').",
        show_default=False,
    ),
]
PilotOpt = Annotated[
    Path | None,
    typer.Option(
        metavar="PATH",
        help="An earlier study's finished trials, for the noise (and the baseline's mean, the wall "
        "time): a report's results.csv (or its folder), or an output folder with a tracking store.",
        show_default=False,
    ),
]
SimulationsOpt = Annotated[
    int, typer.Option(min=50, max=100_000, help="Simulated studies per scenario (sequential seeds).")
]
PlanMetricOpt = Annotated[
    str | None, typer.Option("--metric", "-m", help="With --items: the logs' score.", show_default=False)
]
PlanBaselineOpt = Annotated[
    str | None, typer.Option(help="With --items: the baseline model's name.", show_default=False)
]


def plan_command(
    study_file: StudyArg,
    overrides: OverridesArg = None,
    effect: EffectOpt = None,
    sd: SdOpt = None,
    pilot: PilotOpt = None,
    simulations: SimulationsOpt = 400,
    items: ItemsOpt = False,
    metric: PlanMetricOpt = None,
    baseline: PlanBaselineOpt = None,
    margin: MarginOpt = None,
    partial: PartialOpt = False,
) -> None:
    """Before the run: the seeds and trials its design needs for 80% power, and for 'equivalent' at
    Δ = 0. With --items, the arguments are evaluation logs (as `ablate compare --items` reads them),
    the pilot of a per-item design: the items (or seeds) each comparison needs."""
    if not items:
        show_plan(study_file, overrides or [], effect, sd, pilot, simulations)
        return
    from ablate.commands.console import out
    from ablate.report.items import plan_items

    given = [name for name, value in {"--effect": effect, "--sd": sd, "--pilot": pilot}.items() if value]
    if given or metric is None or baseline is None:
        wrong = f"{', '.join(given)}: not with --items" if given else "--items needs --metric and --baseline"
        usage = "ablate plan --items LOG... -m METRIC --baseline NAME"
        raise AblateError(f"{wrong} (the logs are the pilot: {usage})")
    for line in plan_items([str(study_file), *(overrides or [])], metric, baseline, None, margin, partial):
        out.print(line, markup=False)


@dataclass(frozen=True)
class Amount:
    """A number as given: in the metric's units, or (``relative``) a share of the baseline's mean."""

    value: float
    relative: bool

    @classmethod
    def parse(cls, text: str, option: str) -> Amount:
        number = text.strip().removesuffix("%")
        try:
            value = float(number)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value <= 0:
            raise AblateError(f"{option} {text}: expected a number > 0 (0.005) or a share of the mean ('2%')")
        relative = text.strip().endswith("%")
        return cls(value / 100.0 if relative else value, relative)

    def units(self, mean: float | None) -> float | None:
        """In the metric's units (None: relative, and no mean known)."""
        if not self.relative:
            return self.value
        return None if mean is None else self.value * abs(mean)


@dataclass(frozen=True)
class Row:
    design: str
    question: str
    seeds: str
    trials: str
    trial_count: float | None  # for the compute column
    short: str = ""  # the question without this study's numbers (the total over data sets)


def _fixed_rows(
    s: ReportSettings, m: int, variants: int, a: Assumptions, seeds: int | None, simulations: int
) -> tuple[list[Row], list[str]]:
    """The fixed design's rows — seeds for 80% (expected) power, for an 80% chance of equivalence
    (simulated through the report's decisions), and (``seeds``) the chances at the study's own
    seeds — and the lines saying how sure they are."""
    from ablate.stats.planned import (
        equivalence_chance,
        expected_power,
        how_sure,
        seeds_for_equivalence_simulated,
        seeds_for_power,
    )

    level, noise = s.alpha / m, a.noise
    rows = []
    n = seeds_for_power(a.effect, noise, level)
    say = lambda k: ("> 10,000", "—", None) if k is None else (str(k), str(k * variants), k * variants)  # noqa: E731
    question = "better / worse at Δ = effect: 80% power"
    rows.append(Row("fixed seeds", question, *say(n), short=question))
    found, chance = seeds_for_equivalence_simulated(s, m, noise, a.mean, a.margin, simulations)
    question = "equivalent at Δ = 0: 80% chance"
    rows.append(Row("fixed seeds", question, *say(found), short=question))
    pm = 1.96 * math.sqrt(0.2 * 0.8 / (simulations * m))
    lines = [
        f"equivalence: the share of comparisons the report calls equivalent in {simulations} studies "
        f"simulated through its own decisions, every Δ = 0 (±{pm:.0%})"
        + (f": {chance:.0%} at {found} seeds" if found else "")
    ]
    if noise.df is not None and n is not None:
        low, high = noise.interval(0.8)
        sure, under = how_sure(n, a.effect, noise, level)
        lines.append(
            f"how sure: the pilot's sd(d) rests on {noise.df:.3g} df — from {low:.4g} to {high:.4g} "
            f"(80% interval); the seeds average the power over it (expected power, σ² = df·sd²/χ²_df); "
            f"at {n} seeds the power at Δ = effect is ≥ 80% with chance {sure:.0%} and under 50% with "
            f"chance {under:.0%}"
        )
    if seeds is not None and seeds >= 2:
        power = expected_power(seeds, a.effect, noise, level)
        equivalent = equivalence_chance(s, m, noise, a.mean, seeds, simulations) if seeds >= 3 else 0.0
        rows.append(
            Row(
                f"the study's {seeds} seeds",
                f"power {power:.0%} at Δ = effect; equivalent at Δ = 0: {equivalent:.0%}",
                str(seeds),
                str(seeds * variants),
                seeds * variants,
                "power at Δ = effect; equivalent at Δ = 0",
            )
        )
    return rows, lines


def _sequential_rows(
    s: ReportSettings, m: int, trained: int, a: Assumptions, simulations: int
) -> tuple[list[Row], list[str]]:
    """The sequential design's rows (every Δ = 0; one Δ = effect, the rest 0) and a note where
    its power falls short of 80%. A pilot's uncertain sd: each simulated study draws its own."""
    import numpy as np

    from ablate.stats.power import simulate_sequential
    from ablate.stats.verdicts import Verdict

    design, sign, effect, mean = s.sequential, 1.0 if s.higher(s.primary) else -1.0, a.effect, a.mean
    sd = a.noise.draw(simulations, np.random.default_rng(2))
    label = f"sequential {design.initial}–{design.max}"
    extra = trained - (m + 1)  # variants trained but not tested (duplicates): as the baseline
    null = simulate_sequential(s, [0.0] * m, sd, mean, simulations, seed=0)
    effect_run = simulate_sequential(s, [sign * effect] + [0.0] * (m - 1), sd, mean, simulations, seed=1)
    better = Verdict.BETTER if sign > 0 else Verdict.WORSE
    rows = []
    for run, question, short in (
        (
            null,
            f"every Δ = 0: equivalent {null.share(Verdict.EQUIVALENT):.0%}; any false better / worse "
            f"{null.any_share(Verdict.BETTER, Verdict.WORSE):.1%}",
            "every Δ = 0",
        ),
        (
            effect_run,
            f"one Δ = effect: {better} {effect_run.share(better, column=0):.0%} (power)",
            "one Δ = effect",
        ),
    ):
        trials = float(run.trials.mean() + extra * run.seeds.max(axis=1).mean())
        rows.append(
            Row(
                label, question, f"{run.seeds[:, 0].mean():.1f} (mean)", f"{trials:.1f} (mean)", trials, short
            )
        )
    power = effect_run.share(better, column=0)
    short = f"its maximum of {design.max} seeds gives {power:.0%} power at Δ = effect: raise seeds.max"
    return rows, [short] if power < 0.8 else []


@dataclass(frozen=True)
class Assumptions:
    """The effect, margin and noise in the metric's units (or, with no mean known and all three
    given as shares, in shares of a mean of 1), the mean the simulations use, and each one's
    source in words."""

    effect: float
    margin: float
    noise: Noise
    mean: float
    lines: list[str]


def assumptions(s: ReportSettings, effect: str | None, sd: str | None, found: Pilot | None) -> Assumptions:
    from ablate.stats.settings import OF_ERROR

    margin = s.margin_of()  # the primary metric's: the study file's, else its task's default
    if isinstance(margin, str) and margin.endswith(OF_ERROR):  # a share of 1 − mean: needs the mean
        if found is None:
            raise AblateError(
                f"report.margin {margin} (the primary metric's) is a share of the baseline's error, which "
                "needs its mean: give a --pilot, or an absolute report.margin in the study file"
            )
        margin = s.margin_for(found.mean)
    margin_given = Amount.parse(str(margin), "report.margin")
    wanted = margin_given if effect is None else Amount.parse(effect, "--effect")
    noise = Amount(found.sd, False) if found is not None else Amount.parse(sd, "--sd")
    absolute = sum(not a.relative for a in (margin_given, wanted, noise))
    if found is None and 0 < absolute < 3:
        raise AblateError(
            "a relative margin, effect or sd needs the baseline's mean: give the margin (report.margin), "
            "--effect and --sd all in the metric's units or all as shares ('2%'), or a --pilot"
        )
    # no mean known and all three relative: the plan is the same in shares of a mean of 1
    mean = 1.0 if found is None else found.mean
    shares = found is None and absolute == 0

    def show(x: float) -> str:
        return f"{100 * x:.3g} % of the mean" if shares else f"{x:.4g}"

    effect_u, margin_u, sd_u = (a.units(mean) for a in (wanted, margin_given, noise))
    of_mean = f" of {s.baseline}'s mean" if margin_given.relative else ""
    practical = "the study's practical margin"
    lines = [
        f"effect: Δ = {show(effect_u)} ({'--effect' if effect else practical})",
        f"margin: ±{show(margin_u)} (report.margin {s.margin_of()}{of_mean})",
        f"noise: sd(d) = {show(sd_u)} ({'--sd' if found is None else f'{found.how}, in {found.source}'})",
        *([f"{s.baseline}'s mean: {mean:.4g} (the pilot)"] if found is not None else []),
    ]
    from ablate.stats.planned import Noise

    df = None if found is None or not math.isfinite(found.effective_df) else found.effective_df
    return Assumptions(effect_u, margin_u, Noise(sd_u, df), mean, lines)


@dataclass(frozen=True)
class Plan:
    """One study's plan: its title, the lines of its assumptions, its rows and the pilot's wall time."""

    title: str
    lines: list[str]
    rows: list[Row]
    wall: float | None


def show_plan(
    study_file: Path,
    overrides: list[str],
    effect: str | None,
    sd: str | None,
    pilot: Path | None,
    simulations: int,
) -> None:
    """Print the plan of ``study_file``'s design (see the module docstring); for a study over
    several data sets, each data set's (a ``--pilot`` folder of such a study gives each its own
    noise) and the totals over them."""
    from ablate.commands.pilots import pilot_of
    from ablate.study.ladder import laddered, one_rung, per_rung
    from ablate.study.load import load_study
    from ablate.study.several import per_dataset, several

    if (sd is None) == (pilot is None):
        raise AblateError(
            "give the noise, one of --sd S (the sd of a seed's paired difference) or --pilot PATH"
        )
    study = load_study(study_file, check_files=False, overrides=overrides)
    if laddered(study) and pilot is None:  # each rung's plan: the noise given holds for every size
        rungs = per_rung(study, False).items()
        return _show_rungs(
            study.name, {rung: plan_of(sub, effect, sd, None, simulations) for rung, sub in rungs}
        )
    one_rung(study, "ablate plan --pilot")  # a pilot is one rung's study
    if not several(study):
        print_plan(plan_of(study, effect, sd, pilot, simulations))
        return
    plans = {}
    for label, sub in per_dataset(study, check_files=False).items():
        plans[label] = plan_of(
            sub, effect, sd, None if pilot is None else pilot_of(pilot, label, sub.name), simulations
        )
        print_plan(plans[label])
    _show_total(study.name, plans)


def plan_of(study, effect: str | None, sd: str | None, pilot: Path | None, simulations: int) -> Plan:
    """The plan of one study's design."""
    s = study.report_settings()
    m = len([v for v in s.variants if v != s.baseline and v not in s.duplicates])
    if not m:
        raise AblateError(
            f"{study.path}: no variant is compared with the baseline {s.baseline!r}: nothing to plan"
        )
    from ablate.commands.pilots import read_pilot

    found = None if pilot is None else read_pilot(pilot, study.name, s.baseline, s.primary)
    a = assumptions(s, effect, sd, found)
    eq = (
        "α per comparison"
        if s.equivalence == "per-comparison"
        else f"{s.correction_method.label}'s level over the family's TOST p's (α/m = {s.alpha / m:.3g} first)"
    )
    lines = [
        *a.lines,
        f"tests: {m} comparison(s) with {s.baseline} on {s.primary}; better / worse by the paired t-test at "
        f"α/m = {s.alpha / m:.3g} ({s.correction_method.label}'s first step: a lower bound on its power), "
        f"equivalent by TOST against ±margin, each side at {eq}",
    ]
    design, variants = s.sequential, len(s.variants)
    seeds = None if design is not None else len(study.spec.seed_list)
    rows, sure = _fixed_rows(s, m, variants, a, seeds, simulations)
    lines += sure
    if design is not None:
        simulated, notes = _sequential_rows(s, m, variants, a, simulations)
        rows += simulated
        lines.append(
            f"sequential: {design.describe()}; {simulations} simulated studies per scenario (±"
            f"{1.96 * math.sqrt(0.25 / simulations):.0%} on a share), seeds and trials their means"
        )
        lines += notes
    wall = None if found is None else found.wall_s
    if wall is not None:
        lines.append(f"compute: trials × the pilot's mean wall time, {wall:.3g} s a trial, one worker")
    return Plan(f"{study.name}: plan for {s.primary}", lines, rows, wall)


def print_plan(plan: Plan) -> None:
    from rich.table import Table

    from ablate.commands.console import duration, out

    wall = plan.wall
    table = Table(title=plan.title, title_justify="left")
    for column in ("design", "question", "seeds per variant", "trials", *(["compute"] if wall else [])):
        table.add_column(column, justify="left" if column in ("design", "question") else "right")
    for r in plan.rows:
        cost = [duration(r.trial_count * wall) if r.trial_count is not None else "—"] if wall else []
        table.add_row(r.design, r.question, r.seeds, r.trials, *cost)
    for line in plan.lines:
        out.print(line, markup=False, highlight=False, soft_wrap=True)
    out.print(table)


def _show_rungs(name: str, plans: dict[str, Plan]) -> None:
    """`ablate plan` of a ladder: each rung's plan, what every rung shares said once — the lines
    of the assumptions, and one table for rungs whose plans are alike (the same --sd and --effect
    give every size the same plan) — then what the trend over the rungs can be tested on."""
    from ablate.commands.console import out

    alike: dict[tuple, list[str]] = {}
    for rung, plan in plans.items():
        alike.setdefault((tuple(plan.lines), tuple(plan.rows), plan.wall), []).append(rung)
    shared = [
        line for line in next(iter(plans.values())).lines if all(line in p.lines for p in plans.values())
    ]
    for line in shared:
        out.print(line, markup=False, highlight=False, soft_wrap=True)
    for (lines, rows, wall), rungs in alike.items():
        question = plans[rungs[0]].title.split(": ", 1)[1]
        which = f"rung {rungs[0]}" if len(rungs) == 1 else f"rungs {', '.join(rungs)} (each alike)"
        own = [line for line in lines if line not in shared]
        print_plan(Plan(f"{name}, {which}: {question}", own, list(rows), wall))
    k = len(plans)
    trend = f"its slope on {k - 2} df" if k >= 3 else "none: a trend needs ≥ 3 rungs"
    out.print(f"ladder: {k} rungs, each planned alone; the trend over them: {trend}", markup=False)


def _show_total(name: str, plans: dict[str, Plan]) -> None:
    """The trials (and compute, where every data set's pilot gave a wall time) summed over the data
    sets, per row of the design; and what the across-data-set verdict can say with this many."""
    from rich.table import Table

    from ablate.commands.console import duration, out

    walls = [p.wall for p in plans.values()]
    timed = all(w is not None for w in walls)
    table = Table(title=f"{name}: total over {len(plans)} data sets", title_justify="left")
    columns = ("design", "question", *(f"trials: {label}" for label in plans), "trials", "compute")
    for column in columns[: len(columns) - (not timed)]:
        table.add_column(column, justify="left" if column in ("design", "question") else "right")
    for rows in zip(*(p.rows for p in plans.values()), strict=True):
        counts = [r.trial_count for r in rows]
        known = all(c is not None for c in counts)
        total = f"{sum(counts):,.{0 if all(float(c).is_integer() for c in counts) else 1}f}" if known else "—"
        cost = duration(sum(c * w for c, w in zip(counts, walls, strict=True))) if known and timed else "—"
        table.add_row(
            rows[0].design, rows[0].short, *(r.trials for r in rows), total, *([cost] if timed else [])
        )
    out.print(table)
    k = len(plans)
    verdicts = "generalises / varies / unknown" if k >= 3 else "only varies or unknown"
    out.print(
        f"across data sets: the verdict pools the {k} data sets' relative effects (their mean, t interval "
        f"with {k - 1} df; random-effects prediction interval with {k - 2} df; Q's bootstrap test for "
        f"'varies'): with {k} it can say {verdicts}"
        + ("; list at least 3 data sets for 'generalises'" if k < 3 else ""),
        markup=False,
        highlight=False,
        soft_wrap=True,
    )

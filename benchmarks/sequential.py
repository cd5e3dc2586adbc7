"""Sequential seeds against a fixed design of equal power, at realistic noise: expected trials under
the null and under an effect, through the project's own functions.

    nice python benchmarks/sequential.py [--studies 800] [--no-write]

The regime of issue 35: the sd of one seed's paired difference is 3 % of the baseline's mean, the
practical margin 2 % (the default), α = .05, Holm. For m = 1 and m = 3 comparisons and sequential
designs ``seeds: {initial: 3, step: 2, max: 11 | 21 | 31}`` (Pocock- and O'Brien–Fleming-type
spending), ``--studies`` studies per scenario are simulated through the design's own decisions
(:func:`ablate.stats.power.simulate_sequential`, i.e. ``decide_sequential`` on full tables, what the
driver reaches look by look):

* **null**: every variant at Δ = 0 — the mean trials (every variant's seeds and the baseline's),
  the share of comparisons called equivalent, the studies with any false better / worse;
* **effect**: one variant at Δ = 2 % (the margin, 0.67 sd) or 3 % (1 sd), the others at 0 — its
  power (called better) and the mean trials.

The fixed design of equal power is the fewest seeds n per variant whose paired t-test at α/m
(:func:`ablate.stats.power.seeds_for_difference`; Holm's first step, a lower bound on its power,
so n is if anything too large for the fixed design) has at least the sequential design's
simulated power (at most 99 %); it costs n·(m + 1) trials whatever the truth. Prints the section
and writes it to benchmarks/RESULTS.md ("Sequential seeds against a fixed design of equal power").
"""

from __future__ import annotations

import argparse
import math
import time
from datetime import date

from results_file import publish  # benchmarks/ is on sys.path when run as a script

from ablate.stats.power import seeds_for_difference, simulate_sequential
from ablate.stats.sequential import SequentialSeeds
from ablate.stats.settings import ReportSettings
from ablate.stats.verdicts import POWER, Verdict

SECTION = "## Sequential seeds against a fixed design of equal power"
SD = 0.03  # sd of a seed's paired difference, as a share of the baseline's mean (the regime)
MEAN = 1.0  # the baseline's mean: every amount below is a share of it
EFFECTS = (0.02, 0.03)  # the margin (0.67 sd), and 1 sd
FAMILIES = (1, 3)
MAXIMA = (11, 21, 31)
SPENDINGS = ("pocock", "obrien_fleming")
TOP_POWER = 0.99  # the most power a fixed design is asked to match


def settings(m: int, design: SequentialSeeds) -> ReportSettings:
    variants = ["base", *(f"v{i}" for i in range(m))]
    return ReportSettings(primary="metric", metrics=["metric"], variants=variants, sequential=design)


def interval(share: float, n: int) -> str:
    return f"{share:.0%} ± {1.96 * math.sqrt(max(share * (1 - share), 1 / n) / n):.0%}"


def rows_for(m: int, design: SequentialSeeds, studies: int) -> list[str]:
    s = settings(m, design)
    null = simulate_sequential(s, [0.0] * m, SD, MEAN, studies, seed=0)
    out = []
    for k, effect in enumerate(EFFECTS):
        run = simulate_sequential(s, [effect] + [0.0] * (m - 1), SD, MEAN, studies, seed=1 + k)
        power = run.share(Verdict.BETTER, column=0)
        # a simulated 100 % is "at least 1 − 1/studies": the fixed design matches 99 %
        n = seeds_for_difference(effect, SD, s.alpha / m, min(power, TOP_POWER)) if power > 0 else None
        fixed = (m + 1) * n if n else math.nan
        null_trials, effect_trials = null.trials.mean(), run.trials.mean()
        out.append(
            f"| {m} | {design.spending} | {design.max} | {effect / SD:.2f} sd | {interval(power, studies)} "
            f"| {run.seeds[:, 0].mean():.1f} | {effect_trials:.1f} | {null_trials:.1f} "
            f"| {null.share(Verdict.EQUIVALENT):.0%} | {null.any_share(Verdict.BETTER, Verdict.WORSE):.1%} "
            f"| {n} | {fixed:.0f} | {effect_trials / fixed:.2f} | {null_trials / fixed:.2f} |"
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--studies", type=int, default=800, help="simulated studies per scenario")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    start = time.time()
    rows = [
        "| m | spending | max | effect | power (sequential) | its seeds | trials, effect | trials, null "
        "| equivalent, null | any false better/worse, null | fixed n, equal power | fixed trials "
        "| sequential / fixed, effect | sequential / fixed, null |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for m in FAMILIES:
        for spending in SPENDINGS:
            for top in MAXIMA:
                design = SequentialSeeds(initial=3, max=top, step=2, spending=spending)
                rows += rows_for(m, design, args.studies)
                print(rows[-1], flush=True)
    fixed80 = {m: [seeds_for_difference(e, SD, 0.05 / m, POWER) for e in EFFECTS] for m in FAMILIES}
    head = (
        f"`python benchmarks/sequential.py --studies {args.studies}` — {date.today()}, "
        f"{time.time() - start:.0f} s. "
        f"sd(Δ) = {SD:.0%} of the baseline's mean, margin 2 %, α = .05, Holm; sequential seeds 3, 5, … max, "
        f"simulated through decide_sequential ({args.studies} studies per scenario; ± is the binomial 95 % "
        "margin). Null: every variant at Δ = 0; effect: one variant at Δ, the rest at 0. Trials: every "
        "variant's seeds and the baseline's. Fixed n of equal power: the fewest seeds whose t-test at α/m "
        "reaches the sequential power, at most 99 % (for reference, 80 % power: "
        + "; ".join(f"m = {m}: {', '.join(map(str, ns))} seeds at 0.67 / 1 sd" for m, ns in fixed80.items())
        + ")."
    )
    publish(SECTION, "\n".join([SECTION, "", head, "", *rows]) + "\n", not args.no_write)


if __name__ == "__main__":
    main()

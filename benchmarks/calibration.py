"""Calibration of the verdicts that issue 58 found wrong, through the project's own functions: each
rate with its Monte-Carlo error (± one standard error), before and after.

    nice python benchmarks/calibration.py --part 1 [--studies 2000] [--no-write]   # 1 … 5

1. **across data sets** — one relative effect (+3 %) shared by k = 3, 4, 8 data sets of 3 or 5
   seeds, each data set at its own metric level and noise (a seed's paired difference with sd
   2–20 % of the level, log-uniform; or 5 % everywhere): how often "varies" (Cochran's Q by χ²,
   before; by parametric bootstrap, after) and how often the pooled interval covers +3 % (HKSJ
   before, the effects' t interval after), through :func:`ablate.stats.across.pool`; and the
   committed study's own design (its four data sets' standard errors, one common effect).
2. **plan --pilot** — pilots of 1 or 3 variants × 3 or 5 seeds (true sd 1), each read as
   ``read_pilot`` reads it, planned for 80 % power at Δ = 0.67 or 1.5 sd with m = 1 or 3
   comparisons: the power the plan's seeds deliver at the true sd, averaged over pilots, and the
   share of plans under 50 % — the sd taken as exact (before) and the expected power (after).
3. **crossed seeds × units** — the balanced table's mean squares drawn from their exact
   distributions (10⁶ per row), the units' share of Var(Δ̂) from 5 % to 95 %: coverage of the
   population mean and median width against the seeds-only interval, Satterthwaite alone
   (before) and never narrower than the seeds-only one (after); and 20,000 whole tables per row
   through ``crossed_estimate`` and ``decide_estimate`` at 3 seeds.
4. **Δ after a sequential stop** — one variant, seeds 3, 5, … 11 or 3, 5, … 19, 20, Pocock- and
   O'Brien–Fleming-type: the median error of the adjusted Δ (after: :meth:`SequentialDecision.adjusted`)
   and its interval's coverage; the naive mean's beside it. (Before: the stage-wise estimate of
   commit 187b603, measured with the same design on 600 studies, quoted.)
5. **the plan's equivalence chance** — every Δ = 0, sd 1.5× or 1× the margin, m = 1, 3, 6: the
   seeds and chance the plan prints (TOST's formula at α/m before; the simulation after) and the
   share ``family_verdicts`` calls equivalent at those seeds in other studies; and
   ``equivalence: per-comparison`` against ``family`` with every variant at ± the margin.
"""

from __future__ import annotations

import argparse
import functools
import math
import time
import warnings
from datetime import date

import numpy as np
import pandas as pd
from results_file import publish  # benchmarks/ is on sys.path when run as a script
from scipy import special, stats

import ablate.stats.verdicts as verdicts
from ablate.stats.across import pool
from ablate.stats.comparison import family_verdicts
from ablate.stats.crossed import crossed_estimate
from ablate.stats.planned import Noise, pilot_df, seeds_for_equivalence_simulated, seeds_for_power
from ablate.stats.power import equivalence_power, seeds_for_difference, seeds_for_equivalence
from ablate.stats.sequential import SequentialSeeds, decide_sequential
from ablate.stats.settings import ReportSettings
from ablate.stats.verdicts import Verdict, decide_estimate, difference_power

ALPHA = 0.05
TITLE = "## Calibration of the verdicts (issue 58), part {}"


def rate(hits: float, n: int) -> str:
    p = hits / n
    se = math.sqrt(max(p * (1 - p), 1 / n) / n)
    return f"{p:.2%} ± {se:.2%}" if se < 0.001 else f"{p:.1%} ± {se:.1%}"


def mean_se(x) -> str:
    x = np.asarray(x, dtype=float)
    return f"{x.mean():.1%} ± {x.std(ddof=1) / math.sqrt(len(x)):.1%}"


def part1(studies: int) -> list[str]:
    from statsmodels.stats.meta_analysis import combine_effects

    rng = np.random.default_rng(581)
    rows = [
        "| noise per data set | k | seeds | varies: Q χ² (before) | varies: Q bootstrap (after) "
        "| covers: HKSJ (before) | covers: t (after) | median width after / before |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def one(e, v, n, counts):
        row = pool(e, v, np.full(len(e), n), ALPHA)
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            res = combine_effects(e, v, method_re="iterated")
        half = stats.t.ppf(1 - ALPHA / 2, len(e) - 1) * float(res.sd_eff_w_re_hksj)
        counts["chi2"] += stats.chi2.sf(row["q"], len(e) - 1) < ALPHA
        counts["boot"] += row["p_homogeneity"] < ALPHA
        counts["hksj"] += abs(float(res.mean_effect_re) - 0.03) <= half
        counts["t"] += row["ci_low"] <= 0.03 <= row["ci_high"]
        counts["ratio"].append((row["ci_high"] - row["ci_low"]) / (2 * half))

    for spread, label in ((10.0, "sd 2–20 % of its level"), (1.0, "sd 5 % everywhere")):
        for n in (3, 5):
            for k in (3, 4, 8):
                counts = {"chi2": 0, "boot": 0, "hksj": 0, "t": 0, "ratio": []}
                for _ in range(studies):
                    level = rng.uniform(0.01, 0.5, k)
                    sd = np.exp(rng.uniform(np.log(0.02), np.log(0.2), k)) if spread > 1 else np.full(k, 0.05)
                    base = level[:, None] * (1 + 0.05 * rng.standard_normal((k, n)))
                    d = level[:, None] * (0.03 + sd[:, None] * rng.standard_normal((k, n)))
                    e, v = d.mean(1) / base.mean(1), d.var(1, ddof=1) / n / base.mean(1) ** 2
                    one(e, v, n, counts)
                rows.append(
                    f"| {label} | {k} | {n} | {rate(counts['chi2'], studies)} "
                    f"| {rate(counts['boot'], studies)} | {rate(counts['hksj'], studies)} "
                    f"| {rate(counts['t'], studies)} "
                    f"| {np.median(counts['ratio']):.2f} |"
                )
                print(rows[-1], flush=True)
    # the committed study's design: its data sets' standard errors over 3 seeds, one effect
    se = np.array([0.113, 0.013, 0.063, 0.028])
    counts = {"chi2": 0, "boot": 0, "hksj": 0, "t": 0, "ratio": []}
    for _ in range(studies):
        sd = se * math.sqrt(3)
        d = 0.03 + sd[:, None] * rng.standard_normal((4, 3))
        one(d.mean(1), d.var(1, ddof=1) / 3, 3, counts)
    rows.append(
        f"| seqrec_across_datasets' (se 11.3, 1.3, 6.3, 2.8 %) | 4 | 3 | {rate(counts['chi2'], studies)} "
        f"| {rate(counts['boot'], studies)} | {rate(counts['hksj'], studies)} | {rate(counts['t'], studies)} "
        f"| {np.median(counts['ratio']):.2f} |"
    )
    return rows


def part2(pilots: int) -> list[str]:
    rng = np.random.default_rng(582)
    rows = [
        "| pilot | its df (effective) | Δ | m | mean power: sd as exact (before) | expected power (after) "
        "| plans under 50 %: before | after | median seeds: before | after |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for variants, seeds in ((1, 3), (3, 3), (1, 5), (3, 5)):
        names = ["base", *(f"v{i}" for i in range(variants))]
        df = pilot_df(pd.DataFrame(np.zeros((seeds, variants + 1)), columns=names), "base")
        for effect in (0.67, 1.5):
            for m in (1, 3):
                level = ALPHA / m

                @functools.lru_cache(maxsize=4096)
                def plans(s: float, level=level, effect=effect, df=df) -> tuple[int, int]:
                    plugged = seeds_for_difference(effect, s, level)
                    return plugged, seeds_for_power(effect, Noise(s, df), level)

                power = {"before": [], "after": []}
                seeds_asked = {"before": [], "after": []}
                for _ in range(pilots):
                    x = rng.standard_normal((seeds, variants + 1)) / math.sqrt(2)
                    d = x[:, 1:] - x[:, :1]
                    s = math.sqrt(((d - d.mean(0)) ** 2).sum() / (variants * (seeds - 1)))
                    for key, n in zip(("before", "after"), plans(float(f"{s:.3g}")), strict=True):
                        power[key].append(difference_power(n, effect, 1.0, level))
                        seeds_asked[key].append(n)
                under = {k: np.mean(np.array(v) < 0.5) * pilots for k, v in power.items()}
                rows.append(
                    f"| {variants} variant(s) × {seeds} seeds | {variants * (seeds - 1)} ({df:.3g}) "
                    f"| {effect} sd | {m} | {mean_se(power['before'])} | {mean_se(power['after'])} "
                    f"| {rate(under['before'], pilots)} | {rate(under['after'], pilots)} "
                    f"| {np.median(seeds_asked['before']):.0f} | {np.median(seeds_asked['after']):.0f} |"
                )
                print(rows[-1], flush=True)
    return rows


def part3(draws: int) -> list[str]:
    rng = np.random.default_rng(583)
    rows = [
        "| seeds | units | units' share of Var(Δ̂) | covers: Satterthwaite (before) | covers: never narrower "
        "(after) | median width / seeds-only: before | after |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    q = 1 - ALPHA / 2
    for s in (3, 4, 5, 10):
        for u in (30, 3000):
            for share in (0.05, 0.2, 0.4, 0.6, 0.8, 0.95):
                ss = (1 - 1 / (s * u)) * s  # the seeds' part of Var(Δ̂) 1, the interaction's σ² 1
                su = share / (1 - share) * u
                e = rng.normal(0, math.sqrt(ss / s + su / u + 1 / (s * u)), draws)
                rest_df = (s - 1) * (u - 1)
                ms_s = (u * ss + 1) * rng.chisquare(s - 1, draws) / (s - 1)
                ms_u = (s * su + 1) * rng.chisquare(u - 1, draws) / (u - 1)
                ms_r = rng.chisquare(rest_df, draws) / rest_df
                unit = ms_u > ms_r
                total = np.where(unit, ms_s + ms_u - ms_r, ms_s)
                parts = ms_s**2 / (s - 1) + ms_u**2 / (u - 1) + ms_r**2 / rest_df
                df = np.where(unit, total**2 / parts, s - 1)
                before = special.stdtrit(df, q) * np.sqrt(total / (s * u))
                seeds_only = special.stdtrit(s - 1, q) * np.sqrt(ms_s / (s * u))
                after = np.maximum(before, seeds_only)
                rows.append(
                    f"| {s} | {u} | {share:.0%} | {rate(np.sum(np.abs(e) <= before), draws)} "
                    f"| {rate(np.sum(np.abs(e) <= after), draws)} | {np.median(before / seeds_only):.2f} "
                    f"| {np.median(after / seeds_only):.2f} |"
                )
            print(rows[-1], flush=True)
    # whole tables through the code at 3 seeds × 30 units
    verdicts.minimum_detectable = lambda *args, **kwargs: math.nan  # not read here
    rows += ["", "| through the code (3 seeds × 30 units): units' share | tables | covers | narrower |"]
    rows.append("|---:|---:|---:|---:|")
    for share in (0.1, 0.2, 0.4):
        tables, covered, narrower = 20_000, 0, 0
        ss, su = (1 - 1 / 90) * 3, share / (1 - share) * 30
        t_seeds = special.stdtrit(2, q)
        for _ in range(tables):
            table = (
                rng.normal(scale=math.sqrt(ss), size=(3, 1))
                + rng.normal(scale=math.sqrt(su), size=(1, 30))
                + rng.normal(size=(3, 30))
            )
            est = crossed_estimate(table)
            d = decide_estimate(est.delta, est.se, est.df, ALPHA, 1e9, seeds=3, floor=est.floor())
            covered += d.ci_low <= 0 <= d.ci_high
            seeds_only = t_seeds * table.mean(1).std(ddof=1) / math.sqrt(3)
            narrower += (d.ci_high - d.ci_low) / 2 < seeds_only * (1 - 1e-9)
        rows.append(f"| {share:.0%} | {tables} | {rate(covered, tables)} | {narrower} |")
        print(rows[-1], flush=True)
    return rows


# the stage-wise estimate of commit 187b603 on the same design (600 studies, seed 8): median error
BEFORE_4 = {  # Δ = 0.5, 1, 1.5, 2 sd
    ("pocock", 11): ("−0.005 ± 0.017", "−0.074 ± 0.018", "−0.136 ± 0.021", "−0.162 ± 0.024"),
    ("pocock", 20): ("+0.011 ± 0.014", "−0.057 ± 0.016", "−0.107 ± 0.019", "−0.141 ± 0.021"),
    ("obrien_fleming", 11): ("+0.004 ± 0.016", "−0.038 ± 0.017", "−0.053 ± 0.018", "−0.066 ± 0.019"),
    ("obrien_fleming", 20): ("+0.020 ± 0.012", "−0.000 ± 0.014", "−0.019 ± 0.016", "−0.024 ± 0.017"),
}


def part4(studies: int) -> list[str]:
    verdicts.minimum_detectable = lambda *args, **kwargs: math.nan  # not read here
    rows = [
        "| spending | seeds | Δ | mean seeds | median error: naive | before (stage-wise, 600 studies) "
        "| after | within 2 se | interval covers (after) |",
        "|---|---|---:|---:|---:|---:|---:|---|---:|",
    ]
    for spending in ("pocock", "obrien_fleming"):
        for top in (11, 20):
            design = SequentialSeeds(initial=3, max=top, step=2, spending=spending)
            looks = (
                ", ".join(map(str, design.looks()[:2])) + f", … {', '.join(map(str, design.looks()[-2:]))}"
            )
            for e, effect in enumerate((0.5, 1.0, 1.5, 2.0)):
                rng = np.random.default_rng(584)
                naive, adjusted, covered, seeds = [], [], 0, []
                for _ in range(studies):
                    x = rng.normal(size=(top, 1)) + rng.normal(scale=math.sqrt(0.5), size=(top, 2))
                    table = pd.DataFrame(x + [0.0, effect], columns=["base", "v0"])
                    s = decide_sequential(table, "base", ["v0"], design, ALPHA, "holm", lambda _: 0.01)["v0"]
                    naive.append(s.decision.delta - effect)
                    adjusted.append(s.adjusted(design) - effect)
                    low, high = s.adjusted_interval(design)
                    covered += low <= effect <= high
                    seeds.append(s.seeds)

                def median(x):
                    return float(np.median(x)), 1.2533 * float(np.std(x)) / math.sqrt(len(x))

                (mn, sn), (ma, sa) = median(naive), median(adjusted)
                rows.append(
                    f"| {spending} | {looks} | {effect} sd | {np.mean(seeds):.1f} | {mn:+.3f} ± {sn:.3f} "
                    f"| {BEFORE_4[(spending, top)][e]} | {ma:+.3f} ± {sa:.3f} | "
                    f"{'yes' if abs(ma) <= 2 * sa else 'no'} | {rate(covered, studies)} |"
                )
                print(rows[-1], flush=True)
    return rows


def part5(studies: int, plan_studies: int) -> list[str]:
    rows = [
        "| m | sd / margin | before: seeds (TOST at α/m) | promised | realised | after: seeds (simulated) "
        "| promised | realised | after within 2 se |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]

    def realised(settings, m, n, seed):
        rng = np.random.default_rng(seed)
        names = ["base", *(f"variant {i + 1}" for i in range(m))]
        shares = []
        for _ in range(studies):
            x = 1.0 + rng.normal(0, 0.05, (n, 1)) + rng.normal(0, sd / math.sqrt(2), (n, m + 1))
            decided = family_verdicts(pd.DataFrame(x, columns=names), settings, "m", names[1:])
            shares.append(np.mean([d.decision.verdict is Verdict.EQUIVALENT for d in decided.values()]))
        return float(np.mean(shares)), float(np.std(shares, ddof=1) / math.sqrt(studies))

    for ratio in (1.5, 1.0):
        for m in (1, 3, 6):
            margin, sd = 0.02, 0.02 * ratio
            names = ["base", *(f"v{i}" for i in range(m))]
            s = ReportSettings(primary="m", metrics=["m"], variants=names, margin="2%")
            n0 = seeds_for_equivalence(sd, margin, ALPHA / m)
            promised0 = equivalence_power(n0, 0.0, sd, margin, ALPHA / m)
            r0, e0 = realised(s, m, n0, 5850 + m)
            n1, promised1 = seeds_for_equivalence_simulated(s, m, Noise(sd), 1.0, margin, plan_studies)
            r1, e1 = realised(s, m, n1, 5860 + m)
            # the plan's own estimate: plan_studies studies; its error from the realised spread
            e_plan = e1 * math.sqrt(studies / plan_studies)
            ok = abs(r1 - promised1) <= 2 * math.sqrt(e1**2 + e_plan**2)
            rows.append(
                f"| {m} | {ratio} | {n0} | {promised0:.1%} | {r0:.1%} ± {e0:.1%} | {n1} "
                f"| {promised1:.1%} ± {e_plan:.1%} | {r1:.1%} ± {e1:.1%} | {'yes' if ok else 'no'} |"
            )
            print(rows[-1], flush=True)
    rows += [
        "",
        "| m | seeds | every variant at | some variant said inside the margin: family | per-comparison "
        "| called equivalent: family | per-comparison |",
        "|---:|---:|---|---:|---:|---:|---:|",
    ]
    rng = np.random.default_rng(5870)
    for m in (3, 6):
        for n in (10, 30):
            names = ["base", *(f"v{i}" for i in range(m))]
            signs = np.array([0.0, *([1.0, -1.0] * m)[:m]])
            counts = {(r, c): 0 for r in ("family", "per-comparison") for c in ("inside", "equivalent")}
            for _ in range(studies):
                x = 1.0 + rng.normal(0, 0.03 / math.sqrt(2), (n, m + 1)) + 0.02 * signs
                table = pd.DataFrame(x, columns=names)
                for rule in ("family", "per-comparison"):
                    s = ReportSettings(
                        primary="m", metrics=["m"], variants=names, margin=0.02, equivalence=rule
                    )
                    got = [d.decision for d in family_verdicts(table, s, "m", names[1:]).values()]
                    inside = any(d.verdict is Verdict.EQUIVALENT or d.negligible for d in got)
                    counts[(rule, "inside")] += inside
                    counts[(rule, "equivalent")] += any(d.verdict is Verdict.EQUIVALENT for d in got)
            rows.append(
                f"| {m} | {n} | ± the margin (sd 1.5× it) | {rate(counts[('family', 'inside')], studies)} "
                f"| {rate(counts[('per-comparison', 'inside')], studies)} "
                f"| {rate(counts[('family', 'equivalent')], studies)} "
                f"| {rate(counts[('per-comparison', 'equivalent')], studies)} |"
            )
            print(rows[-1], flush=True)
    return rows


HEADS = {
    1: 'across data sets: false "varies" and the pooled interval\'s coverage, one shared effect',
    2: "plan --pilot: the power its plans deliver",
    3: "the crossed seeds × units interval",
    4: "the Δ after a sequential stop",
    5: "the plan's equivalence chance, and equivalence: per-comparison",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", type=int, choices=range(1, 6), required=True)
    parser.add_argument("--studies", type=int, default=2000, help="simulated studies (pilots) per row")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    start = time.time()
    rows = {
        1: lambda: part1(args.studies),
        2: lambda: part2(args.studies),
        3: lambda: part3(1_000_000),
        4: lambda: part4(args.studies),
        5: lambda: part5(args.studies, 400),
    }[args.part]()
    title = TITLE.format(args.part) + f": {HEADS[args.part]}"
    studies = "" if args.part == 3 else f" --studies {args.studies}"
    head = (
        f"`python benchmarks/calibration.py --part {args.part}{studies}` — {date.today()}, "
        f"{time.time() - start:.0f} s on a 2-core machine shared with other jobs; α = .05; ± is one "
        "Monte-Carlo standard error. What each row simulates: the script's docstring."
    )
    publish(TITLE.format(args.part), "\n".join([title, "", head, "", *rows]) + "\n", not args.no_write)


if __name__ == "__main__":
    main()

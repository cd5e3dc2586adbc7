"""A/A on real training noise: one configuration trained over many seeds, its seeds split at random
into two "variants" again and again, each split pushed through the report's verdict code.

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/aa.py [--seeds 24] [--out DIR] [--splits 1000] [--no-write]

The configuration is the quickstart's base model on its synthetic data (studies/quickstart.yaml
without its variants), trained with ``ablate.drive.run_study`` over seeds 0 … N−1 into ``--out``
(a second run with the same folder reuses the trained seeds). Then, for n = 3, 5, 10 paired seeds:

* **one comparison**: 2n of the N seeds drawn at random, n form the "baseline" and n the "variant"
  (paired in draw order), and ``ablate.stats.compare`` — the report's table — gives the verdict
  and its interval. The true difference is 0, so *better* / *worse* is a false positive (the
  rate should be ≤ α = 0.05), *equivalent* is correct, *inconclusive* is the price of few seeds;
  the interval should cover 0 in ≥ 95 % of splits;
* **a family of three** (where 4n ≤ N): a baseline and three "variants", Holm over the three;
  any *better* / *worse* is a family-wise false positive;
* **sequential seeds** (``seeds: {initial: 3, max: 11, step: 2}``, Pocock-type α-spending):
  two arms of 11 seeds, ``ablate.stats.sequential.decide_sequential``; the verdict where it
  stopped and the seeds it used.

Splits of one pool of N seeds overlap, so the rates' real uncertainty is larger than the
binomial one printed beside them. Prints the section and writes it to benchmarks/RESULTS.md
("A/A on real training noise"); ``--out`` also receives ``per_seed.csv`` and ``rates.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from results_file import write_section  # benchmarks/ is on sys.path when run as a script

from ablate.drive import Reporter, Stores, run_study
from ablate.stats import ReportSettings, compare
from ablate.stats.sequential import SequentialSeeds, decide_sequential
from ablate.study.load import load_study
from ablate.tracking.results import load_results

REPO = Path(__file__).resolve().parents[1]
QUICKSTART = REPO / "studies" / "quickstart.yaml"
SECTION = "## A/A on real training noise"
SIZES = (3, 5, 10)
FAMILY = 3  # "variants" per split in the family-wise check
DESIGN = SequentialSeeds(initial=3, max=11, step=2)
BASE = "base"


class Progress(Reporter):
    def trial(self, variant: str, seed: int, epochs: int) -> None:
        print(f"  training seed {seed} ({epochs} epochs)", flush=True)


def train(seeds: int, out: Path) -> tuple[pd.Series, str, ReportSettings]:
    """Seed → the primary test metric of the quickstart base over seeds 0 … seeds−1."""
    spec = yaml.safe_load(QUICKSTART.read_text())
    spec.pop("variants", None)
    spec.update(name="aa", seeds=list(range(seeds)), output=str(out / "runs"))
    spec["report"] = {**spec.get("report", {}), "calibration": 0}
    path = out / "aa.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    study = load_study(path)
    stores = Stores.for_study(study)
    summary = run_study(study, stores, Progress())
    if summary.failed:
        sys.exit(f"failed trials: {summary.failed}")
    results = load_results(stores.tracking_uri, study.name, curves=False).results
    metric = study.metrics[0]
    per_seed = results.set_index("seed")[f"test.{metric}"].sort_index()
    settings = study.report_settings().model_copy(update={"bootstrap": 100, "calibration": 0})
    return per_seed, metric, settings


def _frame(arms: dict[str, np.ndarray], metric: str) -> pd.DataFrame:
    """A results frame as the report reads it: arm i's j-th value is (arm, seed j)."""
    rows = [
        {"variant": name, "seed": j, f"test.{metric}": float(v)}
        for name, values in arms.items()
        for j, v in enumerate(values)
    ]
    return pd.DataFrame(rows)


def fixed(
    per_seed: pd.Series,
    metric: str,
    settings: ReportSettings,
    n: int,
    variants: int,
    splits: int,
    rng: np.random.Generator,
) -> dict:
    """Verdict counts over ``splits`` random splits into a baseline and ``variants`` arms of n."""
    values = per_seed.to_numpy(float)
    names = [f"v{i}" for i in range(1, variants + 1)]
    here = settings.model_copy(update={"variants": [BASE, *names], "baseline": BASE})
    counts = {"better": 0, "worse": 0, "equivalent": 0, "inconclusive": 0, "covers": 0, "any_false": 0}
    mdd, margin = [], []
    for _ in range(splits):
        drawn = values[rng.permutation(len(values))[: n * (variants + 1)]].reshape(variants + 1, n)
        table = compare(_frame(dict(zip([BASE, *names], drawn, strict=True)), metric), None, here, metric)
        rows = table[table["variant"] != BASE]
        for row in rows.itertuples():
            counts[str(row.verdict)] += 1
            counts["covers"] += int(row.ci_low <= 0.0 <= row.ci_high)
            mdd.append(row.mdd)
            margin.append(row.margin)
        counts["any_false"] += int(rows["verdict"].isin(["better", "worse"]).any())
    comparisons = splits * variants
    rates = {k: v / comparisons for k, v in counts.items() if k != "any_false"}
    rates["family_false"] = counts["any_false"] / splits
    rates.update(mdd=float(np.mean(mdd)), margin=float(np.mean(margin)), splits=splits)
    return rates


def sequential(per_seed: pd.Series, settings: ReportSettings, splits: int, rng: np.random.Generator) -> dict:
    """Where the sequential rule stops on random splits into two arms of ``DESIGN.max`` seeds."""
    values = per_seed.to_numpy(float)
    counts = {"better": 0, "worse": 0, "equivalent": 0, "inconclusive": 0, "covers": 0}
    used, stops = [], {}
    for _ in range(splits):
        base, variant = values[rng.permutation(len(values))[: 2 * DESIGN.max]].reshape(2, DESIGN.max)
        frame = pd.DataFrame({BASE: base, "v1": variant})
        standing = decide_sequential(
            frame, BASE, [BASE, "v1"], DESIGN, settings.alpha, settings.correction, settings.margin_for
        )["v1"]
        decision = standing.decision
        counts[str(decision.verdict)] += 1
        counts["covers"] += int(decision.ci_low <= 0.0 <= decision.ci_high)
        used.append(standing.seeds)
        stops[standing.seeds] = stops.get(standing.seeds, 0) + 1
    rates = {k: v / splits for k, v in counts.items()}
    rates.update(mean_seeds=float(np.mean(used)), stops=dict(sorted(stops.items())), splits=splits)
    return rates


def _pct(rate: float, splits: int) -> str:
    return f"{100 * rate:.1f}% ± {100 * math.sqrt(max(rate * (1 - rate), 1e-12) / splits):.1f}"


def section(per_seed, metric, settings, results, seq, command, seconds) -> str:
    mean, sd = float(per_seed.mean()), float(per_seed.std(ddof=1))
    lines = [
        SECTION,
        "",
        f"`{command}` — {date.today().isoformat()}, {len(per_seed)} seeds of the quickstart base "
        f"(studies/quickstart.yaml without variants: synthetic data, 8 epochs), {seconds:.0f} s in all. "
        f"Test {metric} over the seeds: mean {mean:.4f}, sd {sd:.4f}. Each split draws seeds at random "
        f"from the pool without replacement: an arm's j-th seed is paired with the other arms' j-th, so "
        f"pairs share nothing (in a real study a seed gives two variants the same data order). "
        f"α = {settings.alpha}, {settings.correction}, margin {settings.margin} of the baseline mean. "
        "± is one binomial standard error; splits of one pool overlap, so the real uncertainty is larger.",
        "",
        "Fixed seeds, through `ablate.stats.compare` (the report's table): one comparison per split, "
        f'and a family of {FAMILY} "variants" against one baseline (Holm), where the pool holds '
        f"{FAMILY + 1} arms.",
        "",
        "| paired seeds | comparisons | false better/worse | equivalent | inconclusive | CI covers 0 "
        f"| mean MDD (80%) | mean margin | family of {FAMILY}: any false better/worse |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n, (one, family) in results.items():
        false = one["better"] + one["worse"]
        fam = _pct(family["family_false"], family["splits"]) if family else "— (too few seeds)"
        lines.append(
            f"| {n} | {one['splits']} splits | {_pct(false, one['splits'])} | "
            f"{_pct(one['equivalent'], one['splits'])} | {_pct(one['inconclusive'], one['splits'])} | "
            f"{_pct(one['covers'], one['splits'])} | {one['mdd']:.4f} | {one['margin']:.4f} | {fam} |"
        )
    stops = ", ".join(f"{k}: {v}" for k, v in seq["stops"].items())
    lines += [
        "",
        f"Sequential seeds (`seeds: {{initial: {DESIGN.initial}, max: {DESIGN.max}, step: {DESIGN.step}}}`, "
        f"{DESIGN.spending} spending), `ablate.stats.sequential.decide_sequential` on {seq['splits']} splits "
        f"into two arms of {DESIGN.max}: false better/worse "
        f"{_pct(seq['better'] + seq['worse'], seq['splits'])}, "
        f"equivalent {_pct(seq['equivalent'], seq['splits'])}, inconclusive at the maximum "
        f"{_pct(seq['inconclusive'], seq['splits'])}, final interval covers 0 in "
        f"{_pct(seq['covers'], seq['splits'])}; {seq['mean_seeds']:.1f} seeds per arm on average "
        f"(splits stopping at each seed count: {stops}).",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=24)
    parser.add_argument(
        "--out", type=Path, default=None, help="folder for the runs (default: a temporary one)"
    )
    parser.add_argument("--splits", type=int, default=1000, help="random splits per design")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = parser.parse_args()
    if args.seeds < 2 * DESIGN.max:
        sys.exit(f"--seeds must be at least {2 * DESIGN.max} (two arms of the sequential design's maximum)")
    command = "OMP_NUM_THREADS=1 nice -n 10 python benchmarks/aa.py " + " ".join(sys.argv[1:])
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        out = (args.out or Path(tmp)).resolve()
        out.mkdir(parents=True, exist_ok=True)
        threads = os.environ.get("OMP_NUM_THREADS", "default")
        print(f"training {args.seeds} seeds into {out} (threads: {threads})", flush=True)
        per_seed, metric, settings = train(args.seeds, out)
        rng = np.random.default_rng(2026)
        results = {}
        for n in SIZES:
            if 2 * n > len(per_seed):
                continue
            one = fixed(per_seed, metric, settings, n, 1, args.splits, rng)
            family = (
                fixed(per_seed, metric, settings, n, FAMILY, args.splits, rng)
                if (FAMILY + 1) * n <= len(per_seed)
                else None
            )
            results[n] = (one, family)
            print(f"n = {n}: {one}", flush=True)
        seq = sequential(per_seed, settings, args.splits, rng)
        print(f"sequential: {seq}", flush=True)
        text = section(per_seed, metric, settings, results, seq, command, time.perf_counter() - start)
        if args.out:
            per_seed.to_csv(out / "per_seed.csv")
            rates = {
                "fixed": {n: {"one": o, "family": f} for n, (o, f) in results.items()},
                "sequential": seq,
            }
            (out / "rates.json").write_text(json.dumps(rates, indent=2, default=str))
    print(text)
    if not args.no_write:
        write_section(SECTION, text)


if __name__ == "__main__":
    main()

"""Per-item verdicts simulated through the report's own functions (``ablate.stats.items``):

    nice -n 10 python benchmarks/items.py [--reps 2000] [--no-write]

Two models answer the same items, 0/1 scores, one seed each. An item's chance of a right answer
is Φ(μ + z_u + c_{m,g} + δ·[m = variant]): ``z_u`` the item's difficulty, shared by the models
(what makes pairing pay), ``c_{m,g}`` a model's own effect on the cluster ``g`` of items (a passage
its questions share; sd ``cluster_sd``, 0: independent items), δ the planted effect.

* **A/A with clustered items** (δ = 0): the share of verdicts *better* / *worse* (false, α = 0.05)
  of the test ``compare --items`` picks when the clusters are given (cluster-robust paired t) and
  of the naive item-level test on the same data without them (McNemar, items taken as independent);
* **power, paired against unpaired** (δ > 0, independent items): the share *better* of McNemar
  (paired by item) and of Welch's t on the same scores taken as two independent samples (what a
  comparison of two accuracies with their own standard errors does), through the same
  ``decide_estimate``.

Prints the section and writes it to benchmarks/RESULTS.md ("Per-item verdicts, simulated")."""

from __future__ import annotations

import argparse
import math
import sys
import time
from datetime import date
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import special
from scipy import stats as scipy_stats

from ablate.stats.items import decide_items, item_test
from ablate.stats.verdicts import Verdict, decide_estimate

ALPHA, MARGIN = 0.05, 0.01


def draw(rng, clusters: int, per_cluster: int, cluster_sd: float, effect: float, mu: float = 0.3):
    """Long per-item scores of ``base`` and ``variant`` (unit, cluster, score)."""
    n = clusters * per_cluster
    cluster = np.repeat(np.arange(clusters), per_cluster)
    difficulty = rng.normal(0.0, 1.0, n)
    frames = []
    for model, shift in (("base", 0.0), ("variant", effect)):
        own = rng.normal(0.0, cluster_sd, clusters)[cluster] if cluster_sd else 0.0
        right = rng.random(n) < special.ndtr(mu + difficulty + own + shift)
        frames.append(pd.DataFrame({"variant": model, "seed": 0, "unit": np.arange(n), "cluster": cluster}))
        frames[-1]["score"] = right.astype(float)
    return pd.concat(frames, ignore_index=True)


def verdict(units: pd.DataFrame) -> Verdict:
    test = item_test(units, "variant", "base")
    return decide_items({"variant": test}, ALPHA, "holm", {"variant": MARGIN})["variant"].verdict


def unpaired(units: pd.DataFrame) -> Verdict:
    """Welch's t on the two models' scores as independent samples, read as compare reads it."""
    a = units.loc[units["variant"] == "variant", "score"].to_numpy()
    b = units.loc[units["variant"] == "base", "score"].to_numpy()
    se = math.sqrt(a.var(ddof=1) / len(a) + b.var(ddof=1) / len(b))
    df = float(scipy_stats.ttest_ind(a, b, equal_var=False).df)
    return decide_estimate(float(a.mean() - b.mean()), se, df, ALPHA, MARGIN).verdict


def false_rates(reps: int, clusters: int, per_cluster: int, cluster_sd: float, seed: int = 0) -> dict:
    """A/A: the share of better / worse, clusters given and not."""
    rng = np.random.default_rng(seed)
    given = naive = 0
    for _ in range(reps):
        units = draw(rng, clusters, per_cluster, cluster_sd, 0.0)
        given += verdict(units) in (Verdict.BETTER, Verdict.WORSE)
        naive += verdict(units.drop(columns="cluster")) in (Verdict.BETTER, Verdict.WORSE)
    return {"clusters given": given / reps, "naive (items independent)": naive / reps}


def power(reps: int, items: int, effect: float, seed: int = 1) -> dict:
    """A planted effect: the share *better*, paired by item and unpaired."""
    rng = np.random.default_rng(seed)
    paired = apart = 0
    for _ in range(reps):
        units = draw(rng, 1, items, 0.0, effect).drop(columns="cluster")
        paired += verdict(units) is Verdict.BETTER
        apart += unpaired(units) is Verdict.BETTER
    return {"paired (McNemar)": paired / reps, "unpaired (Welch)": apart / reps}


def section(reps: int) -> str:
    lines = [
        "## Per-item verdicts, simulated (issue 62)",
        "",
        f"`python benchmarks/items.py --reps {reps}` — {date.today()}, {reps} simulated comparisons per "
        "row, α = 0.05, one comparison; 0/1 scores, one seed per model; an item right with chance "
        "Φ(0.3 + z_u + c_{m,g} + δ), z_u ~ N(0, 1) shared by the models, c_{m,g} ~ N(0, sd) a model's "
        "own effect on a cluster of items. ± is the binomial standard error.",
        "",
        "| A/A (δ = 0) | items | cluster sd | false better/worse: clusters given (cluster-robust t) "
        "| naive: McNemar, items independent |",
        "|---|---:|---:|---:|---:|",
    ]
    for clusters, per_cluster, sd in ((20, 10, 0.0), (20, 10, 0.3), (20, 10, 0.6), (40, 5, 0.6)):
        rates = false_rates(reps, clusters, per_cluster, sd)
        cells = [f"{r:.3f} ± {math.sqrt(r * (1 - r) / reps):.3f}" for r in rates.values()]
        lines.append(
            f"| {clusters} clusters × {per_cluster} | {clusters * per_cluster} | {sd} | {' | '.join(cells)} |"
        )
    lines += [
        "",
        "| planted δ (probit) | items | P(better): paired by item (McNemar) "
        "| unpaired (Welch on the same scores) |",
        "|---:|---:|---:|---:|",
    ]
    for items, effect in ((200, 0.2), (200, 0.35), (500, 0.2)):
        rates = power(reps, items, effect)
        lines.append(f"| {effect} | {items} | {' | '.join(f'{r:.3f}' for r in rates.values())} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=2000)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    text = section(args.reps)
    text += f"\nWall time {time.perf_counter() - start:.0f} s on this machine's shared 2 cores.\n"
    print(text)
    if not args.no_write:
        results = Path(__file__).with_name("RESULTS.md")
        old = results.read_text()
        head = "## Per-item verdicts, simulated (issue 62)"
        kept = old.split(head)[0].rstrip() + "\n\n" if head in old else old.rstrip() + "\n\n"
        results.write_text(kept + text)


if __name__ == "__main__":
    sys.exit(main())

"""The research loop's gate against the rules loops use today, simulated night by night through the
gate's own decision code (:class:`ablate.stats.gate.Gate`, with a simulated trainer plugged in).

    nice python benchmarks/gate_loop.py [--nights 1000] [--candidates 30] [--no-write]

Seed noise: the per-seed residuals (value − its variant's mean, over that file's pooled sd) of the
first test metric of every committed ``reports/*/results.csv``, drawn with replacement: each
(configuration, seed) gets its own draw, so the shape of real seed noise (its tails, its skew) is
what a run sees. Units: one seed's sd. A night starts from one configuration (quality 0) and sees
``--candidates`` candidates, each independently null (Δ = 0, 50 %), a small gain (+0.5 or +1 sd,
15 % each) or harmful (−1 sd, 20 %); a candidate's quality is the incumbent's plus its Δ.

Rules:

* **gate**: LORD++ at FDR 0.1 over a horizon of 30 candidates, seeds 3 → 24 by 3
  (O'Brien–Fleming-type), margin 0.25 sd, fresh incumbent seeds after every keep;
* **greedy**: one run of the candidate; kept when it beats the best run so far (autoresearch's rule);
* **bootstrap-3**: three seeds of the candidate against the incumbent's three stored ones (the
  seeds it won with); kept when the 95 % percentile bootstrap interval of the paired mean Δ is above 0.

Per night: false keeps (Δ ≤ 0 kept), the false discovery proportion (false keeps / keeps), real
gains kept (share of the Δ > 0 candidates), seeds trained (candidates' and incumbents'), and the
final incumbent's true quality. Means over nights with their Monte-Carlo standard errors; writes
the section "The research loop's gate (issue 61)" to benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from ablate.report.document import md_table
from ablate.stats.gate import Gate, GateSettings, Outcome

REPO = Path(__file__).resolve().parents[1]
SECTION = "## The research loop's gate (issue 61)"
EFFECTS = (0.0, 0.5, 1.0, -1.0)  # null, small gains, harmful (seed sd units)
MIX = (0.5, 0.15, 0.15, 0.2)
SETTINGS = GateSettings(alpha=0.1, margin=0.25, initial=3, max=24, step=3, horizon=30)


def seed_noise(reports: Path = REPO / "reports") -> np.ndarray:
    """Standardised per-seed residuals of every committed results.csv's first test metric."""
    pooled = []
    for path in sorted(reports.glob("*/results.csv")):
        frame = pd.read_csv(path)
        metric = next((c for c in frame.columns if c.startswith("test.")), None)
        if metric is None or "variant" not in frame:
            continue
        values = frame[["variant", metric]].dropna()
        residual = values[metric] - values.groupby("variant")[metric].transform("mean")
        counts = values.groupby("variant")[metric].transform("count")
        residual = residual[counts >= 3]
        dof = (values.groupby("variant")[metric].count().clip(lower=1) - 1).where(lambda c: c >= 2).sum()
        if dof and len(residual):
            sd = math.sqrt(float((residual**2).sum()) / dof)
            if sd > 0:
                pooled.append((residual / sd).to_numpy())
    return np.concatenate(pooled)


@dataclass
class Night:
    """One night's truth: each candidate's Δ, and its draws of seed noise as a trainer needs them."""

    effects: np.ndarray
    noise: np.ndarray
    rng: np.random.Generator

    def __post_init__(self) -> None:
        self.draws: dict[tuple[str, int], float] = {}
        self.quality = {"c0": 0.0}

    def value(self, key: str, seed: int) -> float:
        """A trained (configuration, seed): drawn once, then read back as a store would."""
        if (key, seed) not in self.draws:
            self.draws[key, seed] = self.quality[key] + float(self.rng.choice(self.noise))
        return self.draws[key, seed]

    def trainer(self, key: str, seeds: list[int]) -> np.ndarray:
        return np.array([self.value(key, s) for s in seeds])


def draw_night(rng: np.random.Generator, noise: np.ndarray, candidates: int) -> Night:
    return Night(rng.choice(EFFECTS, size=candidates, p=MIX), noise, rng)


def run_gate(night: Night, settings: GateSettings = SETTINGS) -> dict[str, float]:
    gate = Gate(settings, "c0")
    for i, effect in enumerate(night.effects, start=1):
        key = f"c{i}"
        night.quality[key] = night.quality[gate.incumbent] + effect
        gate.consider(key, night.trainer)
    kept = [d for d in gate.history if d.outcome is Outcome.KEEP]
    return _tally(night, [int(d.key[1:]) for d in kept], len(night.draws), gate.incumbent)


def run_greedy(night: Night) -> dict[str, float]:
    incumbent, best, kept, seed = "c0", night.value("c0", 0), [], 1
    for i, effect in enumerate(night.effects, start=1):
        key = f"c{i}"
        night.quality[key] = night.quality[incumbent] + effect
        value = night.value(key, seed)  # one run: a new seed each time, as a loop re-runs
        seed += 1
        if value > best:
            incumbent, best = key, value
            kept.append(i)
    return _tally(night, kept, len(night.draws), incumbent)


def run_bootstrap(night: Night, rng: np.random.Generator) -> dict[str, float]:
    incumbent, kept, seeds = "c0", [], [0, 1, 2]
    base = night.trainer("c0", seeds)
    for i, effect in enumerate(night.effects, start=1):
        key = f"c{i}"
        night.quality[key] = night.quality[incumbent] + effect
        values = night.trainer(key, seeds)
        interval = stats.bootstrap(
            (values - base,), np.mean, n_resamples=999, method="percentile", random_state=rng
        ).confidence_interval
        if interval.low > 0:
            incumbent, base = key, values  # its winning seeds stay its record
            kept.append(i)
    return _tally(night, kept, len(night.draws), incumbent)


def _tally(night: Night, kept: list[int], seeds: int, incumbent: str) -> dict[str, float]:
    effects = night.effects
    false = sum(effects[i - 1] <= 0 for i in kept)
    gains = effects > 0
    return {
        "false keeps": float(false),
        "FDP": false / len(kept) if kept else 0.0,
        "gains kept": sum(effects[i - 1] > 0 for i in kept) / max(int(gains.sum()), 1),
        "seeds": float(seeds),
        "final quality": night.quality[incumbent],
        "best possible": float(effects[gains].sum()),
    }


RULES = ("gate", "greedy", "bootstrap-3")


def simulate(
    nights: int,
    candidates: int,
    seed: int = 61,
    noise: np.ndarray | None = None,
    settings: GateSettings = SETTINGS,
) -> pd.DataFrame:
    """One row per (rule, night): the same nights' truths and noise for every rule."""
    noise = seed_noise() if noise is None else noise
    rows = []
    for night_no in range(nights):
        for rule in RULES:
            rng = np.random.default_rng([seed, night_no])  # the same night for each rule
            night = draw_night(rng, noise, candidates)
            if rule == RULES[0]:
                tally = run_gate(night, settings)
            elif rule == RULES[1]:
                tally = run_greedy(night)
            else:
                tally = run_bootstrap(night, rng)
            rows.append({"rule": rule, "night": night_no, **tally})
    return pd.DataFrame(rows)


def summarise(frame: pd.DataFrame) -> pd.DataFrame:
    """Mean ± Monte-Carlo standard error per rule and measure."""
    measures = ["false keeps", "FDP", "gains kept", "seeds", "final quality", "best possible"]
    grouped = frame.groupby("rule", sort=False)[measures]
    mean, se = grouped.mean(), grouped.std(ddof=1) / np.sqrt(grouped.count())
    return mean.round(3).astype(str) + " ± " + se.round(3).astype(str)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nights", type=int, default=1000)
    parser.add_argument("--candidates", type=int, default=30)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    started = time.perf_counter()
    noise = seed_noise()
    frame = simulate(args.nights, args.candidates, noise=noise)
    table = summarise(frame)
    wall = time.perf_counter() - started
    print(_markdown(table))
    print(f"{args.nights} nights × {args.candidates} candidates, {len(noise)} residuals, {wall:.0f} s")
    if not args.no_write:
        from results_file import write_section  # benchmarks/ is on sys.path when run as a script

        write_section(SECTION, _section(table, args, len(noise), wall))


def _markdown(table: pd.DataFrame) -> str:
    rows = [[rule, *row] for rule, row in zip(table.index, table.to_numpy().tolist(), strict=True)]
    return md_table(["rule", *table.columns], rows, left=1)


def _section(table: pd.DataFrame, args, residuals: int, wall: float) -> str:
    s = SETTINGS
    return (
        f"{SECTION}\n\n"
        f"`python benchmarks/gate_loop.py --nights {args.nights} --candidates {args.candidates}` "
        f"({wall:.0f} s on this machine's CPU): {args.nights} nights of {args.candidates} candidates, each "
        "null (Δ = 0, 50 %), a small gain (+0.5 or +1 seed sd, 15 % each) or harmful (−1 sd, 20 %); seed "
        f"noise drawn from {residuals} standardised per-seed residuals of the committed reports' "
        "`results.csv`. The gate: LORD++ at FDR "
        f"{s.alpha} over a horizon of {s.horizon} candidates, seeds {s.initial} → {s.max} by {s.step} "
        f"({s.spending}-type), margin {s.margin} sd, "
        "fresh incumbent seeds after a keep; greedy: one run, kept when it beats the best run so far; "
        "bootstrap-3: three seeds against the incumbent's three stored ones, kept when the 95 % "
        "percentile bootstrap interval of the paired Δ is above 0. Mean per night ± Monte-Carlo "
        "standard error; false keeps: candidates with Δ ≤ 0 kept; FDP: false keeps / keeps (0 "
        "without keeps; its mean is the FDR); gains kept: share of the Δ > 0 candidates kept; seeds: "
        "trials trained; final quality: the last incumbent's true quality (seed sd units, start 0), "
        "beside the best possible (every gain kept, nothing else).\n\n"
        f"{_markdown(table)}\n"
    )


if __name__ == "__main__":
    main()

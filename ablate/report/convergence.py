"""Convergence warnings: a variant whose training had not settled when it stopped, from the trial
rows (``best_epoch``, ``epochs``) and the validation curves.

Two signs, either one flags the variant:

- best epoch at the cap: for some seed the best validation epoch (the state the test metrics come
  from) is the last epoch trained. Early stopping ends a trial only after ``patience`` evaluations
  without improvement, so this means the trial ran into ``train.epochs`` while still improving.
- still improving: the validation primary metric, averaged over the variant's seeds that trained as
  long as the study's longest trial, improved at each of its last :data:`RISING` evaluations. A run of
  strict improvements rather than a fitted slope: a slope over the last epochs is positive for a
  curve that has flattened with noise around a slow drift, while three steps in a row in the mean of
  the seeds are unlikely once it is flat. A seed that stopped before another trial of the study did
  was stopped by early stopping (its patience ran out below the epoch cap): it settled, and its
  curve, cut where it stopped, must not make the others' mean look unfinished.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ablate.stats import ReportSettings

# Evaluations in a row, each better than the one before (higher, or lower for a lower-is-better
# metric), that flag a curve as still improving.
RISING = 3


@dataclass(frozen=True)
class NotConverged:
    """One variant's signs of unfinished training."""

    variant: str
    at_cap: dict[int, int]  # seed → its epochs trained, for the seeds whose best epoch is the last
    rising: bool  # the validation primary metric improved at each of its last RISING evaluations

    def line(self, metric: str) -> str:
        """'gelu-mlp (seeds 0, 2: best epoch = last epoch 8 of 8)'."""
        signs = []
        if self.at_cap:
            seeds = ", ".join(map(str, self.at_cap))
            label = "seed" if len(self.at_cap) == 1 else "seeds"
            epochs = set(self.at_cap.values())
            if len(epochs) == 1:
                (n,) = epochs
                signs.append(f"{label} {seeds}: best epoch = last epoch {n} of {n}")
            else:
                each = ", ".join(f"{n} for seed {s}" for s, n in self.at_cap.items())
                signs.append(f"{label} {seeds}: best epoch = last epoch ({each})")
        if self.rising:
            signs.append(
                f"validation {metric} (mean over seeds) still improving at each of the last "
                f"{RISING} evaluations"
            )
        return f"{self.variant} ({'; '.join(signs)})"


def _at_cap(results: pd.DataFrame, variant: str) -> dict[int, int]:
    if not {"best_epoch", "epochs"} <= set(results.columns):
        return {}
    rows = results[results["variant"].astype(str) == variant]
    best = pd.to_numeric(rows["best_epoch"], errors="coerce")
    last = pd.to_numeric(rows["epochs"], errors="coerce")
    hit = (best == last) & (last > 0)
    return {int(s): int(n) for s, n in sorted(zip(rows["seed"][hit], last[hit], strict=True))}


def validation_curve(
    curves: pd.DataFrame | None, settings: ReportSettings, variant: str, seeds: set[int] | None = None
) -> pd.Series:
    """The validation primary metric per evaluated epoch, mean over the variant's seeds (those in
    ``seeds`` when given), at the epochs every one of them evaluated (empty: no curve logged)."""
    if curves is None or curves.empty:
        return pd.Series(dtype=float)
    names = {settings.primary, f"valid.{settings.primary}"}
    c = curves[(curves["variant"].astype(str) == variant) & curves["metric"].astype(str).isin(names)]
    if seeds is not None:
        c = c[pd.to_numeric(c["seed"], errors="coerce").isin(seeds)]
    if c.empty:
        return pd.Series(dtype=float)
    grid = c.assign(value=pd.to_numeric(c["value"], errors="coerce")).pivot_table(
        index="epoch", columns="seed", values="value", aggfunc="last"
    )
    return grid.dropna().mean(axis=1).sort_index()


def _longest_seeds(results: pd.DataFrame, variant: str) -> set[int] | None:
    """The variant's seeds that trained as many epochs as the study's longest trial (None: epochs
    not recorded, every seed counts); the others were stopped early."""
    if "epochs" not in results.columns:
        return None
    epochs = pd.to_numeric(results["epochs"], errors="coerce")
    if epochs.isna().all():
        return None
    rows = (results["variant"].astype(str) == variant) & (epochs == epochs.max())
    return {int(s) for s in results["seed"][rows]}


def _rising(curve: pd.Series, higher: bool) -> bool:
    if len(curve) < RISING + 1:
        return False
    steps = np.diff(curve.to_numpy(float)[-(RISING + 1) :])
    return bool(np.all(steps > 0) if higher else np.all(steps < 0))


def not_converged(
    results: pd.DataFrame, curves: pd.DataFrame | None, settings: ReportSettings, names: list[str]
) -> list[NotConverged]:
    """The variants (in ``names`` order) with either sign of unfinished training."""
    higher = settings.higher(settings.primary)
    found = []
    for v in names:
        seeds = _longest_seeds(results, v)
        rising = seeds != set() and _rising(validation_curve(curves, settings, v, seeds), higher)
        flag = NotConverged(v, _at_cap(results, v), rising)
        if flag.at_cap or flag.rising:
            found.append(flag)
    return found


def warning_lines(flags: list[NotConverged], settings: ReportSettings) -> list[str]:
    """The lines shown under the results table, one per flagged variant."""
    return [f"not converged: {f.line(settings.primary)}" for f in flags]


def method_text(flags: list[NotConverged], settings: ReportSettings, has_curves: bool) -> str:
    """How convergence was judged, and what a flag means for the verdicts."""
    text = (
        "A variant is flagged not converged when, for any of its seeds, the best validation epoch (the "
        "state its test metrics come from) is the last epoch trained — early stopping ends a trial only "
        "after `patience` evaluations without improvement, so the trial ran into `train.epochs` while "
        f"still improving — or when its validation {settings.primary}, averaged over its seeds that "
        f"trained as long as the study's longest trial, was better at each of its last {RISING} "
        "evaluations than at the one before (a run of improvements rather than a fitted slope, which "
        "stays positive on a flat but noisy curve; a seed that stopped sooner was stopped by early "
        "stopping, so it settled)."
    )
    if not has_curves:
        text += " No validation curves were logged: only the best epoch was checked."
    if not flags:
        return text + " No variant was flagged."
    return text + (
        f" Flagged: {', '.join(f.variant for f in flags)}. Their verdicts compare models that more "
        "epochs would still change; raise `train.epochs` (early stopping with `train.patience` ends a "
        "trial once it settles) and run the study again before reading them as final."
    )

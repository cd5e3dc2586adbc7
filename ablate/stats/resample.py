"""The evaluation sample as a source of variance: per seed, a bootstrap resample of the test units.

Every trial is evaluated on the same test units (users, windows, rows), so the spread of a metric
across seeds leaves out the noise of having drawn these units and not others. With
``report.resample_units: true`` each seed's test metric becomes its mean over a bootstrap
resample of the units drawn with that seed — the same resample for every variant at that seed,
so the comparisons stay paired — and the seed-to-seed spread carries the evaluation sample's
variance as well (Bouthillier et al. 2021).

Only a metric whose recorded test value is the mean of its per-unit values can be resampled this
way; any other (an RMSE: the root of a mean) is left as it was, and the report's note names it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import pandas as pd

from ablate.stats.settings import ReportSettings


def _draw(units: pd.Series, seed: int) -> pd.Series:
    """How many times each of ``units`` (sorted, distinct) is drawn by the bootstrap of ``seed``."""
    ids = np.sort(units.unique())
    rng = np.random.default_rng(seed % 2**32)
    counts = np.bincount(rng.integers(0, len(ids), size=len(ids)), minlength=len(ids))
    return pd.Series(counts, index=ids)


def unit_mean_metrics(results: pd.DataFrame, units: pd.DataFrame | None, metrics: Iterable[str]) -> list[str]:
    """The ``metrics`` whose every trial's test value is the mean of its units' values."""
    if units is None or units.empty:
        return []
    means = units.groupby(["variant", "seed"]).mean(numeric_only=True)
    keyed = results.set_index(["variant", "seed"])
    found = []
    for metric in metrics:
        column = f"test.{metric}"
        if metric not in means.columns or column not in keyed.columns:
            continue
        recorded, unit_mean = keyed[column].align(means[metric], join="inner")
        if len(recorded) and all(
            math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9) for a, b in zip(recorded, unit_mean, strict=True)
        ):
            found.append(metric)
    return found


def resample_units(results: pd.DataFrame, units: pd.DataFrame | None, metrics: Iterable[str]) -> pd.DataFrame:
    """``results`` with each trial's ``test.<metric>`` replaced by its mean over the bootstrap
    resample of the test units drawn with the trial's seed (the same draw for every variant at
    that seed), for the ``metrics`` that are means over units (:func:`unit_mean_metrics`).
    Trials without per-unit values keep their values."""
    out = results.copy()
    resampled = unit_mean_metrics(results, units, metrics)
    if not resampled:
        return out
    for seed, at_seed in units.groupby("seed"):
        counts = _draw(at_seed["unit"], int(seed))
        for variant, trial in at_seed.groupby("variant"):
            rows = (out["variant"] == variant) & (out["seed"] == seed)
            weights = counts.reindex(trial["unit"]).to_numpy(dtype=float)
            for metric in resampled:
                values = trial[metric].to_numpy(dtype=float)
                out.loc[rows, f"test.{metric}"] = float(np.sum(weights * values) / np.sum(weights))
    return out


def crossed_metrics(results: pd.DataFrame, units: pd.DataFrame | None, settings: ReportSettings) -> list[str]:
    """The metrics whose verdicts read seeds crossed with the test units (``report.variance:
    seeds_and_units``, :mod:`.crossed`): those whose every trial's test value is its units' mean,
    less a sequential study's primary metric (its looks decide on the seeds, as the driver did)."""
    if settings.variance != "seeds_and_units":
        return []
    found = unit_mean_metrics(results, units, settings.metrics)
    return [m for m in found if settings.sequential is None or m != settings.primary]


def _variance_note(results: pd.DataFrame, units: pd.DataFrame | None, settings: ReportSettings) -> str:
    """The question the verdicts' intervals answer, in the report's words."""
    if settings.variance != "seeds_and_units":
        return (
            "variance: seeds only — the intervals answer whether a difference shows again on "
            "retraining, evaluated on these test units (report.variance: seeds_and_units adds the "
            "test units' variance)"
        )
    crossed = crossed_metrics(results, units, settings)
    left = [m for m in settings.metrics if m not in crossed]
    note = (
        f"variance: seeds crossed with the test units for {', '.join(crossed)} — the intervals answer "
        "whether a difference shows again on retraining and on new test units like these (a two-way "
        "random-effects model of seed, unit and their interaction, Satterthwaite's degrees of freedom, "
        "read with the seeds-only t-test: each interval the wider of the two, so never narrower)"
        if crossed
        else "variance: seeds only (no per-unit values that the test metrics are means of)"
    )
    if crossed and left:
        note += f"; seeds only for {', '.join(left)} (not a mean over units, or the sequential primary)"
    return note


def resampled_for_report(
    results: pd.DataFrame, units: pd.DataFrame | None, settings: ReportSettings
) -> tuple[pd.DataFrame, ReportSettings]:
    """What the report compares: ``results`` as they are, or with ``report.resample_units`` each
    seed's test metrics over its resample of the units, with a note in the settings saying which
    variance the intervals carry (``report.variance``, or the bootstrap's)."""
    if not settings.resample_units:
        notes = [*settings.notes, _variance_note(results, units, settings)]
        return results, settings.model_copy(update={"notes": notes})
    metrics = unit_mean_metrics(results, units, settings.metrics)
    left = [m for m in settings.metrics if m not in metrics]
    note = (
        f"evaluation sample: each seed's test {', '.join(metrics)} is its mean over a bootstrap "
        "resample of the test units drawn with that seed (the same for every variant), so the "
        "seeds' spread includes the evaluation sample's"
        if metrics
        else "evaluation sample: not resampled (no per-unit values that the test metrics are means of)"
    )
    if metrics and left:
        note += f"; not resampled (not a mean over units): {', '.join(left)}"
    notes = [*settings.notes, note]
    return resample_units(results, units, metrics), settings.model_copy(update={"notes": notes})

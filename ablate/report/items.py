"""Verdicts from evaluation logs, item by item (``ablate compare --items``): the per-unit scores
(:mod:`.item_logs`) checked for matching item sets, each model against the baseline by the paired
test the data call for (:mod:`ablate.stats.items`), the rows of the report ablate writes for its
own studies replaced by those verdicts, and ``items.csv`` beside it: which test and why, the units'
agreement (0/1 scores), the variance split between seeds and units, the items a plan needs."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from ablate.errors import AblateError, warn
from ablate.report import analyse, format_table, render
from ablate.report.foreign import Compared, higher_is_better, margin_option, margin_refused
from ablate.report.item_logs import FROM, first_few, read_items
from ablate.stats import ReportSettings, comparison_frame
from ablate.stats.comparison import Standing, _verdict_columns
from ablate.stats.corrections import adjust_pvalues
from ablate.stats.items import ITEM_TESTS, ItemTest, decide_items, design_for, item_test


def matched(frame: pd.DataFrame, baseline: str, partial: bool) -> tuple[pd.DataFrame, list[str]]:
    """The units every model has, for the seeds every model has; a duplicated unit, or (without
    ``partial``) a unit or seed some model lacks or adds, is one error naming the file and the
    items. With ``partial``: the lines saying what is compared."""
    duplicated = frame[frame.duplicated(["variant", "seed", "unit"], keep=False)]
    if len(duplicated):
        where = duplicated.drop_duplicates(["variant", "seed", "unit"])
        source = where["_source"].iloc[0]
        raise AblateError(
            f"{source}: {len(where)} item(s) appear more than once for {where['variant'].iloc[0]!r}: "
            f"{first_few(where['unit'])} (first at {where[FROM].iloc[0]})"
        )
    for given in ("cluster", "weight"):  # a unit's own, whichever model's row says it
        if given in frame and (many := frame.groupby(["seed", "unit"])[given].nunique()).max() > 1:
            units = [u for (_, u), n in many.items() if n > 1]
            raise AblateError(
                f"{len(units)} unit(s) with a different {given} in different models' rows: {first_few(units)}"
            )
    models = list(dict.fromkeys(frame["variant"]))
    if baseline not in models:
        raise AblateError(f"--baseline {baseline}: no such model in the logs; models: {', '.join(models)}")
    said = []
    keys = frame.groupby("variant").apply(lambda g: set(zip(g["seed"], g["unit"], strict=True)))
    for level in ("seed", "unit"):
        own = frame.groupby("variant")[level].agg(lambda col: set(col))
        for model in models:
            lacks, adds = (
                sorted(own[baseline] - own[model], key=str),
                sorted(own[model] - own[baseline], key=str),
            )
            if not (lacks or adds):
                continue
            source = frame.loc[frame["variant"] == model, "_source"].iloc[0]
            parts = [f"lacks {len(lacks)} {level}(s) the baseline has ({first_few(lacks)})"] if lacks else []
            parts += [f"has {len(adds)} {level}(s) the baseline lacks ({first_few(adds)})"] if adds else []
            line = f"{source}: {model!r} {' and '.join(parts)}"
            if not partial:
                raise AblateError(f"{line}; --partial compares the {level}s every model has")
            said.append(line)
    shared = set.intersection(*keys.to_list())
    if said:
        kept = frame[[k in shared for k in zip(frame["seed"], frame["unit"], strict=True)]]
        units = kept["unit"].nunique()
        said.append(
            f"--partial: compared on the {units} units every model has ({len(shared)} (seed, unit) pairs)"
        )
        frame = kept
    return frame, said


VARIANCE_NOTE = (
    "variance: the units' — with one seed the intervals answer whether a difference shows again on "
    "new items like these, for these trained models; with several seeds, on retraining and on new "
    "items (seeds crossed with the units)"
)


def _results(units: pd.DataFrame, metric: str) -> pd.DataFrame:
    """One row per (model, seed): its units' (weighted) mean, as the report reads runs."""
    weights = units["weight"] if "weight" in units else pd.Series(1.0, index=units.index)
    rows = units.assign(w=weights.astype(float), wx=units["score"] * weights.astype(float))
    means = rows.groupby(["variant", "seed"], sort=False)[["wx", "w"]].sum()
    out = (means["wx"] / means["w"]).rename(f"test.{metric}").reset_index()
    return out.assign(differs="")


def item_lines(tests: dict[str, ItemTest | None], baseline: str) -> list[str]:
    """The Methods' lines: per model the test and why, the agreement and the variance split."""
    lines = []
    for model, t in tests.items():
        if t is None:
            lines.append(f"{model} vs {baseline}: fewer than 3 shared units (or clusters), not tested")
            continue
        line = f"{model} vs {baseline}: {ITEM_TESTS[t.test]} ({t.why})"
        if t.agreement:
            a = t.agreement
            line += (
                f"; agreement: both right {a['both right']}, both wrong {a['both wrong']}, "
                f"only {model} {a['only variant']}, only {baseline} {a['only base']}"
            )
        v = t.variance or {}
        if np.isfinite(v.get("seeds", np.nan)):
            total = v["seeds"] + v["units"] + v["rest"]
            shares = ", ".join(f"{k} {100 * v[k] / total:.0f} %" for k in ("seeds", "units", "rest"))
            line += f"; variance of a unit's difference: {shares}"
        elif np.isfinite(v.get("units", np.nan)):
            line += (
                f"; sd of a unit's difference {np.sqrt(v['units']):.3g} (one seed: the seeds' part unseen)"
            )
        lines.append(line)
    return lines


def compare_items(
    sources: list[str],
    metric: str,
    baseline: str,
    out_dir: Path,
    higher: bool | None = None,
    margin: str | None = None,
    partial: bool = False,
) -> Compared:
    """Read the logs, match their items, and write the report into ``out_dir``."""
    units, models, tests, results, analysis, rows, read = _judged(
        sources, metric, baseline, higher, margin, partial
    )
    # the seeds-only variance line the report adds is the seed test's; these verdicts say their own
    notes = [n for n in analysis.settings.notes if not n.startswith("variance: ")] + [VARIANCE_NOTE]
    settings = analysis.settings.model_copy(update={"notes": notes})
    analysis = replace(analysis, tables={**analysis.tables, metric: rows}, settings=settings)
    out_dir.mkdir(parents=True, exist_ok=True)
    results.to_csv(out_dir / "results.csv", index=False)
    details = _details(tests, rows, settings)
    details.to_csv(out_dir / "items.csv", index=False)
    meta = {
        "data_summary": {"sources": "; ".join(read), "units": units["unit"].nunique(), "baseline": baseline},
        "cost_note": "evaluations made outside ablate: no costs recorded",
    }
    paths = {"csv": out_dir / "results.csv", "items": out_dir / "items.csv"}
    paths |= render(analysis, out_dir, meta=meta)
    table = format_table(comparison_frame(rows), settings)
    n_seeds = units["seed"].nunique()
    grouping = (
        f"{len(models)} models, {units['unit'].nunique()} units, {n_seeds} seed(s); baseline {baseline}"
    )
    for plan in details.dropna(subset=["units_needed"]).itertuples():
        seeds = "" if pd.isna(plan.seeds_needed) else f", or {plan.seeds_needed:g} seeds at these units"
        grouping += (
            f"\nplan from this log: {plan.model} vs {baseline}: {plan.units_needed:g} units at "
            f"{plan.seeds} seed(s){seeds} for 80% power at Δ = ±{plan.margin:.3g}"
        )
    return Compared(paths, grouping, table)


def plan_items(
    sources: list[str],
    metric: str,
    baseline: str,
    higher: bool | None = None,
    margin: str | None = None,
    partial: bool = False,
) -> list[str]:
    """``ablate plan --items``: per model, what its comparison with the baseline needs for 80 %
    power at Δ = ±margin, these logs as the pilot — the units at their seeds, the seeds at their
    units (:func:`.items.design_for`)."""
    _, models, tests, _, analysis, rows, _ = _judged(sources, metric, baseline, higher, margin, partial)
    lines = [f"{len(models)} models against {baseline}, {metric}, at α = {analysis.settings.alpha:g}"]
    for plan in _details(tests, rows, analysis.settings).itertuples():
        if not plan.test:
            lines.append(f"{plan.model}: {plan.why}")
            continue
        units = f"{plan.units_needed:g} units"
        units = "no number of units is enough" if plan.units_needed == np.inf else units
        seeds = ""
        if not pd.isna(plan.seeds_needed):
            seeds = f", or {plan.seeds_needed:g} seeds at these {plan.units} units"
            seeds = ", and no number of seeds is enough" if plan.seeds_needed == np.inf else seeds
        lines.append(
            f"{plan.model}: {units} at {plan.seeds} seed(s){seeds} for 80% power at Δ = ±{plan.margin:.3g} "
            f"({plan.test}: {plan.why}; now Δ = {plan.delta:+.3g}, se {plan.se:.3g}, {plan.units} units)"
        )
    return lines


def _judged(sources, metric, baseline, higher, margin, partial):
    """The logs read, their items matched, each model's per-item test and verdict rows."""
    frame, read = read_items(sources, metric)
    units, said = matched(frame, baseline, partial)
    for line in said:
        warn(line)
    models = list(dict.fromkeys(units["variant"]))
    models = [baseline, *(m for m in models if m != baseline)]
    if len(models) < 2:
        raise AblateError(f"one model only ({baseline}): comparing needs at least two")
    tests = {m: item_test(units, m, baseline) for m in models[1:]}
    results = _results(units, metric)
    settings = _settings(tests, baseline, metric, models, higher, margin, read + said)
    analysis = analyse(results, None, None, settings)
    rows = _item_rows(analysis.tables[metric], tests, settings, metric)
    return units, models, tests, results, analysis, rows, read


def _settings(tests, baseline, metric, models, higher, margin, read) -> ReportSettings:
    notes = [*read, *item_lines(tests, baseline)]
    notes.append(
        "per-item verdicts: each row's verdict reads the per-item test named above (not the seeds' "
        "paired t of the Methods): its p at the family's decision level, its interval and TOST "
        "against the margin; n is the units (one seed) or the seeds (seeds crossed with units)"
    )
    try:
        return ReportSettings(
            study="items",
            baseline=baseline,
            primary=metric,
            metrics=[metric],
            higher_is_better={metric: higher_is_better(metric, higher)},
            variants=models,
            calibration=0,  # its simulated studies are of seeds, not of items
            notes=notes,
            **margin_option(margin),
        )
    except ValueError as exc:
        raise margin_refused(margin, exc) from None


def _item_rows(rows, tests: dict[str, ItemTest | None], settings: ReportSettings, metric: str):
    """The metric's rows (baseline first) with each model's verdict from its per-item test, the
    models corrected together."""
    base_mean = rows[0].mean
    margin = settings.margin_for(base_mean, metric)
    tested = {m: t for m, t in tests.items() if t is not None}
    decisions = decide_items(
        tested,
        settings.alpha,
        settings.correction,
        dict.fromkeys(tested, margin),
        settings.higher(metric),
        settings.equivalence,
    )
    adjusted = dict(
        zip(tested, adjust_pvalues([t.p for t in tested.values()], settings.correction), strict=True)
    )
    out = [rows[0]]
    for row in rows[1:]:
        t = tests.get(row.variant)
        if t is None:
            out.append(
                replace(row, verdict=None, significant=False, note="fewer than 3 shared units (or clusters)")
            )
            continue
        note = f"{ITEM_TESTS[t.test].split(':')[0]} ({t.why})"
        columns = _verdict_columns(Standing(decisions[row.variant], note), base_mean)
        extra = {"n_units": t.units, "p_seeds_adj": float(adjusted[row.variant]), "n_paired": t.seeds}
        extra["seeds_for_margin"] = None  # the seeds' plan would be the seed test's: items.csv has this one's
        out.append(replace(row, **columns, **extra, sd_diff=np.sqrt(t.variance["units"])))
    return out


def _details(tests: dict[str, ItemTest | None], rows, settings: ReportSettings) -> pd.DataFrame:
    """items.csv: per model its test, why, the agreement, the variance split and what a plan needs
    for 80 % power at Δ = ±margin at α / m (:func:`.items.design_for`, this log as the pilot): the
    units at these seeds, the seeds at these units."""
    verdicts = {r.variant: r for r in rows[1:]}
    family = max(1, sum(t is not None for t in tests.values()))
    records = []
    for model, t in tests.items():
        if t is None:
            records.append({"model": model, "test": "", "why": "fewer than 3 shared units (or clusters)"})
            continue
        row = verdicts[model]
        need = design_for(t, row.margin, settings.alpha / family)
        records.append(
            {
                "model": model,
                "baseline": settings.baseline,
                "test": t.test,
                "why": t.why,
                "verdict": str(row.verdict or ""),
                "delta": t.delta,
                "se": t.se,
                "df": t.df,
                "p": t.p,
                "p_adj": row.p_seeds_adj,
                "ci_low": row.ci_low,
                "ci_high": row.ci_high,
                "margin": row.margin,
                "units": t.units,
                "seeds": t.seeds,
                **{f"agree.{k}": v for k, v in (t.agreement or {}).items()},
                **{f"var.{k}": v for k, v in (t.variance or {}).items()},
                "sd_unit": t.sd_unit,
                **need,
            }
        )
    return pd.DataFrame(records)

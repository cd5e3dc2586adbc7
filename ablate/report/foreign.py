"""Verdicts for runs ablate did not make (``ablate compare``, :mod:`.compare`).

Runs come from an MLflow experiment (a local store or a server), a CSV of runs (one row per run:
parameter and metric columns, as Weights & Biases exports them) or a folder of result files (one
JSON or YAML mapping per run, nested keys joined with dots). They are grouped into variants by
their parameters less the seed, and the groups go through the report ablate writes for its own
studies (:func:`ablate.report.analyse` and :func:`~ablate.report.render`): verdicts, intervals,
MDD, factorial effects when the groups form a grid over two or more keys.

Runs paired by seed (every variant shares at least 3 seeds with the baseline) are compared as
ablate compares its trials. Otherwise each variant is compared with the baseline unpaired, by
Welch's t-test: its estimate, standard error and Welch–Satterthwaite degrees of freedom decide the
verdict through :func:`ablate.stats.verdicts.decide_estimate` (the same intervals, TOST, MDD, and
the family's correction over the variants), and the report says so in each row and in Methods.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
from pydantic import ValidationError
from scipy import stats as scipy_stats

from ablate.errors import AblateError, warn
from ablate.report import analyse, format_table, render
from ablate.report.foreign_runs import metric_values, read_runs
from ablate.stats import ReportSettings, comparison_frame
from ablate.stats.comparison import Standing, _verdict_columns
from ablate.stats.corrections import adjust_pvalues
from ablate.stats.verdicts import (
    MIN_SEEDS_VERDICT,
    decide_estimate,
    decision_levels,
    equivalence_levels,
    tost_p,
)

# Metric names whose direction ablate's own tasks already know (a ``@k`` suffix aside): the
# tabular, forecast and seqrec tasks' metrics, and the common names of losses and errors.
KNOWN_DIRECTIONS = {
    **dict.fromkeys(("ndcg", "hr", "mrr", "recall", "precision", "accuracy", "acc", "auc", "f1"), True),
    **dict.fromkeys(("mse", "mae", "rmse", "mape", "smape", "loss", "error", "perplexity"), False),
}
# Columns a tracker's export adds to every run that are not parameters (W&B's CSV, MLflow's runs).
BOOKKEEPING = frozenset(
    {"name", "id", "run", "run_id", "state", "status", "notes", "user", "tags", "created", "runtime"}
    | {"sweep", "hostname", "gpu type", "gpu count", "start_time", "end_time", "experiment_id"}
)


def column(runs: pd.DataFrame, name: str, what: str) -> str:
    """The column ``name`` names: itself, or the one column whose last dotted or slashed part it
    is (``acc`` for ``metrics.acc`` or ``summary/acc``)."""
    if name in runs.columns:
        return name
    found = [c for c in runs.columns if str(c).replace("/", ".").rsplit(".", 1)[-1] == name]
    if len(found) == 1:
        return found[0]
    columns = ", ".join(map(str, runs.columns))
    many = f" (it ends {len(found)} columns: {', '.join(found)})" if found else ""
    raise AblateError(f"{what} {name}: no such column{many}; columns: {columns}")


def higher_is_better(metric: str, given: bool | None) -> bool:
    if given is not None:
        return given
    known = KNOWN_DIRECTIONS.get(metric.lower().split("@")[0].rsplit("_", 1)[-1])
    if known is None:
        raise AblateError(
            f"--metric {metric}: its direction is not known; give --higher-is-better or --lower-is-better"
        )
    return known


@dataclass(frozen=True)
class Groups:
    """Runs grouped into variants: ``results`` as the report reads them (``variant``, ``seed``,
    ``differs``, ``param.<key>``, ``test.<metric>``, ``run``)."""

    results: pd.DataFrame
    keys: list[str]  # the parameters that tell the groups apart
    baseline: str
    grid: dict[str, list[str]]  # key → levels (the baseline's first) when the groups fill a grid
    paired: bool
    why_unpaired: str = ""


def group_runs(
    runs: pd.DataFrame,
    metrics: list[str],
    baseline: str,
    group_by: list[str],
    seed_key: str,
    unpaired: bool = False,
) -> Groups:
    """Group ``runs`` by ``group_by`` (default: every column less the seed, the metrics, a
    tracker's bookkeeping and columns with a different value in every run), name each group by its
    keys (``lr=0.1,depth=2``) and pick the baseline (a group's name, or ``key=value`` pairs
    selecting one group)."""
    if runs.empty:
        raise AblateError("no runs to compare")
    seed_col = column(runs, seed_key, "--seed-key")
    metric_cols = {m: column(runs, m, "--metric") for m in metrics}
    seeds = pd.to_numeric(runs[seed_col], errors="coerce")
    if seeds.isna().any():
        warn(f"{int(seeds.isna().sum())} run(s) without a numeric {seed_col} left out")
        runs, seeds = runs[seeds.notna()], seeds[seeds.notna()]
    if group_by:
        keys = [column(runs, k, "--group-by") for k in group_by]
        if seed_col in keys:
            raise AblateError(
                f"--group-by {seed_col}: that is the seed column; runs are grouped over the seeds"
            )
    else:
        taken = {seed_col, *metric_cols.values()}
        keys = [
            c
            for c in runs.columns
            if c not in taken
            and str(c).lower() not in BOOKKEEPING
            and not str(c).startswith("_")  # W&B's _step, _runtime, _timestamp
            and runs[c].nunique(dropna=False) < len(runs)
        ]
    keys = [k for k in keys if runs[k].nunique(dropna=False) > 1]
    if not keys:
        raise AblateError(
            "every run has the same parameters, so there is one group; --group-by names the keys "
            "that tell the variants apart"
        )
    labels = runs[keys].astype(str)
    names = labels.apply(lambda row: ",".join(f"{k}={v}" for k, v in row.items()), axis=1)
    found = list(dict.fromkeys(names))
    if len(found) < 2:
        raise AblateError(f"one group only ({found[0]}): comparing needs at least two")
    base = _baseline(baseline, found, labels, names)
    results = pd.DataFrame(
        {
            "variant": names,
            "seed": seeds.astype(int) if (seeds % 1 == 0).all() else seeds,
            "differs": [_differs(labels.loc[i], labels[names == base].iloc[0]) for i in labels.index],
            **{f"param.{k}": runs[k] for k in keys},
            **{f"test.{m}": metric_values(runs, c, f"--metric {m}") for m, c in metric_cols.items()},
            **({"run": runs["run_id"]} if "run_id" in runs else {}),  # MLflow's run id
        }
    ).reset_index(drop=True)
    paired, why = _pairing(results, base, unpaired)
    _say_seed_problems(results, base, paired)
    return Groups(results, keys, base, _grid(keys, labels, base, names), paired, why)


def _baseline(given: str, found: list[str], labels: pd.DataFrame, names: pd.Series) -> str:
    if given in found:
        return given
    wanted = dict(part.split("=", 1) for part in given.split(",") if "=" in part)
    if wanted and all(k in labels.columns for k in wanted):
        hits = sorted(
            {
                n
                for n, (_, row) in zip(names, labels.iterrows(), strict=True)
                if all(row[k] == v for k, v in wanted.items())
            }
        )
        if len(hits) == 1:
            return hits[0]
        if hits:
            raise AblateError(f"--baseline {given} selects {len(hits)} groups ({', '.join(hits)}); name one")
    raise AblateError(
        f"--baseline {given}: no group is called or selected by that; groups: {', '.join(found)}"
    )


def _differs(row: pd.Series, base: pd.Series) -> str:
    changed = [f"{k}={v}" for k, v in row.items() if v != base[k]]
    return ", ".join(changed) if changed else "baseline"


def _grid(keys: list[str], labels: pd.DataFrame, base: str, names: pd.Series) -> dict[str, list[str]]:
    """Each key's levels, the baseline's first, when every combination of them has runs."""
    if len(keys) < 2:
        return {}
    base_row = labels[names == base].iloc[0]
    levels = {k: [base_row[k], *sorted(set(labels[k]) - {base_row[k]}, key=_natural)] for k in keys}
    return levels if names.nunique() == math.prod(len(v) for v in levels.values()) else {}


def _natural(text: str):
    try:
        return (0, float(text), "")
    except ValueError:
        return (1, 0.0, text)


def _pairing(results: pd.DataFrame, base: str, unpaired: bool) -> tuple[bool, str]:
    if unpaired:
        return False, "--unpaired"
    seeds = results.groupby("variant")["seed"].agg(set)
    for variant, own in seeds.items():
        shared = len(own & seeds[base])
        if variant != base and shared < MIN_SEEDS_VERDICT:
            return False, f"{variant} shares {shared} of its {len(own)} seeds with the baseline"
    return True, ""


def _say_seed_problems(results: pd.DataFrame, base: str, paired: bool) -> None:
    """A warning per variant with two runs of one seed, or (paired) a seed the baseline has and
    it lacks, or the other way round."""
    counts = results.groupby(["variant", "seed"]).size()
    for (variant, seed), n in counts[counts > 1].items():
        warn(f"{variant}: {n} runs with seed {seed}; their mean is that seed's value")
    if not paired:
        return
    seeds = results.groupby("variant")["seed"].agg(set)
    for variant, own in seeds.items():
        missing, extra = sorted(seeds[base] - own), sorted(own - seeds[base])
        if variant != base and (missing or extra):
            lacks = (
                f"no run with seed(s) {', '.join(map(str, missing))} that the baseline has" if missing else ""
            )
            more = f"seed(s) {', '.join(map(str, extra))} that the baseline lacks" if extra else ""
            said = "; ".join(s for s in (lacks, more) if s)
            warn(f"{variant}: {said}; compared on the {len(own & seeds[base])} seeds both have")


def unpaired_rows(rows, results: pd.DataFrame, settings: ReportSettings, metric: str):
    """``rows`` (one metric's :class:`~ablate.stats.ComparisonRow`, baseline first, as the paired
    comparison left them) with each variant compared with the baseline by Welch's t-test, the
    variants corrected together as a family."""
    col = f"test.{metric}"
    per_seed = results.groupby(["variant", "seed"])[col].mean().dropna()  # a seed's runs: one value
    values = {v: per_seed[v].to_numpy(float) for v in per_seed.index.get_level_values(0).unique()}
    base = values.get(settings.baseline, np.empty(0))
    base_mean = float(base.mean()) if len(base) else float("nan")
    margin = settings.margin_for(base_mean)
    estimates = {}
    for row in rows[1:]:
        own = values.get(row.variant, np.empty(0))
        if min(len(own), len(base)) >= MIN_SEEDS_VERDICT:
            test = scipy_stats.ttest_ind(own, base, equal_var=False)
            se = math.sqrt(own.var(ddof=1) / len(own) + base.var(ddof=1) / len(base))
            estimates[row.variant] = (float(own.mean() - base_mean), se, float(test.df), len(own), len(base))
    names = list(estimates)
    p = np.array(
        [
            2.0 * scipy_stats.t.sf(abs(d) / se, df) if se > 0 else float(d != 0)
            for d, se, df, *_ in estimates.values()
        ]
    )
    levels = decision_levels(p, settings.alpha, settings.correction)
    p_tost = np.array([tost_p(d, se, df, margin) for d, se, df, *_ in estimates.values()])
    eq_levels = equivalence_levels(p_tost, settings.alpha, settings.correction, settings.equivalence)
    adjusted = dict(zip(names, adjust_pvalues(p, settings.correction), strict=True))
    out = [rows[0]]
    for row in rows[1:]:
        blank = {"n_paired": 0, "sd_diff": np.nan, "boot_low": np.nan, "boot_high": np.nan}
        blank |= {"p_seeds_wilcoxon": np.nan, "d_seeds": np.nan, "delta": np.nan, "rel_change": np.nan}
        if row.variant not in estimates:
            need = f"unpaired: a verdict needs ≥ {MIN_SEEDS_VERDICT} seeds in each group"
            out.append(replace(row, **blank, verdict=None, significant=False, note=need, p_seeds=np.nan))
            continue
        delta, se, df, n_own, n_base = estimates[row.variant]
        i = names.index(row.variant)
        decision = decide_estimate(
            delta, se, df, levels[i], margin, settings.higher(metric), min(n_own, n_base), eq_levels[i]
        )
        note = f"unpaired: Welch's t-test, {n_own} and {n_base} seeds, {df:.1f} df"
        columns = _verdict_columns(Standing(decision, note), base_mean)
        out.append(replace(row, **(blank | columns), p_seeds_adj=float(adjusted[row.variant])))
    return out


UNPAIRED_NOTE = (
    "runs not paired by seed ({why}): each variant is compared with the baseline unpaired, by "
    "Welch's t-test on the two groups' seeds (Welch–Satterthwaite degrees of freedom), where the "
    "text above says paired t; its interval, TOST, MDD and correction are read as for paired seeds, "
    "with 'seeds that would decide it' counted per group"
)


@dataclass(frozen=True)
class Compared:
    paths: dict[str, Path]  # the report's files, as write_report names them
    grouping: str  # one line: the keys, the groups, paired or not, the baseline
    table: str  # the primary metric's comparison table (Markdown), as `ablate report` prints it


def compare_runs(
    source: str,
    metrics: list[str],
    baseline: str,
    out_dir: Path,
    experiment: str | None = None,
    group_by: list[str] | None = None,
    seed_key: str = "seed",
    higher: bool | None = None,
    margin: str | None = None,
    unpaired: bool = False,
) -> Compared:
    """Read the runs, group them, and write the report into ``out_dir``."""
    if not metrics:
        raise AblateError("--metric names the metric to compare (repeatable; the first is primary)")
    runs = read_runs(source, experiment)
    groups = group_runs(runs, metrics, baseline, group_by or [], seed_key, unpaired)
    settings = _settings(groups, experiment or Path(source).stem, metrics, higher, margin)
    how = "paired by seed" if groups.paired else f"unpaired ({groups.why_unpaired})"
    grouping = f"grouped by {', '.join(groups.keys)}: {len(settings.variants)} groups, {how}"
    analysis = analyse(groups.results, None, None, settings)
    if not groups.paired:
        tables = {m: unpaired_rows(rows, groups.results, settings, m) for m, rows in analysis.tables.items()}
        analysis = replace(analysis, tables=tables)
    out_dir.mkdir(parents=True, exist_ok=True)
    groups.results.to_csv(out_dir / "results.csv", index=False)
    summary = {"source": source, "experiment": experiment, "runs": len(groups.results)}
    summary |= {"grouped by": ", ".join(groups.keys), "seeds": how, "baseline": groups.baseline}
    meta = {
        "data_summary": {k: v for k, v in summary.items() if v is not None},
        "cost_note": "runs made outside ablate: no costs recorded",
    }
    paths = {"csv": out_dir / "results.csv"} | render(analysis, out_dir, meta=meta)
    table = format_table(comparison_frame(analysis.tables[settings.primary]), settings)
    return Compared(paths, f"{grouping}; baseline {groups.baseline}", table)


def _settings(
    groups: Groups, study: str, metrics: list[str], higher: bool | None, margin: str | None
) -> ReportSettings:
    notes = [] if groups.paired else [UNPAIRED_NOTE.format(why=groups.why_unpaired)]
    if groups.grid and not groups.paired:  # the factorial model blocks on seeds shared by the cells
        notes.append(
            f"the groups form a grid over {', '.join(groups.grid)}, but its factorial analysis "
            "needs every cell's runs to share their seeds: none here"
        )
    try:
        return ReportSettings(
            study=study,
            baseline=groups.baseline,
            primary=metrics[0],
            metrics=metrics,
            higher_is_better={m: higher_is_better(m, higher) for m in metrics},
            variants=list(dict.fromkeys(groups.results["variant"])),
            grid=groups.grid if groups.paired else {},
            calibration=200 if groups.paired else 0,  # its simulated studies have paired seeds
            notes=notes,
            **margin_option(margin),
        )
    except ValueError as exc:
        raise margin_refused(margin, exc) from None


def margin_option(margin: str | None) -> dict:
    """``--margin`` as the report settings take it: a number in the metric's units, or "2%"."""
    return {"margin": float(margin) if _is_number(margin) else margin} if margin else {}


def margin_refused(margin: str | None, exc: ValueError) -> AblateError:
    """A ``--margin`` the settings refused, in one line: pydantic's message without its web address."""
    said = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else str(exc).splitlines()[0]
    return AblateError(f"--margin {margin}: {said}")


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True

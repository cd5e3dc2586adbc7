"""Each variant against the baseline on one metric: its verdict (better / worse / equivalent /
inconclusive, from the paired t interval at its decision level, :mod:`.verdicts`), the paired
seed tests, the bootstrap interval, the per-unit tests, and the multiple-comparison correction over
the variants (see the package docstring for the formulas)."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from ablate.errors import AblateError
from ablate.stats.corrections import adjust_pvalues
from ablate.stats.crossed import crossed_estimate, crossed_table
from ablate.stats.intervals import bootstrap_ci
from ablate.stats.paired import _per_unit, paired, per_seed, seed_tests, unit_tests
from ablate.stats.power import seeds_for_difference
from ablate.stats.resample import crossed_metrics
from ablate.stats.sequential import decide_sequential
from ablate.stats.verdicts import MIN_SEEDS_VERDICT, Decision, Verdict, decide_family

if TYPE_CHECKING:
    from ablate.stats.settings import ReportSettings

NAN = float("nan")


@dataclass(frozen=True)
class ComparisonRow:
    """One variant against the baseline on one metric: the columns of comparisons.csv, in order.
    The baseline's own row has its mean and sd and no comparison (NaN, no verdict)."""

    metric: str
    variant: str
    differs: str
    n_seeds: int
    mean: float
    sd: float
    n_paired: int = 0
    delta: float = NAN
    rel_change: float = NAN
    sd_diff: float = NAN
    # a sequential primary metric: the median-unbiased Δ after stopping (``delta`` is the naive
    # mean over the seeds of the deciding look, biased away from 0 by stopping early)
    delta_adjusted: float = NAN
    # its interval by the same ordering, at 1 − the comparison's share of α (the t interval
    # ci_low, ci_high is the one the look's verdict read, at its nominal level)
    adjusted_low: float = NAN
    adjusted_high: float = NAN
    # the verdict and the numbers it reads (stats.verdicts.Decision); None: not tested (``note``)
    verdict: Verdict | None = None
    significant: bool = False
    negligible: bool = False
    n_verdict: int | None = None
    level: float = NAN
    ci_low: float = NAN
    ci_high: float = NAN
    margin: float = NAN
    # the equivalence test (TOST) the verdict reads: its level per side (the family's correction
    # over the TOST p-values, or α per comparison), its 1 − 2·level interval, its raw p
    eq_level: float = NAN
    eq_low: float = NAN
    eq_high: float = NAN
    p_equivalence: float = NAN
    mdd: float = NAN
    # inconclusive: the seeds per variant a fixed-seed study needs for 80 % power at Δ = ±margin,
    # the paired t-test at α/m, with this comparison's sd(d) (``ablate plan --sd``'s figure): a plan
    # for a new study, not the seeds to add to this one (None: no spread, or beyond 10,000)
    seeds_for_margin: int | None = None
    p_seeds: float = NAN
    p_seeds_adj: float = NAN
    exploratory: bool = False
    note: str = ""
    # beside the verdict, not deciding it
    boot_low: float = NAN
    boot_high: float = NAN
    p_seeds_wilcoxon: float = NAN
    d_seeds: float = NAN
    n_units: int = 0
    p_units: float = NAN
    p_units_adj: float = NAN
    p_better_units: float = NAN
    rank_biserial: float = NAN


COLUMNS = [f.name for f in fields(ComparisonRow)]


def variants_in_order(results: pd.DataFrame, baseline: str) -> list[str]:
    """The variants with results, baseline first, the rest as they first appear."""
    names = list(dict.fromkeys(results["variant"].astype(str)))
    if baseline not in names:
        raise AblateError(
            f"report.baseline: baseline variant {baseline!r} has no results; "
            f"variants with results: {', '.join(names) or 'none'}"
        )
    return [baseline] + [v for v in names if v != baseline]


def _differs(results: pd.DataFrame, variant: str) -> str:
    if "differs" not in results.columns:
        return ""
    vals = results.loc[results["variant"].astype(str) == variant, "differs"].dropna()
    return str(vals.iloc[0]) if len(vals) else ""


@dataclass(frozen=True)
class Standing:
    """One comparison's verdict, or why it has none (``decision`` None: not tested, or in a
    sequential study waiting for its look's seeds). ``note`` says which, or how a sequential
    comparison stopped; ``sequential``: decided by the sequential rule (no fixed-n adjusted p)."""

    decision: Decision | None
    note: str = ""
    sequential: bool = False


def family_verdicts(
    x: pd.DataFrame,
    settings: ReportSettings,
    metric: str,
    variants: list[str],
    per_unit: pd.DataFrame | None = None,
) -> dict[str, Standing]:
    """Each of ``variants`` against the baseline on ``metric``, from the seed × variant table ``x``.

    The family, corrected together (:func:`.verdicts.decide_family`), is every variant with ≥ 3
    paired seeds that is not configured exactly like another (``settings.duplicates``: it trains
    the same models, so its comparison says nothing). The margin is ``settings.margin_for`` the
    baseline's mean over the paired seeds. The primary metric of a sequential study is decided
    look by look (:func:`.sequential.decide_sequential`), which keeps its error rates; every other
    metric, and every metric of a fixed-seed study, at all paired seeds: with ``per_unit`` (the
    (seed, unit) × variant table of a metric that is its units' mean, ``report.variance:
    seeds_and_units``) on the seeds crossed with the test units (:mod:`.crossed`)."""
    base, higher = settings.baseline, settings.higher(metric)
    out: dict[str, Standing] = {}
    candidates = []
    for v in variants:
        if v in settings.duplicates:
            out[v] = Standing(None, f"configured exactly like {settings.duplicates[v]}: not tested")
        else:
            candidates.append(v)
    if settings.sequential is not None and metric == settings.primary:
        design, margin_of = settings.sequential, settings.margin_for
        standing = decide_sequential(
            x,
            base,
            candidates,
            design,
            settings.alpha,
            settings.correction,
            margin_of,
            higher,
            settings.equivalence,
        )
        for v in candidates:
            s = standing.get(v)
            decision = None if s is None else s.decision
            if decision is not None and s.closed:
                low, high = s.adjusted_interval(design)
                decision = replace(
                    decision, delta_adjusted=s.adjusted(design), adjusted_low=low, adjusted_high=high
                )
            out[v] = Standing(decision, "" if s is None else s.reason, True)
        return {v: out[v] for v in variants}
    diffs, margins = {}, {}
    for v in candidates:
        value, base_value = paired(x, v, base)
        if len(value) < MIN_SEEDS_VERDICT:
            k = len(value)
            needs = f"a verdict needs ≥ {MIN_SEEDS_VERDICT}"
            out[v] = Standing(None, f"{k} paired seed{'' if k == 1 else 's'}: {needs}")
        else:
            crossed = crossed_estimate(crossed_table(per_unit, v, base)) if per_unit is not None else None
            diffs[v] = value - base_value if crossed is None else crossed
            margins[v] = settings.margin_for(float(np.mean(base_value)), metric)
    decided = decide_family(diffs, settings.alpha, settings.correction, margins, higher, settings.equivalence)
    out |= {v: Standing(d) for v, d in decided.items()}
    return {v: out[v] for v in variants}


def comparisons(
    results: pd.DataFrame, units: pd.DataFrame | None, settings: ReportSettings, metric: str
) -> list[ComparisonRow]:
    """One row per variant (baseline first) comparing it with the baseline on ``metric``.

    ``verdict`` is better / worse / equivalent / inconclusive, None when not tested (``note`` says
    why); ``ci_low``, ``ci_high`` the paired t interval at the decision ``level`` that the verdict
    reads; ``significant`` = better or worse; ``p_seeds_adj`` the corrected t-test p over the family
    (< α exactly when the interval excludes 0; NaN for a sequential primary metric, whose verdict is
    ``p_seeds`` < ``level`` at its look). ``exploratory``: a secondary metric (its own family, not
    corrected across metrics). ``boot_low``, ``boot_high``: the bootstrap interval
    (``settings.ci``), for comparison only. Too few paired seeds give NaN, never a made-up number.
    """
    names = variants_in_order(results, settings.baseline)
    x, per_unit = per_seed(results, metric), _per_unit(units, metric)
    higher = settings.higher(metric)
    crossed = per_unit if metric in crossed_metrics(results, units, settings) else None
    standings = family_verdicts(x, settings, metric, names[1:], crossed)
    rows = []
    for v in names:
        col = x[v].to_numpy(float) if v in x.columns else np.empty(0)
        col = col[np.isfinite(col)]
        row = {
            "metric": metric,
            "variant": v,
            "differs": _differs(results, v),
            "n_seeds": len(col),
            "mean": float(col.mean()) if len(col) else np.nan,
            "sd": float(col.std(ddof=1)) if len(col) > 1 else np.nan,
            "exploratory": metric != settings.primary,
        }
        if v != settings.baseline:
            row.update(_against_base(x, per_unit, settings, v, higher))
            row.update(_verdict_columns(standings[v], row.pop("base_mean")))
        rows.append(ComparisonRow(**row))
    base, rest = rows[0], _with_seeds_for_margin(rows[1:], settings.alpha)
    # the families: the comparisons with a fixed-n verdict; the unit tests of the same variants
    tested = [r.verdict is not None and not standings[r.variant].sequential for r in rest]
    seeds_p = [r.p_seeds if t else np.nan for r, t in zip(rest, tested, strict=True)]
    units_p = [np.nan if r.variant in settings.duplicates else r.p_units for r in rest]
    seeds_adj = adjust_pvalues(seeds_p, settings.correction)
    units_adj = adjust_pvalues(units_p, settings.correction)
    adjusted = [
        replace(r, p_seeds_adj=a, p_units_adj=u) for r, a, u in zip(rest, seeds_adj, units_adj, strict=True)
    ]
    return [base, *adjusted]


def _with_seeds_for_margin(rows: list[ComparisonRow], alpha: float) -> list[ComparisonRow]:
    """Each inconclusive row with its :attr:`ComparisonRow.seeds_for_margin`, m the family's
    tested comparisons."""
    family = sum(r.verdict is not None for r in rows)
    return [
        replace(r, seeds_for_margin=seeds_for_difference(r.margin, r.sd_diff, alpha / family))
        if r.verdict is Verdict.INCONCLUSIVE
        else r
        for r in rows
    ]


def comparison_frame(rows: list[ComparisonRow]) -> pd.DataFrame:
    """The rows as comparisons.csv holds them: :data:`COLUMNS`, the verdict as its word ('' when
    not tested)."""
    records = [{c: getattr(r, c) for c in COLUMNS} | {"verdict": str(r.verdict or "")} for r in rows]
    out = pd.DataFrame(records, columns=COLUMNS)
    for c in ("n_seeds", "n_paired", "n_units"):
        out[c] = out[c].astype(int)
    for c in ("n_verdict", "seeds_for_margin"):
        out[c] = out[c].astype("Int64")
    for c in ("significant", "negligible", "exploratory"):
        out[c] = out[c].astype(bool)
    return out


def comparison_rows(frame: pd.DataFrame) -> list[ComparisonRow]:
    """A :func:`compare` frame (or comparisons.csv read back) as typed rows."""
    rows = []
    # comparisons.csv of an older version lacks the later columns: NaN (not computed)
    for record in frame.reindex(columns=COLUMNS).to_dict("records"):
        for c in ("n_verdict", "seeds_for_margin"):
            record[c] = None if pd.isna(record[c]) else int(record[c])
        record["verdict"] = (
            Verdict(record["verdict"]) if isinstance(record["verdict"], str) and record["verdict"] else None
        )
        record["differs"] = "" if pd.isna(record["differs"]) else str(record["differs"])
        record["note"] = "" if pd.isna(record["note"]) else str(record["note"])
        rows.append(ComparisonRow(**record))
    return rows


def compare(
    results: pd.DataFrame, units: pd.DataFrame | None, settings: ReportSettings, metric: str
) -> pd.DataFrame:
    """:func:`comparisons` as a frame (:func:`comparison_frame`): the columns of comparisons.csv."""
    return comparison_frame(comparisons(results, units, settings, metric))


def _verdict_columns(standing: Standing, base_mean: float) -> dict:
    """The verdict's columns of one comparison; ``p_seeds`` becomes the p the verdict reads."""
    d = standing.decision
    if d is None:
        return {"note": standing.note, "significant": False}
    with np.errstate(all="ignore"):
        rel = d.delta / base_mean if base_mean else np.nan
    return {
        "verdict": d.verdict,
        "significant": d.verdict in (Verdict.BETTER, Verdict.WORSE),
        "negligible": d.negligible,
        "n_verdict": d.n,
        "delta": d.delta,  # in a sequential study: over the seeds of the deciding look
        "delta_adjusted": d.delta_adjusted,
        "adjusted_low": d.adjusted_low,
        "adjusted_high": d.adjusted_high,
        "rel_change": rel,
        "level": d.level,
        "ci_low": d.ci_low,
        "ci_high": d.ci_high,
        "margin": d.margin,
        "eq_level": d.eq_level,
        "eq_low": d.eq_low,
        "eq_high": d.eq_high,
        "p_equivalence": d.p_equivalence,
        "mdd": d.mdd,
        "p_seeds": d.p,
        "note": standing.note,
    }


def _against_base(
    x: pd.DataFrame, per_unit: pd.DataFrame | None, settings: ReportSettings, variant: str, higher: bool
) -> dict:
    v, base = paired(x, variant, settings.baseline)
    d = v - base
    delta = float(d.mean()) if len(d) else np.nan
    base_mean = float(base.mean()) if len(base) else np.nan
    with np.errstate(all="ignore"):
        rel = delta / base_mean if base_mean else np.nan
    low, high = bootstrap_ci(d, settings.bootstrap, settings.seed, settings.confidence, settings.ci)
    uv, ub = paired(per_unit, variant, settings.baseline)
    return {
        "n_paired": len(d),
        "base_mean": base_mean,  # over the paired seeds; not a column
        "delta": delta,
        "rel_change": rel,
        "sd_diff": float(d.std(ddof=1)) if len(d) > 1 else np.nan,
        "boot_low": low,
        "boot_high": high,
        **seed_tests(d),
        **unit_tests(uv - ub, higher),
    }

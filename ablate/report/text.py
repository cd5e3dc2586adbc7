"""The report's running text on ranking: the Friedman and pairwise paragraphs, and where the rank
test and the pairwise t-tests disagree, why. (The verdicts' text — opening lines, settings,
calibration — is in :mod:`.verdicts`.)"""

from __future__ import annotations

import math

import pandas as pd

from ablate.report.cells import number, p_is
from ablate.stats import MIN_SEEDS_TEST, ReportSettings


def _friedman_p(fr: dict) -> str:
    """Which p-value the Friedman paragraph shows, and how it was computed."""
    if fr["method"] == "exact":
        ties = "; tied values as mid-ranks" if fr["ties"] else ""
        return (
            f"exact {p_is(fr['p'])} (the statistic's distribution over every seed's equally likely "
            f"orderings of the variants{ties})"
        )
    df1, df2 = fr["df"]
    return (
        f"Iman–Davenport F({df1}, {df2}) = {fr['f']:.2f}, {p_is(fr['p'])} (too many variants × seeds "
        "for the exact distribution here; the F form is closer to it than the χ² approximation)"
    )


def friedman_text(fr: dict | None, settings: ReportSettings, n_variants: int) -> str:
    if fr is None:
        return (
            f"Friedman test: not available ({n_variants} variant{'s' if n_variants != 1 else ''}; "
            "needs ≥ 3 variants and ≥ 3 seeds where every variant finished)."
        )
    ranks = ", ".join(f"{v} {r:.2f}" for v, r in fr["ranks"].items())
    if fr["cd_note"] is not None:
        nemenyi = fr["cd_note"]
    else:
        apart = "; ".join(f"{a} ahead of {b}" for a, b in fr["separated"]) or "no pair"
        nemenyi = (
            f"Nemenyi critical difference at α = {settings.alpha:g}: {fr['cd']:.2f} mean ranks; "
            f"it separates {apart}."
        )
    return (
        f"Friedman test on test {settings.primary} over {fr['n_variants']} variants × "
        f"{fr['n_seeds']} seeds: χ²_F = {fr['statistic']:.2f}, {_friedman_p(fr)}. "
        f"Mean ranks (1 = best): {ranks}. The blocks are the seeds of this one data set (Demšar's "
        "diagram ranks over data sets): a rank difference says the order holds from one training seed "
        f"to the next here. {nemenyi}"
    )


def _pairs(found: set[frozenset], fr: dict) -> str:
    """Pairs named better-ranked first, in rank order."""
    order = list(fr["ranks"])
    named = [sorted(p, key=order.index) for p in found]
    return "; ".join(f"{a} from {b}" for a, b in sorted(named, key=lambda p: (order.index(p[0]), p[1])))


def _agreement(pairs: pd.DataFrame, fr: dict | None, settings: ReportSettings) -> str:
    """Where the rank test and the pairwise t-tests disagree, and why (empty: nothing to compare)."""
    if fr is None or not pairs["p"].notna().any():
        return ""
    t_pairs = {frozenset((r.a, r.b)) for r in pairs[pairs["significant"]].itertuples()}
    t_pairs = {p for p in t_pairs if p <= set(fr["ranks"])}
    if fr["cd_note"] is None:
        rank_pairs = {frozenset(p) for p in fr["separated"]}
        t_only, rank_only = t_pairs - rank_pairs, rank_pairs - t_pairs
        lines = []
        if t_only:
            lines.append(
                f"The t-tests separate {_pairs(t_only, fr)}, the rank test cannot: ranks keep only each "
                "seed's order, not how far apart the variants are (neighbours in every seed differ by "
                "one rank however large and steady their gap), and the critical difference covers all "
                "pairs at once."
            )
        if rank_only:
            lines.append(
                f"The rank test separates {_pairs(rank_only, fr)}, the t-tests do not: the order holds "
                "across seeds but the size of the gap varies from seed to seed, which widens the t "
                "interval (ranks count only who is ahead)."
            )
        return " ".join(lines) or (
            "The rank test and the t-tests agree on which pairs differ."
            if t_pairs
            else "Neither the rank test nor the t-tests separate any pair."
        )
    rejects = fr["p"] < settings.alpha
    floor = ""
    if fr["method"] == "exact" and not fr["ties"]:
        smallest = math.factorial(fr["n_variants"]) ** (1 - fr["n_seeds"])  # every seed in one order
        floor = (
            f" (with {fr['n_variants']} variants and {fr['n_seeds']} seeds the exact test cannot go "
            f"below p = {smallest:.3g})"
        )
    if t_pairs and not rejects:
        return (
            f"The t-tests separate {len(t_pairs)} pair{'s' if len(t_pairs) != 1 else ''} while the Friedman "
            f"test does not reject: ranks keep only each seed's order, not how far apart the variants "
            f"are, and over {fr['n_seeds']} seeds they have little resolution{floor}."
        )
    if rejects and not t_pairs:
        return (
            "The Friedman test rejects while the t-tests separate no pair: it asks only whether the "
            "variants' order holds across seeds, not which pair differs, and the pairwise family is "
            f"corrected over {int(pairs['p'].notna().sum())} pairs."
        )
    return "The Friedman test and the t-tests agree" + (
        f" (it rejects; they separate {len(t_pairs)} pair{'s' if len(t_pairs) != 1 else ''})."
        if rejects
        else " (neither finds a difference)."
    )


def pairwise_text(pairs: pd.DataFrame, settings: ReportSettings, fr: dict | None = None) -> str:
    """The all-pairs paragraph; with the Friedman result ``fr``, how the two tests agree."""
    corr = settings.correction_method.label
    tested = int(pairs["p"].notna().sum())
    sig = pairs[pairs["significant"]]
    found = (
        "none"
        if sig.empty
        else "; ".join(f"{r.b} − {r.a} = {number(r.delta, True)} ({p_is(r.p_adj)})" for r in sig.itertuples())
    )
    text = (
        f"All pairs on test {settings.primary}: paired t-test across the seeds both variants have, "
        f"{corr} over the family of {tested} pair{'s' if tested != 1 else ''} with a test "
        f"({len(pairs) - tested} n/a: < {MIN_SEEDS_TEST} paired seeds); a separate family from "
        f"the comparisons with {settings.baseline}. Significant at α = {settings.alpha:g}: {found}."
    )
    agreement = _agreement(pairs, fr, settings)
    return f"{text} {agreement}" if agreement else text

"""Statistics of an ablation study: every variant against the baseline, per metric.

Inputs (one study):

- ``results``: one row per finished trial; ``variant``, ``seed``, ``differs``, ``test.<metric>``
  (and ``valid.<metric>``) columns, cost columns. Unknown columns are ignored here.
- ``units``: per evaluation unit (user, window, row) on the test split; ``variant``, ``seed``,
  ``unit`` and one column per metric. May be empty.

Notation: ``k`` paired seeds, ``d_s = x_variant(s) - x_base(s)`` the paired difference of seed
``s``; ``u`` a (seed, unit) pair present for both variant and base, ``e_u`` its difference.

- delta = mean_s d_s; rel_change = delta / mean_s x_base(s) (over the same paired seeds)
- verdict (:mod:`.verdicts`): better / worse / equivalent / inconclusive from one interval,
  ci_low, ci_high = delta ± t_{1−a/2, k−1} sd(d)/√k at the comparison's decision level a (the
  level at which its t-test rejects exactly when the family's correction does); mdd = the |Δ|
  that t-test detects with 80 % power; margin = ``ReportSettings.margin_for(baseline mean)``
- boot_low, boot_high: smoothed studentized bootstrap (bootstrap-t) of mean_s d_s, resampling
  seeds, fixed RNG; plain bootstrap-t and percentile are options (``ReportSettings.ci``). See
  ``bootstrap_ci``. Beside the verdict, not deciding it.
- p_seeds: paired t-test on d_s (the verdict's); p_seeds_wilcoxon: Wilcoxon signed-rank on d_s
- p_units: Wilcoxon signed-rank on e_u, pooled over seeds
- d_seeds = mean(d) / sd(d) (paired Cohen's d, = t / sqrt(k))
- rank_biserial = (R+ - R-) / (R+ + R-), R± the Wilcoxon rank sums of the positive / negative e_u
- p_better_units = mean_u [better(e_u)] + 0.5 [e_u = 0]  (P(variant beats base on a unit))

Signs: ``delta``, ``rel_change``, the intervals, ``d_seeds`` and ``rank_biserial`` follow variant − base
as written. Only ``p_better_units`` and the verdict (and the report's ▲/▼ marks) follow the metric's direction
(``ReportSettings.higher_is_better``), so for a lower-is-better metric a negative delta is good.

Families for the multiple-comparison correction:

- vs. baseline (``compare``): every non-baseline variant with ≥ 3 paired seeds that is not a
  duplicate of another, for one metric and one test (seeds or units); metrics are not corrected
  together (the secondary ones are exploratory). The primary metric of a sequential study is
  decided look by look (:mod:`.sequential`);
- all pairs (``pairwise``): every pair of variants with a p-value, on one metric.

Units pooled over seeds: the unit test treats the (seed, unit) pairs as exchangeable. It answers
"do these trained models differ on these units", conditional on the trained models; it does not
see seed-to-seed variation of training, so it is not a replication test (``tests/test_calibration``
measures how far it over-rejects when trained models vary). The verdicts therefore read the seed
test only.

Calibration (``calibrate``): A/A, boundary (true Δ = ± margin) and planted-effect studies of a
given shape pushed through the verdict code itself, measuring the false better / worse and false
equivalence rates, the power and the decision interval's coverage that the report states.

Modules: :mod:`.settings` (what the report compares and how), :mod:`.intervals` (bootstrap CIs),
:mod:`.corrections` (multiple comparisons), :mod:`.verdicts` (one comparison's verdict),
:mod:`.sequential` (seeds added look by look), :mod:`.comparison` (each variant against the
baseline), :mod:`.ranking` (Friedman, all pairs), :mod:`.calibration` (simulated error rates).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

# Each public name → the module that defines it. Imported on first use: the study-file schema
# needs only ``settings`` (numpy), and scipy would add ~0.85 s to every ``ablate validate``.
_HOMES = {
    "calibration": ("calibrate", "min_detectable_d"),
    "comparison": (
        "COLUMNS",
        "MIN_SEEDS_TEST",
        "Standing",
        "compare",
        "family_verdicts",
        "seed_tests",
        "unit_tests",
    ),
    "corrections": ("CORRECTIONS", "Correction", "adjust_pvalues"),
    "factorial": ("Factorial",),  # the function is ablate.stats.factorial.factorial (a module of that name)
    "intervals": ("CI_METHODS", "MIN_SEEDS_CI", "IntervalMethod", "bootstrap_ci", "min_seeds_ci"),
    "ranking": ("PAIRWISE_COLUMNS", "friedman", "pairwise", "pairwise_matrix"),
    "settings": ("STUDY_FILE_KEYS", "ReportSection", "ReportSettings"),
    "verdicts": ("Decision", "Verdict", "decide", "decide_family", "minimum_detectable"),
}
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}

if TYPE_CHECKING:  # pragma: no cover
    from .calibration import calibrate, min_detectable_d
    from .comparison import (
        COLUMNS,
        MIN_SEEDS_TEST,
        Standing,
        compare,
        family_verdicts,
        seed_tests,
        unit_tests,
    )
    from .corrections import CORRECTIONS, Correction, adjust_pvalues
    from .factorial import Factorial
    from .intervals import CI_METHODS, MIN_SEEDS_CI, IntervalMethod, bootstrap_ci, min_seeds_ci
    from .ranking import PAIRWISE_COLUMNS, friedman, pairwise, pairwise_matrix
    from .settings import STUDY_FILE_KEYS, ReportSection, ReportSettings
    from .verdicts import Decision, Verdict, decide, decide_family, minimum_detectable


def __getattr__(name: str):
    if name not in _HOME_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_HOME_OF[name]}", __name__), name)


__all__ = [
    "CI_METHODS",
    "COLUMNS",
    "CORRECTIONS",
    "MIN_SEEDS_CI",
    "MIN_SEEDS_TEST",
    "PAIRWISE_COLUMNS",
    "STUDY_FILE_KEYS",
    "Correction",
    "Decision",
    "Factorial",
    "IntervalMethod",
    "ReportSection",
    "ReportSettings",
    "Standing",
    "Verdict",
    "adjust_pvalues",
    "bootstrap_ci",
    "calibrate",
    "compare",
    "decide",
    "decide_family",
    "family_verdicts",
    "friedman",
    "min_detectable_d",
    "min_seeds_ci",
    "minimum_detectable",
    "pairwise",
    "pairwise_matrix",
    "seed_tests",
    "unit_tests",
]

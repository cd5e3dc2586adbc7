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
:mod:`.sequential` (seeds added look by look), :mod:`.boundaries` (their group-sequential
boundaries), :mod:`.comparison` (each variant against the
baseline), :mod:`.ranking` (Friedman, all pairs), :mod:`.calibration` (simulated error rates),
:mod:`.spending` (the α-spending functions), :mod:`.power` and :mod:`.planned` (what ``ablate
plan`` promises: power, a pilot's uncertain sd, equivalence simulated through the verdicts),
:mod:`.across` (verdicts across data sets), :mod:`.items` (paired tests over evaluation
items), :mod:`.ladder` (the trend over a ladder of model sizes). The lowest package: it imports the
foundations only (``schema``, ``errors``, ``stopping``), nothing of studies, models or stores.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path
from typing import TYPE_CHECKING

# The public names, each listed once, in these imports: type checkers read them, and at run time
# each name's module is read from them (:data:`_HOME_OF`) and imported on first use, since the
# study-file schema needs only ``settings`` and scipy would add ~0.85 s to every ``ablate validate``.
if TYPE_CHECKING:  # pragma: no cover
    from ablate.stats.calibration import calibrate, min_detectable_d  # noqa: F401
    from ablate.stats.comparison import (  # noqa: F401
        COLUMNS,
        ComparisonRow,
        Standing,
        compare,
        comparison_frame,
        comparison_rows,
        comparisons,
        family_verdicts,
    )
    from ablate.stats.corrections import CORRECTIONS, EQUIVALENCE, Correction, adjust_pvalues  # noqa: F401

    # the function is ablate.stats.factorial.factorial (a module of that name)
    from ablate.stats.factorial import Factorial  # noqa: F401
    from ablate.stats.intervals import CI_METHODS, MIN_SEEDS_CI, IntervalMethod, bootstrap_ci, min_seeds_ci  # noqa: F401
    from ablate.stats.paired import (  # noqa: F401
        MIN_SEEDS_TEST,
        seed_tests,
        unit_tests,
    )
    from ablate.stats.ranking import PAIRWISE_COLUMNS, friedman, pairwise, pairwise_matrix  # noqa: F401
    from ablate.stats.settings import STUDY_FILE_KEYS, ReportSection, ReportSettings  # noqa: F401
    from ablate.stats.verdicts import Decision, Verdict, decide, decide_family, minimum_detectable  # noqa: F401


def _homes() -> dict[str, str]:
    """Each name the ``TYPE_CHECKING`` imports above bring in → its module, read from this file."""
    tree = ast.parse(Path(__file__).read_text(encoding="utf-8"))
    block = next(n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING")
    imports = [node for node in block.body if isinstance(node, ast.ImportFrom)]
    return {alias.name: str(node.module) for node in imports for alias in node.names}


_HOME_OF = _homes()
__all__ = sorted(_HOME_OF)


def __getattr__(name: str):
    if name not in _HOME_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_HOME_OF[name]), name)

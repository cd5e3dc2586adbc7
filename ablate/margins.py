"""Each metric's default practical margin, and what a margin is checked against: the one place
both are defined (tasks, study reports and ``ablate compare`` read them here).

A margin in the form ``report.margin`` takes: ``"2%"`` of the baseline's mean, ``"2% of error"`` of
its distance to a perfect score (1 − mean where higher is better). Accuracy-like scores (a share
of right answers, an AUC) take the second: their mean sits near 1, where 2 % of it is wider than
most gaps between models (±.019 at .96 accuracy, 46 % of the error). Every other metric takes
2 % of its mean.

A margin is only meaningful next to how far the baseline is from doing nothing or from doing
everything right: where no trivial baseline's row shows the first (``ablate compare``, a task
without baselines), :func:`wide_margin` says when a margin exceeds :data:`WIDE_SHARE` of the
second where the metric's name fixes it (an accuracy-like score's error, 1 − mean)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from ablate.schema import Vocabulary

# A margin wider than this share of the baseline's distance from its trivial value is flagged.
WIDE_SHARE = 0.25


@dataclass(frozen=True)
class MetricFamily:
    """Metrics named alike: their default margin and, where the name alone fixes it, how far a
    baseline's mean is from doing nothing (``None``: unknown without the task)."""

    names: re.Pattern[str]
    margin: str
    distance: Callable[[float], tuple[float, str]] | None = None


def _error(mean: float) -> tuple[float, str]:
    return abs(1.0 - mean), "its error (1 − mean)"


# Checked in this order; the last matches every name.
METRIC_FAMILIES: Vocabulary[MetricFamily] = Vocabulary(
    "metric family",
    {
        "accuracy-like": MetricFamily(
            re.compile(r"(?:^|[^a-z])(?:acc|accuracy|auc|roc_auc|auroc|f1)(?:[^a-z]|$)", re.IGNORECASE),
            "2% of error",
            _error,
        ),
        "any other": MetricFamily(re.compile(r""), "2%"),
    },
)


def family_of(metric: str) -> str:
    return next(name for name, family in METRIC_FAMILIES.items() if family.names.search(metric))


def default_margin(metric: str) -> str:
    """``metric``'s practical margin when neither the study file nor the task sets one."""
    return METRIC_FAMILIES[family_of(metric)].margin


def wide_margin(metric: str, margin: float, baseline_mean: float) -> tuple[float, str] | None:
    """``(distance, what it is)`` when ``margin`` (in the metric's units) is wider than
    :data:`WIDE_SHARE` of the baseline's distance the metric family measures (accuracy-like: its
    error); None when it is not, or the family knows no such distance."""
    reference = METRIC_FAMILIES[family_of(metric)].distance
    if reference is None:
        return None
    distance, words = reference(baseline_mean)
    return (distance, words) if margin > WIDE_SHARE * distance else None

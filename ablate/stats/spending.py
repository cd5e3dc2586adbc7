"""Lan–DeMets α-spending functions (Jennison & Turnbull 2000, § 7.2): the share of α a
group-sequential design has spent by information fraction t. The vocabulary of
``seeds.spending``, read by the design (:mod:`.sequential`) and its boundaries (:mod:`.boundaries`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from statistics import NormalDist

from ablate.schema import Vocabulary

_NORMAL = NormalDist()

SPENDING: Vocabulary[Callable[[float, float], float]] = Vocabulary(
    "alpha-spending function",
    {
        "pocock": lambda t, alpha: alpha * math.log(1.0 + (math.e - 1.0) * t),
        "obrien_fleming": lambda t, alpha: (
            0.0 if t <= 0 else 2.0 - 2.0 * _NORMAL.cdf(_NORMAL.inv_cdf(1.0 - alpha / 2.0) / math.sqrt(t))
        ),
    },
)

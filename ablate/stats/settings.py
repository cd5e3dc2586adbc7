"""What the report compares and how: one settings type from the study file's ``report:``
section, through the MLflow tag ``ablate.report_settings``, to the statistics and the report.

A study file sets only :data:`STUDY_FILE_KEYS`; the study fills in the rest
(``Study.report_settings``), and the whole is stored as JSON with the study, so a report can be
rebuilt from the tracking store alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import (
    Field,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    field_validator,
    model_validator,
)

from ablate.margins import default_margin
from ablate.schema import Bare, Strict, Vocabulary
from ablate.stats.corrections import CORRECTIONS, EQUIVALENCE, Correction
from ablate.stats.crossed import VARIANCE
from ablate.stats.intervals import CI_METHODS, IntervalMethod
from ablate.stats.sequential import SequentialDecision, SequentialSeeds, decide_sequential


@dataclass(frozen=True)
class Scale:
    """What a rung's size is: a per-trial column of the results (the baseline's mean over its
    seeds), and its name in the report and the figure."""

    column: str
    label: str


# ``ladder.scale``: parameters for a ladder of widths and depths; compute (training FLOPs, counted by
# torch per step: ablate.training.flops) for one over tokens or epochs, where every rung has the
# same parameters, or both tied.
LADDER_SCALES: Vocabulary[Scale] = Vocabulary(
    "ladder scale",
    {"parameters": Scale("params", "parameters"), "compute": Scale("train_gflop", "training GFLOP")},
)


if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

# A relative margin ("P%", "P% of error") is a share of the baseline variant's mean, or of its
# error: the distance to a perfect score (1 − mean where higher is better, as for accuracy or a hit
# rate; the mean itself where lower is better).
OF_ERROR = " of error"
MARGIN_FORMS = "an absolute margin > 0 (e.g. 0.005) or a relative one ('2%' of the mean, '2% of error')"


def parse_margin(text: str) -> tuple[float, str]:
    """``"2%"`` → ``(0.02, "mean")``, ``"2% of error"`` → ``(0.02, "error")``; ValueError otherwise."""
    text = " ".join(text.split())
    body, share = (text.removesuffix(OF_ERROR), "error") if text.endswith(OF_ERROR) else (text, "mean")
    try:
        number = float(body.removesuffix("%"))
    except ValueError:
        number = float("nan")
    if not body.endswith("%") or not math.isfinite(number) or number <= 0:
        raise ValueError(f"expected {MARGIN_FORMS}, got {text!r}")
    return number / 100.0, share


def checked_margin(value: float | str) -> float | str:
    """A margin as written in a study file or a task's metric definitions, checked."""
    if isinstance(value, str):
        parse_margin(value)
        return " ".join(value.split())
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"a margin must be > 0, got {value!r}")
    return value


class StudyFileSettings(Strict):
    """The report settings a study file's ``report:`` section sets (:data:`STUDY_FILE_KEYS`):
    ``margin``, the practical margin the verdicts judge equivalence against; ``ci`` the bootstrap
    interval listed beside the verdict's t interval in comparisons.csv (see ``bootstrap_ci``);
    ``calibration`` the number of simulated comparisons per scenario (A/A, at the margin) of the
    report's calibration section (0: none); ``equivalence`` how each comparison's equivalence
    (TOST) level is set (:data:`.corrections.EQUIVALENCE`)."""

    baseline: str = "base"
    alpha: float = Field(0.05, gt=0, lt=1)
    correction: CORRECTIONS.field = "holm"
    # The equivalence tests' level: the correction over the family's TOST p-values (the family's
    # false equivalence rate ≤ α), or α per comparison (each one's false equivalence rate ≤ α).
    equivalence: EQUIVALENCE.field = "family"
    bootstrap: int = Field(10_000, ge=100)
    # Bootstrap interval for Δ in comparisons.csv: smoothed studentized bootstrap (calibrated for
    # 3–5 seeds), plain, or percentile. The verdicts read the paired t interval, not this one.
    ci: CI_METHODS.field = "smoothed-bootstrap-t"
    # Comparisons simulated per scenario at report time for the calibration section (0: skip; a
    # sequential primary metric simulates a fifth as many: each study runs the design's looks).
    # 1,000: a family-wise rate's binomial margin ±2.6 points over 3-variant studies (200 gave
    # ±6.8, and a quickstart printed 9.0 % for a rate of 5 %); 2.7 s on a loaded 2-core machine.
    calibration: int = Field(1000, ge=0)
    # Practical margin of equivalence, for every metric: a number is absolute (in the metric's units),
    # "2%" is relative to the baseline's mean, "2% of error" to its error. Differences inside it are
    # too small to matter. None: each metric's own default (``margins``, else ablate.margins').
    margin: float | str | None = None
    # Each seed's test metrics over a bootstrap resample of the test units drawn with that seed
    # (stats.resample): the evaluation sample varies with the seed too.
    resample_units: bool = False
    # What the verdicts' intervals vary over (stats.crossed): the seeds (would it show again on
    # retraining?), or the seeds crossed with the test units (… and on new test units like these?).
    variance: VARIANCE.field = "seeds"

    @field_validator("margin")
    @classmethod
    def _margin(cls, value: float | str | None) -> float | str | None:
        return None if value is None else checked_margin(value)

    def combination_problem(self, sequential: bool) -> tuple[str, str] | None:
        """(key, problem) of options that cannot go together, given whether the seeds are
        sequential; None when they can."""
        if sequential and self.resample_units:
            # the driver stops on each trial's own test metric; resampled metrics would decide otherwise
            return "resample_units", (
                "cannot be combined with sequential seeds (seeds: {initial, max, step}): the driver "
                "decides where to add seeds on each trial's own test metric"
            )
        if self.resample_units and self.variance != "seeds":
            return "variance", (
                "cannot be combined with report.resample_units: both add the test units' variance "
                "(choose variance: seeds_and_units, the crossed estimate, or resample_units, the bootstrap)"
            )
        return None


STUDY_FILE_KEYS = tuple(StudyFileSettings.model_fields)


class ReportSettings(StudyFileSettings):
    """What the report compares and how: the study file's settings (:class:`StudyFileSettings`)
    and what the study fills in: ``study`` (its name); ``primary`` and ``metrics``, bare metric
    names (``ndcg@10``), primary first (prepended when missing); ``higher_is_better``, a metric's
    direction (default: higher is better); ``variants``; ``notes``, free-text lines shown in the
    report's settings paragraph ("device: cpu").
    """

    # -- filled in by the study
    study: str = ""
    primary: str = ""
    metrics: list[str] = []
    higher_is_better: dict[str, bool] | None = None
    variants: list[str] = []
    notes: list[str] = []
    # ``seeds: {initial, max, step}``: the sequential design the primary verdicts follow; None: fixed seeds.
    sequential: SequentialSeeds | None = None
    # variant → the variant it is configured exactly like (it trains the same models).
    duplicates: dict[str, str] = {}
    # ``grid:`` axis → levels, for the factorial analysis (stats.factorial); empty: no grid.
    grid: dict[str, list] = {}
    # metric → its default margin, used where the study file sets no ``margin`` (the task's for the
    # metric, Task.default_margin; None or a metric not named: ablate.margins.default_margin).
    margins: dict[str, float | str | None] = {}
    # -- fixed here: the bootstrap's RNG seed and the CIs' level
    seed: int = 0
    confidence: float = Field(0.95, gt=0, lt=1)

    @model_validator(mode="after")
    def _primary_first(self) -> ReportSettings:
        if self.primary:
            self.metrics = [self.primary] + [m for m in self.metrics if m != self.primary]
        return self

    @field_validator("margins")
    @classmethod
    def _margins(cls, value: dict[str, float | str | None]) -> dict[str, float | str]:
        return {metric: checked_margin(margin) for metric, margin in value.items() if margin is not None}

    def margin_of(self, metric: str | None = None) -> float | str:
        """The margin ``metric`` (default: the primary metric) is judged with, as written: the study
        file's, else the metric's default."""
        if self.margin is not None:
            return self.margin
        metric = metric or self.primary
        return self.margins.get(metric) or default_margin(metric)

    def margin_for(self, baseline_mean: float, metric: str | None = None) -> float:
        """The margin in the metric's units, given the baseline's mean (for a relative margin);
        ``metric`` defaults to the primary metric."""
        margin = self.margin_of(metric)
        if not isinstance(margin, str):
            return float(margin)
        share, of = parse_margin(margin)
        if of == "error" and self.higher(metric or self.primary):
            return abs(1.0 - baseline_mean) * share
        return abs(baseline_mean) * share

    def margin_words(self, metric: str | None = None) -> str:
        """How a relative margin is taken: "2% of base's mean", "2% of base's error (1 − mean)";
        "" for an absolute one."""
        margin = self.margin_of(metric)
        if not isinstance(margin, str):
            return ""
        share, of = parse_margin(margin)
        whose = f"{share * 100:g}% of {self.baseline}'s"
        if of == "mean":
            return f"{whose} mean"
        return f"{whose} error (1 − mean)" if self.higher(metric or self.primary) else f"{whose} mean"

    @classmethod
    def from_json(cls, text: str) -> ReportSettings:
        """Settings stored as JSON: ``model_dump_json``, or the plain mapping older versions wrote."""
        try:
            return cls.model_validate_json(text)
        except ValidationError as exc:
            raise Bare(None, {}).pydantic(exc, ("report",)) from None

    def higher(self, metric: str) -> bool:
        return (self.higher_is_better or {}).get(metric, True)

    @property
    def ci_method(self) -> IntervalMethod:
        return CI_METHODS[self.ci]

    @property
    def correction_method(self) -> Correction:
        return CORRECTIONS[self.correction]

    def sequential_standing(self, per_seed: pd.DataFrame) -> dict[str, SequentialDecision]:
        """:func:`decide_sequential` as these settings say: its design, α, correction, margin and
        the primary metric's direction, over the variants it tests (one configured exactly like another
        trains the same models and is left out, as from the report's family). The driver plans with
        this and the report shows it, so both read the same decisions."""
        tested = [v for v in self.variants if v != self.baseline and v not in self.duplicates]
        return decide_sequential(
            per_seed,
            self.baseline,
            tested,
            self.sequential,
            self.alpha,
            self.correction,
            self.margin_for,
            self.higher(self.primary),
            self.equivalence,
        )


def _study_file_section(data: Any, handler: ValidatorFunctionWrapHandler) -> ReportSettings:
    """A key the study fills in (``primary``, ``variants``, …) is as unknown in a study file as a
    misspelt one; problems come in pydantic's order (fields, then unknown keys as written)."""
    if not isinstance(data, dict):
        return handler(data)
    unknown = [k for k in data if k not in STUDY_FILE_KEYS]
    try:
        settings = handler({k: v for k, v in data.items() if k in STUDY_FILE_KEYS})
        problems = []
    except ValidationError as exc:
        problems = exc.errors()
    if not problems and not unknown:
        return settings
    extra = [{"type": "extra_forbidden", "loc": (k,), "input": data[k]} for k in unknown]
    raise ValidationError.from_exception_data("report", problems + extra)


# The type of a study file's ``report:`` section.
ReportSection = Annotated[ReportSettings, WrapValidator(_study_file_section)]

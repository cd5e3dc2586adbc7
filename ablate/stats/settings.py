"""What the report compares and how: one settings type from the study file's ``report:``
section, through the MLflow tag ``ablate.report_settings``, to the statistics and the report.

A study file sets only :data:`STUDY_FILE_KEYS`; the study fills in the rest
(``Study.report_settings``), and the whole is stored as JSON with the study, so a report can be
rebuilt from the tracking store alone.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, ValidationError, ValidatorFunctionWrapHandler, WrapValidator, model_validator

from ..schema import Strict
from ..studyfile import Bare
from .corrections import CORRECTIONS, Correction
from .intervals import CI_METHODS, IntervalMethod

STUDY_FILE_KEYS = ("baseline", "alpha", "correction", "bootstrap", "ci", "calibration")


class ReportSettings(Strict):
    """What the report compares and how.

    Set in a study file (:data:`STUDY_FILE_KEYS`): ``ci`` is the bootstrap interval (see
    ``bootstrap_ci``); ``calibration`` the number of null comparisons the report simulates for
    its calibration section (0: none).
    Filled in from the study: ``study`` (its name); ``primary`` and ``metrics``, bare metric names
    (``ndcg@10``), primary first (prepended when missing); ``higher_is_better``, a metric's
    direction (default: higher is better); ``variants``; ``notes``, free-text lines shown in the
    report's settings paragraph ("device: cpu").
    """

    # -- the study file's
    baseline: str = "base"
    alpha: float = Field(0.05, gt=0, lt=1)
    correction: CORRECTIONS.field = "holm"
    bootstrap: int = Field(10_000, ge=100)
    # Interval for Δ: smoothed studentized bootstrap (calibrated for 3–5 seeds), plain, or percentile.
    ci: CI_METHODS.field = "smoothed-bootstrap-t"
    # Null comparisons simulated at report time for the calibration section (0: skip).
    calibration: int = Field(200, ge=0)
    # -- the study's
    study: str = ""
    primary: str = ""
    metrics: list[str] = []
    higher_is_better: dict[str, bool] | None = None
    variants: list[str] = []
    notes: list[str] = []
    # -- fixed here: the bootstrap's RNG seed and the CIs' level
    seed: int = 0
    confidence: float = Field(0.95, gt=0, lt=1)

    @model_validator(mode="after")
    def _primary_first(self) -> ReportSettings:
        if self.primary:
            self.metrics = [self.primary] + [m for m in self.metrics if m != self.primary]
        return self

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

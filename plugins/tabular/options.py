"""Options of the tabular task (``task:`` in a study file)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from ablate.components import Options
from ablate.tasks import TaskOptions

TaskType = Literal["regression", "binclass", "multiclass"]
# What to do with a missing value: refuse the data (naming file and row), drop the rows that have
# one, or fill in (numeric: the training mean; categorical: a category of its own, "missing").
MissingPolicy = Literal["error", "drop", "impute"]


class NpyData(Options):
    """The FT-Transformer / T2G-Former folder layout: ``N_{train,val,test}.npy`` (numeric),
    optional ``C_*.npy`` (categorical), ``y_*.npy`` and ``info.json`` (``task_type``)."""

    format: Literal["npy"]
    path: str  # the folder; relative paths are resolved against the study file's folder
    missing: MissingPolicy = "error"


class CsvData(Options):
    """One CSV with a header row; columns are declared, the split is drawn with ``split_seed``."""

    format: Literal["csv"]
    path: str
    target: str
    task_type: TaskType
    numeric: list[str] = []
    categorical: list[str] = []
    missing: MissingPolicy  # declared, never assumed
    # Missing-value markers besides an empty field.
    na_values: list[str] = ["NA", "NaN", "nan", "?"]
    ratios: tuple[float, float, float] = (0.64, 0.16, 0.2)  # train / valid / test (FT-Transformer's)
    split_seed: int = 0

    @model_validator(mode="after")
    def _columns(self) -> CsvData:
        if not self.numeric and not self.categorical:
            raise ValueError("declare at least one feature column in numeric or categorical")
        both = set(self.numeric) & set(self.categorical)
        if both:
            raise ValueError(f"column(s) {', '.join(sorted(both))} declared both numeric and categorical")
        if self.target in set(self.numeric) | set(self.categorical):
            raise ValueError(f"the target '{self.target}' is also declared as a feature")
        if any(r <= 0 for r in self.ratios) or abs(sum(self.ratios) - 1.0) > 1e-6:
            raise ValueError(f"ratios must be three positive shares summing to 1 (got {self.ratios})")
        return self


class SyntheticData(Options):
    """Generated rows with a known target function (see :func:`data.synthetic`)."""

    format: Literal["synthetic"] = "synthetic"
    rows: int = Field(600, ge=20)
    numeric: int = Field(4, ge=0)
    categorical: int = Field(2, ge=0)
    cardinality: int = Field(4, ge=2)
    task_type: TaskType = "regression"
    classes: int = Field(3, ge=2)  # for multiclass
    noise: float = Field(0.1, ge=0.0)
    seed: int = 0

    @model_validator(mode="after")
    def _features(self) -> SyntheticData:
        if self.numeric + self.categorical == 0:
            raise ValueError("synthetic data needs at least one numeric or categorical feature")
        return self


DataOptions = Annotated[SyntheticData | NpyData | CsvData, Field(discriminator="format")]


class TabularOptions(TaskOptions):
    data: DataOptions = SyntheticData()
    # Numeric feature scaling fitted on the training rows: quantile (sklearn QuantileTransformer with
    # normal output, as FT-Transformer / T2G-Former), standard (z-score) or none.
    scaling: Literal["quantile", "standard", "none"] = "quantile"
    # Standardise a regression target with training statistics (predictions are mapped back, so
    # RMSE is in the target's original units).
    standardize_target: bool = True

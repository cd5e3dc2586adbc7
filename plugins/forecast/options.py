"""Options of the forecast task (``task:`` in a study file) and of its training loss."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from ablate.components import Options
from ablate.tasks import TaskOptions
from ablate_plugins.text_files import Encoding, Separator, memory_problem

# How rows are split into train / validation / test (see data.split_borders).
SplitScheme = Literal["auto", "ett_hour", "ett_minute", "ratio"]


class CsvData(Options):
    """An ETT-style CSV: a header row, a date column, then one numeric column per channel."""

    format: Literal["csv"]
    path: str  # relative paths are resolved against the study file's folder
    date_column: str = "date"
    # Channels to use (default: every column but the date), in this order.
    channels: list[str] | None = None
    # auto: ett_hour for ETTh*, ett_minute for ETTm* file names, else ratio.
    split: SplitScheme = "auto"
    # train / validation / test shares for split: ratio (test and train are rounded down).
    ratios: tuple[float, float, float] = (0.7, 0.1, 0.2)
    sep: Separator = ","  # longer separators are regular expressions
    encoding: Encoding = None  # the file's text encoding; None: UTF-8

    @model_validator(mode="after")
    def _ratios(self) -> CsvData:
        if any(r <= 0 for r in self.ratios) or abs(sum(self.ratios) - 1.0) > 1e-6:
            raise ValueError(f"ratios must be three positive shares summing to 1 (got {self.ratios})")
        return self


class SyntheticData(Options):
    """Generated channels: shared seasonal drivers plus noise (see :func:`data.synthetic`)."""

    format: Literal["synthetic"] = "synthetic"
    channels: int = Field(4, ge=1)
    rows: int = Field(800, ge=10)
    period: int = Field(24, ge=2)
    noise: float = Field(0.1, ge=0.0)
    seed: int = 0
    ratios: tuple[float, float, float] = (0.7, 0.1, 0.2)

    @model_validator(mode="after")
    def _size(self) -> SyntheticData:
        # The series, its noise, the latent waves and the normalised copy: ~5 float64 per value.
        problem = memory_problem(
            self.rows * (self.channels * 40 + 24), f"{self.rows} rows × {self.channels} channels"
        )
        if problem:
            raise ValueError(problem)
        return self


DataOptions = Annotated[SyntheticData | CsvData, Field(discriminator="format")]


class ForecastOptions(TaskOptions):
    data: DataOptions = SyntheticData()
    lookback: int = Field(96, ge=2)  # input window w (rows)
    horizon: int = Field(96, ge=1)  # rows to predict
    # Per-window, per-channel normalisation of the input (and its inverse on the output), as in
    # iTransformer / DUET (RevIN without affine parameters).
    instance_norm: bool = True


class LossOptions(Options):
    """``train.loss``: ``mse`` (iTransformer) or ``mae`` (DUET), on the normalised scale."""

    kind: Literal["mse", "mae"] = "mse"

"""Multivariate forecasting task (``forecast``): channels as tokens (iTransformer / DUET),
ETT-style CSV data with the standard splits, MSE / MAE on the normalised scale per window."""

from .batches import Batch
from .data import Series, prepare, read_csv, split_borders, synthetic
from .evaluation import window_errors
from .model import ForecastModel
from .options import CsvData, ForecastOptions, LossOptions, SyntheticData
from .task import ForecastTask

__all__ = [
    "Batch",
    "CsvData",
    "ForecastModel",
    "ForecastOptions",
    "ForecastTask",
    "LossOptions",
    "Series",
    "SyntheticData",
    "prepare",
    "read_csv",
    "split_borders",
    "synthetic",
    "window_errors",
]

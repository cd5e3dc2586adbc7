"""Tabular task (``tabular``): FT-Transformer's feature tokenizer and readout head, the
FT-Transformer ``.npy`` layout or a declared CSV, train-only scaling, accuracy / RMSE per row."""

from .batches import Batch
from .csv_data import read_csv
from .data import Table, read_npy, synthetic
from .model import FeatureTokenizer, TabularModel
from .options import CsvData, NpyData, SyntheticData, TabularOptions
from .preparation import prepare
from .task import TabularTask

__all__ = [
    "Batch",
    "CsvData",
    "FeatureTokenizer",
    "NpyData",
    "SyntheticData",
    "Table",
    "TabularModel",
    "TabularOptions",
    "TabularTask",
    "prepare",
    "read_csv",
    "read_npy",
    "synthetic",
]

"""Tabular data: the raw and prepared tables, and the loaders that need no text parsing.

* :func:`read_npy` — the FT-Transformer / T2G-Former folder layout (``N_*``, ``C_*``, ``y_*``,
  ``info.json``), already split into train / val / test.
* :func:`synthetic` — rows whose target is a known function of the features.
* :func:`.csv_data.read_csv` — CSV files with declared numeric and categorical columns.
* :func:`.preparation.prepare` — the missing-value policy, category codes, train-only scaling.

Dimensions: ``r`` rows, ``k`` numeric features, ``m`` categorical features.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from ablate import stopping
from ablate.errors import DataError, parse_json
from ablate_plugins.text_files import read_bytes

log = logging.getLogger(__name__)

SPLITS = ("train", "valid", "test")
NPY_SPLITS = {"train": "train", "valid": "val", "test": "test"}
MISSING_CATEGORY = "\x00missing"  # the category a missing categorical value becomes under "impute"
TASK_TYPES = ("regression", "binclass", "multiclass")


@dataclass
class RawSplit:
    numeric: np.ndarray  # [r, k] float (as stored), NaN where missing
    categorical: np.ndarray  # [r, m] object (str), None where missing
    y: np.ndarray  # [r] float64 (regression) or object labels
    where: list[str]  # [r] where each row came from, for error messages ("file.csv:12")


@dataclass
class RawTable:
    splits: dict[str, RawSplit]
    task_type: str
    numeric_names: list[str]
    categorical_names: list[str]
    source: str
    # Per split, the index (within the split as loaded) of each row kept by the missing-value policy.
    kept: dict[str, np.ndarray] | None = None


@dataclass
class Split:
    numeric: np.ndarray  # [r, k] float32, scaled
    categorical: np.ndarray  # [r, m] int64, 0..card-1 (card-1: unseen in training)
    y: np.ndarray  # [r] float32 (regression, standardised if asked) or int64 class index
    y_raw: np.ndarray  # [r] float64 regression target in original units (classes: same as y)
    rows: np.ndarray  # [r] int64 row index within the split before any dropping (evaluation unit)

    def __len__(self) -> int:
        return len(self.y)


@dataclass
class Table:
    splits: dict[str, Split]
    task_type: str
    classes: int  # output width of the head: 1 for regression and binclass
    cardinalities: list[int]  # per categorical feature, including the "unseen" index
    numeric_names: list[str]
    categorical_names: list[str]
    y_mean: float = 0.0
    y_std: float = 1.0
    source: str = ""
    notes: list[str] = field(default_factory=list)  # what the missing-value policy did

    @property
    def num_features(self) -> int:
        return len(self.numeric_names) + len(self.categorical_names)

    def describe(self) -> str:
        sizes = ", ".join(f"{s} {len(self.splits[s])}" for s in SPLITS)
        notes = f"; {'; '.join(self.notes)}" if self.notes else ""
        return (
            f"{self.source}: {self.task_type}, {len(self.numeric_names)} numeric + "
            f"{len(self.categorical_names)} categorical features; rows {sizes}{notes}"
        )


# ---------------------------------------------------------------------------------------
# Loaders


def read_npy(folder: Path) -> RawTable:
    if folder.is_file():
        raise DataError(
            f"{folder}: is a file; format npy reads a folder (N_train.npy, y_train.npy, info.json, ...)"
        )
    if not folder.is_dir():
        raise DataError(f"{folder}: folder not found (expected N_train.npy, y_train.npy, info.json, ...)")
    info_path = folder / "info.json"
    info = _info(info_path)
    task_type = info.get("task_type")
    if task_type not in TASK_TYPES:
        raise DataError(
            f"{info_path}: task_type must be regression, binclass or multiclass (got {task_type!r})"
        )
    splits = {}
    for split, suffix in NPY_SPLITS.items():
        stopping.check()
        y = _load(folder / f"y_{suffix}.npy")
        if y.ndim != 1:
            raise DataError(f"{folder / f'y_{suffix}.npy'}: expected a [rows] array; got shape {y.shape}")
        n = len(y)
        numeric = _load(folder / f"N_{suffix}.npy", optional=True)
        categorical = _load(folder / f"C_{suffix}.npy", optional=True)
        if numeric is None and categorical is None:
            raise DataError(f"{folder}: neither N_{suffix}.npy nor C_{suffix}.npy exists")
        for name, part in ((f"N_{suffix}.npy", numeric), (f"C_{suffix}.npy", categorical)):
            if part is not None and (part.ndim != 2 or len(part) != n):
                raise DataError(
                    f"{folder / name}: expected a [{n}, features] array (y_{suffix}.npy has {n} "
                    f"rows); got shape {part.shape}"
                )
        # Float arrays keep their dtype: sklearn's quantile transform treats ties at the training
        # maximum differently in float32 and float64, and the published runs used the float32 files.
        numeric = (
            np.zeros((n, 0))
            if numeric is None
            else numeric
            if np.issubdtype(numeric.dtype, np.floating)
            else _numbers(numeric, folder / f"N_{suffix}.npy")
        )
        _check_finite(numeric, folder / f"N_{suffix}.npy")
        categorical = (
            np.empty((n, 0), dtype=object)
            if categorical is None
            else np.where(pd.isna(categorical), None, categorical.astype(str)).astype(object)
        )
        if task_type == "regression":
            y = _numbers(y, folder / f"y_{suffix}.npy")
            _check_finite(y[:, None], folder / f"y_{suffix}.npy")
        else:
            y = y.astype(str).astype(object)
        splits[split] = RawSplit(
            numeric, categorical, y, [f"{folder}/*_{suffix}.npy row {i}" for i in range(n)]
        )
    k, m = splits["train"].numeric.shape[1], splits["train"].categorical.shape[1]
    for split, part in splits.items():
        if part.numeric.shape[1] != k or part.categorical.shape[1] != m:
            raise DataError(
                f"{folder}: the {split} arrays have {part.numeric.shape[1]} numeric and "
                f"{part.categorical.shape[1]} categorical features, train has {k} and {m}"
            )
    numeric_names = _names(info, "N_cols", info_path) or [f"num{i}" for i in range(k)]
    categorical_names = _names(info, "C_cols", info_path) or [f"cat{i}" for i in range(m)]
    if len(numeric_names) != k or len(categorical_names) != m:
        raise DataError(
            f"{info_path}: N_cols / C_cols name {len(numeric_names)} / {len(categorical_names)} "
            f"columns, the arrays have {k} / {m}"
        )
    return RawTable(splits, task_type, numeric_names, categorical_names, str(folder))


def _info(path: Path) -> dict:
    if not path.exists():
        raise DataError(f"{path}: file not found (it gives task_type)")
    try:
        info = parse_json(read_bytes(path).decode("utf-8-sig"))
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: not UTF-8 JSON (byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}:{exc.lineno}: not valid JSON: {exc.msg}") from None
    if not isinstance(info, dict):
        raise DataError(f"{path}: expected a JSON object with task_type; got {type(info).__name__}")
    return info


def _names(info: dict, key: str, path: Path) -> list[str] | None:
    names = info.get(key)
    if names is None:
        return None
    if not isinstance(names, list):
        raise DataError(f"{path}: {key} must be a list of column names; got {names!r:.60}")
    return [str(n) for n in names]


def _numbers(array: np.ndarray, path: Path) -> np.ndarray:
    """``array`` as float64; an array of other things (strings, objects) raises naming the file."""
    try:
        return array.astype(np.float64)
    except (ValueError, TypeError):
        raise DataError(f"{path}: expected numbers; the array holds {array.dtype} values") from None


def _check_finite(values: np.ndarray, path: Path) -> None:
    """NaN is a missing value (the policy decides); ±inf is never a value."""
    bad = np.isinf(values)
    if bad.any():
        row, column = np.argwhere(bad)[0]
        raise DataError(f"{path}: row {row}, column {column} is {values[row, column]} (not a finite number)")


def _load(path: Path, optional: bool = False) -> np.ndarray | None:
    if not path.is_file():
        if optional:
            return None
        raise DataError(f"{path}: file not found")
    try:
        return np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise DataError(f"{path}: not a readable .npy array: {str(exc).splitlines()[0]}") from None


def synthetic(
    rows: int,
    numeric: int,
    categorical: int,
    cardinality: int,
    task_type: str,
    classes: int,
    noise: float,
    seed: int,
) -> RawTable:
    """Numeric features ``x ~ N(0, 1)`` (the first one exponentiated: skewed, so scaling matters),
    categories uniform. The score is ``Σ w_j x_j + sin(2 x_0) + Σ e_{j, c_j}`` plus noise;
    regression predicts it, binclass its sign, multiclass its quantile bin (``classes`` bins)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, numeric))
    c = rng.integers(0, cardinality, size=(rows, categorical))
    score = x @ rng.normal(size=numeric) + (np.sin(2 * x[:, 0]) if numeric else 0.0)
    effects = rng.normal(size=(categorical, cardinality))
    score = score + effects[np.arange(categorical), c].sum(axis=1) + rng.normal(scale=noise, size=rows)
    if numeric:
        x[:, 0] = np.exp(x[:, 0])
    if task_type == "regression":
        y = score
    elif task_type == "binclass":
        y = np.where(score > np.median(score), "yes", "no").astype(object)
    else:
        edges = np.quantile(score, np.linspace(0, 1, classes + 1)[1:-1])
        y = np.array([f"class{i}" for i in np.searchsorted(edges, score)], dtype=object)
    stopping.check()
    cats = np.char.add("v", c.astype(str)).astype(object).reshape(rows, categorical)
    n_train, n_valid = int(rows * 0.64), int(rows * 0.16)
    bounds = {
        "train": slice(0, n_train),
        "valid": slice(n_train, n_train + n_valid),
        "test": slice(n_train + n_valid, rows),
    }
    splits = {
        s: RawSplit(x[b], cats[b], y[b], [f"synthetic row {i}" for i in range(rows)[b]])
        for s, b in bounds.items()
    }
    return RawTable(
        splits,
        task_type,
        [f"x{i}" for i in range(numeric)],
        [f"c{i}" for i in range(categorical)],
        f"synthetic(seed={seed})",
    )

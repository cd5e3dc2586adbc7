"""Tabular data: loaders, the declared missing-value policy, encoding and train-only scaling.

* :func:`read_npy` — the FT-Transformer / T2G-Former folder layout (``N_*``, ``C_*``, ``y_*``,
  ``info.json``), already split into train / val / test.
* :func:`read_csv` — one CSV with declared numeric and categorical columns, split at random.
* :func:`synthetic` — rows whose target is a known function of the features.
* :func:`prepare` — apply the missing-value policy, encode categories (index ``card`` is "unseen
  in training"), fit numeric scaling and target standardisation on the training rows only.

Dimensions: ``r`` rows, ``k`` numeric features, ``m`` categorical features.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from ablate.errors import DataError

log = logging.getLogger(__name__)

SPLITS = ("train", "valid", "test")
NPY_SPLITS = {"train": "train", "valid": "val", "test": "test"}
MISSING_CATEGORY = "\x00missing"  # the category a missing categorical value becomes under "impute"


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
    if not folder.is_dir():
        raise DataError(f"{folder}: folder not found (expected N_train.npy, y_train.npy, info.json, ...)")
    info_path = folder / "info.json"
    try:
        info = json.loads(info_path.read_text())
    except FileNotFoundError:
        raise DataError(f"{info_path}: file not found (it gives task_type)") from None
    except json.JSONDecodeError as exc:
        raise DataError(f"{info_path}:{exc.lineno}: not valid JSON: {exc.msg}") from None
    task_type = info.get("task_type")
    if task_type not in ("regression", "binclass", "multiclass"):
        raise DataError(
            f"{info_path}: task_type must be regression, binclass or multiclass (got {task_type!r})"
        )
    splits = {}
    for split, suffix in NPY_SPLITS.items():
        y = _load(folder / f"y_{suffix}.npy")
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
            else numeric.astype(np.float64)
        )
        categorical = (
            np.empty((n, 0), dtype=object)
            if categorical is None
            else np.where(pd.isna(categorical), None, categorical.astype(str)).astype(object)
        )
        y = y.astype(np.float64) if task_type == "regression" else y.astype(str).astype(object)
        splits[split] = RawSplit(
            numeric, categorical, y, [f"{folder}/*_{suffix}.npy row {i}" for i in range(n)]
        )
    k, m = splits["train"].numeric.shape[1], splits["train"].categorical.shape[1]
    numeric_names = list(info.get("N_cols") or [f"num{i}" for i in range(k)])
    categorical_names = list(info.get("C_cols") or [f"cat{i}" for i in range(m)])
    if len(numeric_names) != k or len(categorical_names) != m:
        raise DataError(
            f"{info_path}: N_cols / C_cols name {len(numeric_names)} / {len(categorical_names)} "
            f"columns, the arrays have {k} / {m}"
        )
    return RawTable(splits, task_type, numeric_names, categorical_names, str(folder))


def _load(path: Path, optional: bool = False) -> np.ndarray | None:
    if not path.is_file():
        if optional:
            return None
        raise DataError(f"{path}: file not found")
    try:
        return np.load(path, allow_pickle=False)
    except (ValueError, OSError) as exc:
        raise DataError(f"{path}: not a readable .npy array: {exc}") from None


def read_csv(
    path: Path,
    target: str,
    task_type: str,
    numeric: list[str],
    categorical: list[str],
    na_values: list[str],
    ratios: tuple[float, float, float],
    split_seed: int,
) -> RawTable:
    """Read declared columns; a numeric field that is neither a number nor a missing marker
    raises ``DataError('<file>:<line>: ...')``. Rows are split at random with ``split_seed``."""
    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False, skipinitialspace=True)
    except FileNotFoundError:
        raise DataError(f"{path}: file not found") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: could not parse: {str(exc).splitlines()[0]}") from None
    wanted = [target, *numeric, *categorical]
    absent = [c for c in wanted if c not in frame.columns]
    if absent:
        raise DataError(
            f"{path}:1: declared column(s) {', '.join(absent)} not in the header ({', '.join(frame.columns)})"
        )
    if frame.empty:
        raise DataError(f"{path}: no data rows after the header")
    lines = np.arange(len(frame)) + 2  # header is line 1
    missing = {"", *na_values}
    is_na = frame[wanted].apply(lambda col: col.str.strip().isin(missing))
    nums = np.full((len(frame), len(numeric)), np.nan)
    for j, name in enumerate(numeric + ([target] if task_type == "regression" else [])):
        parsed = pd.to_numeric(frame[name].str.strip().where(~is_na[name]), errors="coerce")
        bad = parsed.isna() & ~is_na[name]
        if bad.any():
            i = int(np.flatnonzero(bad.to_numpy())[0])
            raise DataError(
                f"{path}:{lines[i]}: column '{name}': {frame[name].iloc[i]!r} is not a number "
                f"(missing values are written as empty or one of {', '.join(na_values)})"
            )
        if j < len(numeric):
            nums[:, j] = parsed.to_numpy(dtype=np.float64)
        else:
            y = parsed.to_numpy(dtype=np.float64)

    def labels(name: str) -> np.ndarray:
        values = frame[name].str.strip().to_numpy(dtype=object)
        values[is_na[name].to_numpy()] = None
        return values

    if task_type != "regression":
        y = labels(target)
    cats = (
        np.column_stack([labels(c) for c in categorical])
        if categorical
        else np.empty((len(frame), 0), dtype=object)
    )
    order = np.random.default_rng(split_seed).permutation(len(frame))
    n_train, n_valid = int(len(frame) * ratios[0]), int(len(frame) * ratios[1])
    parts = {
        "train": order[:n_train],
        "valid": order[n_train : n_train + n_valid],
        "test": order[n_train + n_valid :],
    }
    splits = {
        s: RawSplit(nums[i], cats[i], y[i], [f"{path}:{lines[r]}" for r in i]) for s, i in parts.items()
    }
    return RawTable(splits, task_type, list(numeric), list(categorical), str(path))


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
    cats = np.array([[f"v{v}" for v in row] for row in c], dtype=object).reshape(rows, categorical)
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


# ---------------------------------------------------------------------------------------
# Preparation


def apply_missing(raw: RawTable, policy: str) -> tuple[RawTable, list[str]]:
    """The declared missing-value policy; returns the table and what was done (for the log)."""
    notes = []
    out = {}
    train_mean = None
    if policy == "impute":
        train = raw.splits["train"].numeric
        with np.errstate(all="ignore"):
            train_mean = np.nanmean(train, axis=0) if len(train) else np.zeros(train.shape[1])
        empty = np.isnan(train_mean)
        if empty.any():
            names = [raw.numeric_names[j] for j in np.flatnonzero(empty)]
            raise DataError(
                f"{raw.source}: numeric column(s) {', '.join(names)} have no training value to impute from"
            )
    for split, part in raw.splits.items():
        num_na = np.isnan(part.numeric)
        cat_na = _is_none(part.categorical)
        y_na = np.isnan(part.y) if raw.task_type == "regression" else _is_none(part.y)
        feature_na = num_na.any(axis=1) | cat_na.any(axis=1)
        if y_na.any() and policy != "drop":
            i = int(np.flatnonzero(y_na)[0])
            raise DataError(
                f"{part.where[i]}: the target is missing (policy '{policy}' never fills in targets; "
                f"use missing: drop to drop such rows)"
            )
        if policy == "error" and feature_na.any():
            i = int(np.flatnonzero(feature_na)[0])
            names = [
                n
                for n, bad in zip(
                    raw.numeric_names + raw.categorical_names, np.r_[num_na[i], cat_na[i]], strict=True
                )
                if bad
            ]
            raise DataError(
                f"{part.where[i]}: missing value in {', '.join(names)} (data.missing is 'error'; "
                f"declare 'drop' or 'impute' to handle missing values)"
            )
        keep = ~(feature_na | y_na) if policy == "drop" else np.ones(len(part.y), dtype=bool)
        numeric, categorical = part.numeric[keep], part.categorical[keep].copy()
        if policy == "impute":
            numeric = np.where(np.isnan(numeric), train_mean, numeric)
            categorical[_is_none(categorical)] = MISSING_CATEGORY
        dropped = int((~keep).sum())
        if dropped:
            notes.append(f"{split}: dropped {dropped} row(s) with missing values")
        if policy == "impute" and (num_na.any() or cat_na.any()):
            notes.append(
                f"{split}: imputed {int(num_na.sum())} numeric and {int(cat_na.sum())} categorical value(s)"
            )
        rows = np.flatnonzero(keep)
        out[split] = (RawSplit(numeric, categorical, part.y[keep], [part.where[i] for i in rows]), rows)
    for split, (_, rows) in out.items():
        if len(rows) == 0:
            raise DataError(
                f"{raw.source}: the {split} split has no rows left after the missing-value policy"
            )
    raw = RawTable(
        {s: p for s, (p, _) in out.items()},
        raw.task_type,
        raw.numeric_names,
        raw.categorical_names,
        raw.source,
        kept={s: r for s, (_, r) in out.items()},
    )
    return raw, notes


def _is_none(values: np.ndarray) -> np.ndarray:
    """Missing entries of an object array (None or NaN)."""
    return pd.isna(values).astype(bool).reshape(values.shape)


def quantile_transformer(train_rows: int, seed: int):
    """FT-Transformer's quantile transform: normal output, ``max(min(r/30, 1000), 10)`` quantiles."""
    from sklearn.preprocessing import QuantileTransformer

    return QuantileTransformer(
        output_distribution="normal",
        n_quantiles=max(min(train_rows // 30, 1000), 10),
        subsample=10**9,
        random_state=seed,
    )


def prepare(raw: RawTable, missing: str, scaling: str, standardize_target: bool, seed: int = 0) -> Table:
    raw, notes = apply_missing(raw, missing)
    train = raw.splits["train"]

    # Categories: codes from the training rows; values unseen there share the last index.
    vocabularies = [sorted(set(train.categorical[:, j])) for j in range(train.categorical.shape[1])]
    cardinalities = [len(v) + 1 for v in vocabularies]

    def encode(part: RawSplit) -> np.ndarray:
        codes = np.empty(part.categorical.shape, dtype=np.int64)
        for j, vocab in enumerate(vocabularies):
            index = {v: i for i, v in enumerate(vocab)}
            codes[:, j] = [index.get(v, len(vocab)) for v in part.categorical[:, j]]
        return codes

    # Numeric scaling fitted on training rows only.
    if scaling == "quantile" and train.numeric.shape[1]:
        transform = quantile_transformer(len(train.numeric), seed).fit(train.numeric).transform
    elif scaling == "standard" and train.numeric.shape[1]:
        mean, std = train.numeric.mean(axis=0), train.numeric.std(axis=0)
        std = np.where(std > 0, std, 1.0)
        transform = lambda a: (a - mean) / std  # noqa: E731
    else:
        transform = lambda a: a  # noqa: E731

    # Target: standardised regression value, or class index from the training labels.
    y_mean, y_std, classes = 0.0, 1.0, 1
    if raw.task_type == "regression":
        if standardize_target:
            y_mean, y_std = float(train.y.mean()), float(train.y.std()) or 1.0
        encode_y = lambda part: ((part.y - y_mean) / y_std).astype(np.float32)  # noqa: E731
    else:
        labels = sorted(set(train.y))
        if raw.task_type == "binclass" and len(labels) != 2:
            raise DataError(
                f"{raw.source}: binclass needs exactly 2 target classes in train; found {len(labels)}"
            )
        if len(labels) < 2:
            raise DataError(f"{raw.source}: classification needs at least 2 target classes in train")
        classes = 1 if raw.task_type == "binclass" else len(labels)
        label_index = {v: i for i, v in enumerate(labels)}

        def encode_y(part: RawSplit) -> np.ndarray:
            unseen = [i for i, v in enumerate(part.y) if v not in label_index]
            if unseen:
                raise DataError(
                    f"{part.where[unseen[0]]}: target class {part.y[unseen[0]]!r} never occurs in the "
                    f"training rows"
                )
            return np.array([label_index[v] for v in part.y], dtype=np.int64)

    splits = {}
    for split, part in raw.splits.items():
        y = encode_y(part)
        splits[split] = Split(
            numeric=np.asarray(transform(part.numeric), dtype=np.float32).reshape(len(part.y), -1),
            categorical=encode(part),
            y=y,
            y_raw=part.y.astype(np.float64) if raw.task_type == "regression" else y,
            rows=raw.kept[split].astype(np.int64),
        )
    table = Table(
        splits,
        raw.task_type,
        classes,
        cardinalities,
        raw.numeric_names,
        raw.categorical_names,
        y_mean,
        y_std,
        raw.source,
        notes,
    )
    if notes:
        log.warning("%s", table.describe())
    return table

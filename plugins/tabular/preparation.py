"""Preparing a raw table for training: the declared missing-value policy, category codes (index
``card`` is "unseen in training"), numeric scaling and target standardisation fitted on the
training rows only.

Dimensions: ``r`` rows, ``k`` numeric features, ``m`` categorical features.
"""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd

from ablate import stopping
from ablate.errors import DataError
from ablate_plugins.text_files import found

from .data import MISSING_CATEGORY, RawSplit, RawTable, Split, Table

log = logging.getLogger(__name__)

# More classes than this share of the training rows (and than MANY_CLASSES) suggests a numeric
# target declared as classes: every class would be seen once or twice.
CLASS_SHARE, MANY_CLASSES = 0.5, 100


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
        # At most one quantile per row: scikit-learn would lower it so itself, with a warning.
        n_quantiles=max(min(max(min(train_rows // 30, 1000), 10), train_rows), 1),
        subsample=10**9,
        random_state=seed,
    )


def jittered(numeric: np.ndarray, noise: float, seed: int) -> np.ndarray:
    """``numeric + σ ⊙ N(0, 1)`` with ``σ_j = noise / max(std_j, noise)`` (FT-Transformer's
    preprocessing, before fitting the quantile transform), drawn from ``default_rng(seed)``."""
    if noise == 0.0:
        return numeric
    sigma = noise / np.maximum(numeric.std(axis=0, keepdims=True), noise)
    return numeric + sigma * np.random.default_rng(seed).standard_normal(numeric.shape)


def prepare(
    raw: RawTable,
    missing: str,
    scaling: str,
    standardize_target: bool,
    quantile_noise: float = 0.0,
    seed: int = 0,
) -> Table:
    raw, notes = apply_missing(raw, missing)
    train = raw.splits["train"]

    # Categories: codes from the training rows; values unseen there share the last index.
    vocabularies = [sorted(set(train.categorical[:, j])) for j in range(train.categorical.shape[1])]
    cardinalities = [len(v) + 1 for v in vocabularies]

    def encode(part: RawSplit) -> np.ndarray:
        codes = np.empty(part.categorical.shape, dtype=np.int64)
        for j, vocab in enumerate(vocabularies):
            stopping.check()
            index = {v: i for i, v in enumerate(vocab)}
            codes[:, j] = [index.get(v, len(vocab)) for v in part.categorical[:, j]]
        return codes

    # Numeric scaling fitted on training rows only.
    if scaling == "quantile" and train.numeric.shape[1]:
        fitted_on = jittered(train.numeric, quantile_noise, seed)
        transform = quantile_transformer(len(train.numeric), seed).fit(fitted_on).transform
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
        _check_classes(raw, labels, len(train.y))
        classes = 1 if raw.task_type == "binclass" else len(labels)
        label_index = {v: i for i, v in enumerate(labels)}

        def encode_y(part: RawSplit) -> np.ndarray:
            unseen = [i for i, v in enumerate(part.y) if v not in label_index]
            if unseen:
                label = part.y[unseen[0]]
                raise DataError(
                    f"{part.where[unseen[0]]}: target class {label!r} never occurs in the "
                    f"training rows (they hold {found(labels)}){_suffix_hint(label, labels)}"
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


def _suffix_hint(label: object, labels: list) -> str:
    """Where ``label`` is a training label plus a suffix (UCI's adult.test: ``">50K."``), the
    option that removes it."""
    if not isinstance(label, str):
        return ""
    stem = max((t for t in labels if isinstance(t, str) and t and label.startswith(t)), key=len, default=None)
    if stem is None or stem == label:
        return ""
    suffix = label[len(stem) :]
    return f"; it is {stem!r} with {suffix!r} added: data.label_suffix: {suffix!r} removes it"


def _check_classes(raw: RawTable, labels: list, rows: int) -> None:
    """Classification targets: binclass exactly 2 classes, multiclass at least 2 and not so many
    that the target looks numeric; each error lists the classes found."""
    what = f"{raw.source}: {raw.task_type}"
    if raw.task_type == "binclass" and len(labels) != 2:
        raise DataError(f"{what} needs exactly 2 target classes in train; found {found(labels)}")
    if len(labels) < 2:
        raise DataError(f"{what} needs at least 2 target classes in train; found {found(labels)}")
    if len(labels) > max(MANY_CLASSES, CLASS_SHARE * rows):
        raise DataError(
            f"{what} target has {len(labels)} classes in {rows} training rows ({found(labels, 5)}); "
            f"if it is a number to predict, declare task_type: regression"
        )

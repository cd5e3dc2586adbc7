"""Tabular CSV files: declared columns read from ``path`` (and ``valid`` / ``test`` files), then
split — by the files, by a split column, or at random with ``split_seed``.

Every problem stops the load with one line naming the file and line: a field that is not a number,
a missing value under ``missing: error`` (the first in file order, across the files in the order
``path``, ``valid``, ``test``), a split column value other than train / valid / test.

Dimensions: ``r`` rows, ``k`` numeric features, ``m`` categorical features.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ablate.errors import DataError
from ablate_plugins.text_files import Records, found, header_hint, read_records, read_text

from .data import SPLITS, RawSplit, RawTable
from .options import CsvData

SPLIT_FILES = {"valid": "valid", "test": "test"}  # option → the split its file holds


@dataclass
class FileRows:
    """One file's declared columns, rows in file order."""

    records: Records
    numeric: np.ndarray  # [r, k] float64, NaN where missing
    categorical: np.ndarray  # [r, m] object, None where missing
    y: np.ndarray  # [r] float64 (regression) or object labels, NaN / None where missing
    feature_na: np.ndarray  # [r, k + m] bool
    target_na: np.ndarray  # [r] bool

    def where(self, rows: np.ndarray) -> list[str]:
        return [self.records.where(int(i)) for i in rows]


def read_csv(data: CsvData, base_dir: Path) -> RawTable:
    """The declared columns of every file ``data`` names, checked and split."""
    files = {option: _read_file(base_dir / Path(p).expanduser(), data) for option, p in data.files().items()}
    _check_missing(files.values(), data)
    main = files["path"]
    if data.split_column is not None:
        parts = _by_column(main.records, data.split_column)
    else:
        drawn = [s for s in SPLITS if s not in {SPLIT_FILES[o] for o in files if o != "path"}]
        parts = _at_random(len(main.y), drawn, data.ratios, data.split_seed)
    for split, rows in parts.items():
        if not len(rows):
            raise DataError(
                f"{main.records.path}: the {split} split gets none of the file's {len(main.y)} rows "
                f"(ratios {'/'.join(f'{r:g}' for r in data.ratios)}); add rows or give a {split} file"
            )
    splits = {split: _split(main, rows) for split, rows in parts.items()}
    for option, rows in files.items():
        if option != "path":
            splits[SPLIT_FILES[option]] = _split(rows, np.arange(len(rows.y)))
    ordered = {s: splits[s] for s in SPLITS}
    return RawTable(
        ordered, data.task_type, list(data.numeric), list(data.categorical), str(main.records.path)
    )


def _split(rows: FileRows, index: np.ndarray) -> RawSplit:
    return RawSplit(rows.numeric[index], rows.categorical[index], rows.y[index], rows.where(index))


def _read_file(path: Path, data: CsvData) -> FileRows:
    text = read_text(path, data.encoding)
    records = read_records(path, text, data.sep, data.header, data.columns, data.comment, comment_option=True)
    absent = [c for c in data.declared() if c not in records.header]
    if absent:
        raise DataError(
            f"{path}:{records.header_line}: declared column(s) {', '.join(absent)} not in the header "
            f"({', '.join(map(str, records.header))}){header_hint(records.header)}"
            f"{' and name the columns in data.columns' if header_hint(records.header) else ''}"
        )
    missing = {"", *data.na_values}
    columns = {name: records.column(name) for name in (data.target, *data.numeric, *data.categorical)}
    is_na = {name: np.isin(values, list(missing)) for name, values in columns.items()}
    numbers = list(data.numeric) + ([data.target] if data.task_type == "regression" else [])
    parsed = {name: _numbers(records, name, columns[name], is_na[name], data.na_values) for name in numbers}

    def labels(name: str) -> np.ndarray:
        values = columns[name].copy()
        values[is_na[name]] = None
        return values

    n = len(records.rows)
    nums = np.column_stack([parsed[c] for c in data.numeric]) if data.numeric else np.full((n, 0), np.nan)
    cats = (
        np.column_stack([labels(c) for c in data.categorical])
        if data.categorical
        else np.empty((n, 0), dtype=object)
    )
    y = parsed[data.target] if data.task_type == "regression" else _unsuffixed(labels(data.target), data)
    feature_na = np.column_stack([is_na[c] for c in (*data.numeric, *data.categorical)])
    return FileRows(records, nums, cats, y, feature_na, is_na[data.target])


def _unsuffixed(labels: np.ndarray, data: CsvData) -> np.ndarray:
    """Class labels with ``data.label_suffix`` removed where they end with it."""
    suffix = data.label_suffix
    if suffix is None:
        return labels
    out = labels.copy()
    out[:] = [v[: -len(suffix)] if isinstance(v, str) and v.endswith(suffix) else v for v in labels]
    return out


def _numbers(
    records: Records, name: str, values: np.ndarray, na: np.ndarray, markers: list[str]
) -> np.ndarray:
    """A numeric column: NaN where missing; a field that is not a finite number raises."""
    parsed = pd.to_numeric(pd.Series(values, dtype=object).where(~na), errors="coerce").to_numpy(
        dtype=np.float64
    )
    bad = ~np.isfinite(parsed) & ~na
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        what = "a finite number" if pd.notna(parsed[i]) else "a number"
        raise DataError(
            f"{records.where(i)}: column '{name}': {values[i]!r} is not {what} "
            f"(missing values are written as empty or one of {', '.join(markers)})"
        )
    return parsed


def _check_missing(files, data: CsvData) -> None:
    """The first missing value the policy refuses, in file order: any under ``error``, a target
    under ``impute`` (``drop`` drops their rows later)."""
    if data.missing == "drop":
        return
    features = [*data.numeric, *data.categorical]
    for rows in files:
        refused = rows.target_na | (rows.feature_na.any(axis=1) if data.missing == "error" else False)
        if not refused.any():
            continue
        i = int(np.flatnonzero(refused)[0])
        where = rows.records.where(i)
        if rows.target_na[i]:
            raise DataError(
                f"{where}: the target is missing (policy '{data.missing}' never fills in targets; "
                f"use missing: drop to drop such rows)"
            )
        names = [n for n, bad in zip(features, rows.feature_na[i], strict=True) if bad]
        raise DataError(
            f"{where}: missing value in {', '.join(names)} (data.missing is 'error'; "
            f"declare 'drop' or 'impute' to handle missing values)"
        )


def _by_column(records: Records, column: str) -> dict[str, np.ndarray]:
    """Rows by the split each names in ``column``; every value must be a split's name."""
    values = records.column(column)
    bad = ~np.isin(values, SPLITS)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise DataError(
            f"{records.where(i)}: split column '{column}' holds {values[i]!r}; expected train, valid or "
            f"test (the column holds {found(sorted(set(values.tolist())))})"
        )
    parts = {split: np.flatnonzero(values == split) for split in SPLITS}
    empty = [split for split, rows in parts.items() if not len(rows)]
    if empty:
        counts = ", ".join(f"{s} {len(r)}" for s, r in parts.items() if len(r))
        raise DataError(
            f"{records.path}: split column '{column}' names no {' or '.join(empty)} rows ({counts})"
        )
    return parts


SPLIT_WORDS = {"train": "training", "valid": "validation", "test": "test"}


def split_words(data: CsvData) -> str:
    """How ``data``'s rows are split, as :func:`read_csv` splits them, each file named: the
    protocol sentence's, so Methods says the split the run used."""
    main = Path(data.path).name
    if data.split_column is not None:
        return f" by the value of column {data.split_column!r} in each row of {main}"
    given = {SPLIT_FILES[o]: Path(p).name for o, p in data.files().items() if o != "path"}
    drawn = [s for s in SPLITS if s not in given]
    said = []
    if len(drawn) == 1:
        said.append(f"{SPLIT_WORDS[drawn[0]]} rows are those of {main}")
    else:
        shares = dict(zip(SPLITS, data.ratios, strict=True))
        total = 1.0 if len(drawn) == len(SPLITS) else sum(shares[s] for s in drawn)
        parts = " / ".join(SPLIT_WORDS[s] for s in drawn)
        cut = " / ".join(f"{shares[s] / total:.0%}" for s in drawn)
        said.append(f"{parts} rows drawn at random from {main}, {cut} (split_seed {data.split_seed})")
    said += [f"{SPLIT_WORDS[s]} rows are those of {name}" for s, name in given.items()]
    return ": " + "; ".join(said)


def _at_random(rows: int, drawn: list[str], ratios: tuple[float, ...], seed: int) -> dict[str, np.ndarray]:
    """Rows of ``path`` for the ``drawn`` splits, shuffled with ``seed``: each split's share of the
    rows is its ratio over the drawn splits' ratios (the last split takes the rest)."""
    order = np.random.default_rng(seed).permutation(rows)
    shares = dict(zip(SPLITS, ratios, strict=True))
    # All three drawn: the ratios as given (so the split is exactly the one before files existed).
    total = 1.0 if len(drawn) == len(SPLITS) else sum(shares[s] for s in drawn)
    parts, start = {}, 0
    for split in drawn[:-1]:
        count = int(rows * shares[split] / total)
        parts[split] = order[start : start + count]
        start += count
    parts[drawn[-1]] = order[start:]
    return parts

"""Multivariate series for forecasting: loading, the standard splits, z-normalisation.

* :func:`read_csv` — an ETT-style CSV (date column + numeric channels, rows in time order);
  problems name file:line.
* :func:`synthetic` — seasonal channels driven by shared latent waves, plus noise.
* :func:`split_borders` — the Informer / iTransformer split: ETTh 12/4/4 months of hourly rows,
  ETTm the same span at 15-minute rows, other data 0.7 / 0.1 / 0.2 by time. Validation and test
  segments start ``lookback`` rows early, so their first window's input is the end of the previous
  split (the usual overlap at split borders); targets never cross into another split.
* :func:`prepare` — z-normalise every channel with the *training rows'* mean and std.

Dimensions: ``t`` rows (time), ``c`` channels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from pandas.tseries.api import guess_datetime_format

from ablate import stopping
from ablate.errors import DataError
from ablate_plugins.text_files import CHECK_EVERY, Records, read_records, read_text

SPLITS = ("train", "valid", "test")
MONTH_ROWS = {"ett_hour": 30 * 24, "ett_minute": 30 * 24 * 4}  # rows per 30-day "month"
RATIO_DEFAULT = (0.7, 0.1, 0.2)  # train / valid / test shares of split: ratio


@dataclass
class Series:
    """Rows ``values [t, c]`` (z-normalised with training statistics) and the row range of each split.

    ``borders[split] = (start, end)``: the split's rows are ``values[start:end]``, the first
    ``lookback`` of which are inputs only for validation and test.
    """

    values: np.ndarray  # [t, c] float32, normalised
    channels: list[str]
    borders: dict[str, tuple[int, int]]
    mean: np.ndarray  # [c] training mean (raw units)
    std: np.ndarray  # [c] training std (raw units)
    source: str
    lookback: int
    horizon: int
    file_rows: int = 0  # rows read, before a split that leaves later rows unused (the ETT splits)

    @property
    def num_channels(self) -> int:
        return self.values.shape[1]

    @property
    def unused_rows(self) -> int:
        """Rows read but in no split: those after the ETT splits' 20 months."""
        return max(self.file_rows - len(self.values), 0)

    def windows(self, split: str) -> int:
        """How many (input, target) windows ``split`` holds."""
        start, end = self.borders[split]
        return max(0, end - start - self.lookback - self.horizon + 1)

    def window_starts(self, split: str) -> np.ndarray:
        """Row index of each window's first input row, ``[windows]`` int64."""
        start = self.borders[split][0]
        return start + np.arange(self.windows(split), dtype=np.int64)

    def describe(self) -> str:
        sizes = ", ".join(f"{s} {self.windows(s)}" for s in SPLITS)
        unused = f" ({self.unused_rows} later rows of the file unused)" if self.unused_rows else ""
        return (
            f"{self.source}: {self.values.shape[0]} rows{unused} × {self.num_channels} channels; "
            f"windows (lookback {self.lookback}, horizon {self.horizon}): {sizes}"
        )


# ---------------------------------------------------------------------------------------
# Reading


def read_csv(
    path: Path,
    date_column: str = "date",
    channels: list[str] | None = None,
    encoding: str | None = None,
    sep: str = ",",
) -> tuple[np.ndarray, list[str]]:
    """``(values [t, c] float64, channel names)`` from an ETT-style CSV.

    Every row must have as many fields as the header and a number in every channel column;
    the first that does not raises ``DataError('<file>:<line>: ...')``. Rows stay in file order,
    which must be time order (:func:`check_dates`).
    """
    records = read_records(path, read_text(path, encoding), sep)
    header = [str(h) for h in records.header]
    at = f"{path}:{records.header_line}"
    if date_column not in header:
        raise DataError(
            f"{at}: no date column '{date_column}' in the header ({', '.join(header)}); set data.date_column"
        )
    available = [h for h in header if h != date_column]
    wanted = available if channels is None else channels
    missing = [c for c in wanted if c not in available]
    if missing:
        raise DataError(f"{at}: channel(s) {', '.join(missing)} not in the header ({', '.join(available)})")
    if not wanted:
        raise DataError(f"{at}: no channel columns besides the date column '{date_column}'")
    check_dates(records, date_column)
    index = [header.index(c) for c in wanted]
    out: list[list[float]] = []
    for i, fields in enumerate(records.rows):
        if not i % CHECK_EVERY:
            stopping.check()
        row = []
        for j in index:
            try:
                value = float(fields[j])
            except ValueError:
                raise DataError(
                    f"{records.where(i)}: column '{header[j]}': {fields[j]!r} is not a number"
                ) from None
            if not math.isfinite(value):
                raise DataError(
                    f"{records.where(i)}: column '{header[j]}': {fields[j]!r} is not a finite number "
                    f"(missing values are not filled in silently; clean the file)"
                )
            row.append(value)
        out.append(row)
    return np.asarray(out, dtype=np.float64), wanted


def check_dates(records: Records, date_column: str) -> None:
    """Rows must be in time order: a date column of numbers, or of dates in the first row's
    format (as pandas guesses it), may not go back in time; a value that is not a date where
    the first is one stops the load. A column of plain labels (``t0``, ``t1``) is not checked."""
    values = records.column(date_column)
    numbers = pd.to_numeric(pd.Series(values, dtype=object), errors="coerce").to_numpy(dtype=np.float64)
    if np.isfinite(numbers).all():
        times, shown = numbers, values
    else:
        form = guess_datetime_format(str(values[0]))
        if form is None:
            return
        parsed = pd.to_datetime(pd.Series(values, dtype=object), format=form, errors="coerce")
        bad = parsed.isna().to_numpy()
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise DataError(
                f"{records.where(i)}: date column '{date_column}': {values[i]!r} is not a date in the "
                f"format of the first row ({values[0]!r}, {form})"
            )
        times, shown = parsed.to_numpy(), values
    back = np.flatnonzero(times[1:] < times[:-1])
    if len(back):
        i = int(back[0]) + 1
        raise DataError(
            f"{records.where(i)}: date column '{date_column}': {shown[i]!r} is earlier than the row "
            f"before ({shown[i - 1]!r}); rows must be in time order"
        )


def synthetic(channels: int, rows: int, period: int, noise: float, seed: int) -> np.ndarray:
    """``[rows, channels]``: each channel mixes two shared latent waves (periods ``period`` and
    ``period / 3``) with its own weights and phase, plus Gaussian noise of std ``noise`` — so other
    channels help predict a channel, and the future is predictable from the past."""
    rng = np.random.default_rng(seed)
    t = np.arange(rows, dtype=np.float64)[:, None]
    latent = np.concatenate([np.sin(2 * np.pi * t / period), np.sin(2 * np.pi * t / (period / 3))], axis=1)
    weights = rng.normal(size=(2, channels))
    level = rng.normal(scale=2.0, size=channels)
    scale = rng.uniform(0.5, 3.0, size=channels)
    return (latent @ weights + rng.normal(scale=noise, size=(rows, channels))) * scale + level


# ---------------------------------------------------------------------------------------
# Splits and normalisation


def ett_scheme(path: Path) -> str | None:
    """``ett_hour`` for ETTh* files, ``ett_minute`` for ETTm* files, else None."""
    name = path.name.lower()
    return "ett_hour" if name.startswith("etth") else "ett_minute" if name.startswith("ettm") else None


def scheme_for(path: Path, split: str) -> str:
    """``auto`` → the ETT split for ETTh* / ETTm* files (:func:`ett_scheme`), else ``ratio``."""
    return split if split != "auto" else ett_scheme(path) or "ratio"


def ett_elsewhere(path: Path, scheme: str, rows: int) -> str | None:
    """Why an ETT split on a file not named as an ETT file deserves a warning (its fixed 20 months
    leave later rows unused), or None."""
    if scheme not in MONTH_ROWS or ett_scheme(path) is not None:
        return None
    used = 20 * MONTH_ROWS[scheme]
    if rows <= used:
        return None
    return (
        f"{path}: data.split {scheme} is the ETT benchmark's fixed split (12 / 4 / 4 months of 30 days): "
        f"it uses the first {used} of the file's {rows} rows and leaves the {rows - used} later rows "
        f"unused; split: ratio splits every row ({', '.join(f'{r:g}' for r in RATIO_DEFAULT)} by time)"
    )


def split_borders(
    rows: int, scheme: str, lookback: int, ratios: tuple[float, float, float] = (0.7, 0.1, 0.2)
) -> dict[str, tuple[int, int]]:
    """Row ranges of train / valid / test (Informer's ``border1s`` / ``border2s``).

    ETT: train = 12 months, valid = 4, test = 4 (a month = 30 days of rows); later rows are unused.
    ratio: ``train = ⌊0.7 t⌋``, ``test = ⌊0.2 t⌋``, valid the rest. Valid and test start ``lookback``
    rows before their first target row.
    """
    if scheme in MONTH_ROWS:
        month = MONTH_ROWS[scheme]
        ends = (12 * month, 16 * month, 20 * month)
        if rows < ends[-1]:
            raise DataError(f"split '{scheme}' needs {ends[-1]} rows (12/4/4 months), the data has {rows}")
    else:
        train, test = int(rows * ratios[0]), int(rows * ratios[2])
        ends = (train, rows - test, rows)
    return {
        "train": (0, ends[0]),
        "valid": (max(0, ends[0] - lookback), ends[1]),
        "test": (max(0, ends[1] - lookback), ends[2]),
    }


def prepare(
    raw: np.ndarray,
    channels: list[str],
    borders: dict[str, tuple[int, int]],
    source: str,
    lookback: int,
    horizon: int,
) -> Series:
    """Normalise with the training rows' statistics only and check every split has a window."""
    end, rows = max(e for _, e in borders.values()), len(raw)
    raw = raw[:end]
    start, stop = borders["train"]
    mean = raw[start:stop].mean(axis=0)
    std = raw[start:stop].std(axis=0)
    std = np.where(std > 0, std, 1.0)  # a constant training channel stays centred, not divided by 0
    series = Series(
        values=((raw - mean) / std).astype(np.float32),
        channels=list(channels),
        borders=borders,
        mean=mean,
        std=std,
        source=source,
        lookback=lookback,
        horizon=horizon,
        file_rows=rows,
    )
    for split in SPLITS:
        if series.windows(split) < 1:
            a, b = borders[split]
            raise DataError(
                f"{source}: the {split} split (rows {a}..{b}) is too short for one window of "
                f"lookback {lookback} + horizon {horizon}"
            )
    return series

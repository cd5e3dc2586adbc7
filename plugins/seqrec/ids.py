"""User and item ids as a file writes them → values that sort into indices.

Ids may be integers (MovieLens, SASRec files) or any text (``A2IBPI20UZIR0U``, Amazon / Yelp
exports). :func:`id_column` reads a column of id fields under ``data.ids``:

* ``auto`` (default): integers when every id of the column is an integer that fits in 64 bits
  (as every integer-id file was read before ids could be text, so its indices stay the same),
  else text. A column of integers some of which exceed 64 bits keeps numeric order.
* ``integer``: every id must be such an integer; the first that is not stops the load.
* ``text``: every id is text, even ``007`` (kept apart from ``7``).

:func:`~.data.sequences` then sorts the ids — numerically for integers, by code point for text —
and numbers them in that order: the same file gives the same indices whatever its row order.
:func:`id_map` writes the numbering down, for the run's artifacts.
"""

from __future__ import annotations

import csv
import io
import logging
import reprlib
from collections.abc import Callable

import numpy as np
import pandas as pd

from ablate.errors import DataError

log = logging.getLogger(__name__)

INTEGER = r"[+-]?\d+"
# A column of integer ids with fewer non-integers than this share is warned about (a typo?).
STRAY_SHARE = 0.01
FLOAT_EXACT = 2**53  # integers a float64 holds exactly (for ids written as "5.0")
INTEGER_ONLY = "data.ids is 'integer'; 'auto' maps ids of any form to indices"
# The longest id read: text ids are kept as fixed-width text (:func:`as_text`, 4 bytes a character
# for every id), so one 40 MB field (a text column named as the id) asked for GiBs.
MAX_ID_CHARS = 256

# A value in a message: a long one cut (a 40 MB field keeps the message one short line).
_SHORT = reprlib.Repr()
_SHORT.maxstring = 60
brief = _SHORT.repr


def as_int64(values: np.ndarray) -> np.ndarray | None:
    """``values`` (strings) as int64 when every one is an integer within 64 bits (``5.0`` counts,
    as it always did), else None."""
    series = pd.Series(values, dtype=object)
    if series.str.fullmatch(r"[+-]?\d{1,18}").all():
        return series.astype(np.int64).to_numpy()
    parsed = pd.to_numeric(series, errors="coerce")
    if parsed.dtype == np.int64:
        return parsed.to_numpy()
    if parsed.dtype != np.float64 or parsed.isna().any():
        return None
    exact = parsed.abs() < FLOAT_EXACT
    if not (exact.all() and (parsed % 1 == 0).all()):
        return None
    return parsed.to_numpy().astype(np.int64)


def _int64(value: str) -> int | str:
    """``value`` as an integer within 64 bits, or why it is not one."""
    try:
        number = int(value)
    except ValueError:
        try:
            number = float(value)
        except ValueError:
            return "which is not an integer"
        if not (abs(number) < FLOAT_EXACT and number % 1 == 0):
            return "which is not an integer"
        return int(number)
    return number if -(2**63) <= number < 2**63 else "which does not fit in 64 bits"


def _first_not_int64(values: np.ndarray) -> tuple[int, str] | None:
    """The first id that is not a 64-bit integer and why, or None."""
    plain = pd.Series(values, dtype=object).str.fullmatch(r"[+-]?\d{1,18}").to_numpy()
    for i in np.flatnonzero(~plain):
        found = _int64(values[i])
        if isinstance(found, str):
            return int(i), found
    return None


def id_column(
    values: np.ndarray, mode: str, fail: Callable[[int, str], DataError], must_be_integer: str = ""
) -> np.ndarray:
    """``values`` (stripped strings, file order) read under ``mode``: an int64 array, or an
    object array of str (text ids) or of Python ints (integers beyond 64 bits). ``fail(i, why)``
    makes the error for row ``i``; ``must_be_integer`` (a reason) forces integer ids."""
    lengths = pd.Series(values, dtype=object).str.len().fillna(0).to_numpy()
    if (too_long := np.flatnonzero(lengths > MAX_ID_CHARS)).size:
        row = int(too_long[0])
        raise fail(row, f"{int(lengths[row]):,} characters long, not an id (ids are at most {MAX_ID_CHARS})")
    if mode == "text" and not must_be_integer:
        return values
    integers = as_int64(values)
    if integers is not None:
        return integers
    first_bad = _first_not_int64(values)
    if first_bad is None:  # integers in mixed spellings ("5.0" among 19-digit ids)
        return np.array([_int64(v) for v in values], dtype=np.int64)
    if mode == "integer" or must_be_integer:
        row, why = first_bad
        raise fail(row, f"{why} ({must_be_integer or INTEGER_ONLY})")
    integer = pd.Series(values, dtype=object).str.fullmatch(INTEGER).to_numpy(dtype=bool)
    if integer.all():
        out = np.empty(len(values), dtype=object)
        out[:] = [int(v) for v in values]  # numeric order, "007" and "7" one id
        return out
    if integer.mean() > 1 - STRAY_SHARE:
        row = int(np.flatnonzero(~integer)[0])
        log.warning(
            "%s; the column is read as text ids (set data.ids: integer to refuse such rows, or text)",
            fail(row, f"which is not an integer while {integer.mean():.2%} of the ids are"),
        )
    return values


def as_text(ids: np.ndarray) -> np.ndarray:
    """Sorted unique ids of an object column as a str array (savable without pickling)."""
    return np.asarray([str(v) for v in ids], dtype=str)


def id_map(index: np.ndarray, ids: np.ndarray, index_name: str) -> bytes:
    """A CSV ``<index_name>,id`` pairing each index with its source id (the run's artifact)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([index_name, "id"])
    writer.writerows(zip(index.tolist(), ids.tolist(), strict=True))
    return out.getvalue().encode()

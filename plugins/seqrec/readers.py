"""The seqrec file formats → rows ``(user, item[, rating][, timestamp])`` in file order →
:func:`~.data.sequences`.

* :func:`read_movielens` — MovieLens ``u.data`` (tab) or ``ratings.dat`` (``::``), optionally gzipped.
* :func:`read_user_item` — SASRec's ``user item`` lines, chronological per user.
* :func:`read_user_lines` — one line per user: ``user i1 i2 …`` (S3-Rec / ICLRec).
* :func:`read_table` — CSV / TSV with configurable user / item / rating / timestamp columns.
* :func:`read_json_lines` — one JSON object per line, one interaction each (Amazon Reviews).

Every reader takes ``encoding`` (:func:`ablate_plugins.text_files.read_text`) and ``ids``
(:mod:`.ids`); a problem stops it with one line naming the file and line. Integer-id files of the
whitespace formats are parsed by pandas in one pass; any other file line by line.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from ablate import stopping
from ablate.errors import DataError, parse_json
from ablate_plugins.text_files import CHECK_EVERY, Records, read_records, read_text

from .data import FIELDS, Filters, Interactions, sequences
from .ids import brief, id_column

ID, NUMBER = "id", "number"  # what a column holds
KEPT_IDS = "remap: false keeps item ids as indices, so they must be integers; set remap: true to map them"


def _numbers(values: np.ndarray, fail: Callable[[int, str], DataError]) -> np.ndarray:
    """Finite numbers (ratings, timestamps) from strings; the first that is not one fails."""
    parsed = pd.to_numeric(pd.Series(values, dtype=object).str.strip(), errors="coerce").to_numpy()
    bad = ~np.isfinite(parsed.astype(np.float64))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        finite = pd.notna(parsed[i])
        raise fail(i, "which is not a finite number" if finite else "which is not a number")
    return parsed.astype(np.float64)


def _columns(
    values: dict[str, np.ndarray],
    kinds: dict[str, str],
    ids: str,
    remap: bool,
    fail: Callable[[str, int, str], DataError],
) -> pd.DataFrame:
    """Each column read as ids or numbers; ``fail(name, row, why)`` makes the error."""
    out = {}
    for name, raw in values.items():
        fails = lambda row, why, name=name: fail(name, row, why)  # noqa: E731
        if kinds[name] == ID:
            out[name] = id_column(raw, ids, fails, KEPT_IDS if name == "item" and not remap else "")
        else:
            out[name] = _numbers(raw, fails)
    return pd.DataFrame(out)


# ---------------------------------------------------------------------------------------
# Whitespace-separated formats


def _integer_frame(text: str, names: tuple[str, ...], kinds: tuple[str, ...]) -> pd.DataFrame | None:
    """The fast path: every id an integer within 64 bits, every other field a finite number, every
    line ``len(names)`` fields. None when any of that fails (the line-by-line path says where)."""
    dtypes = {n: (np.int64 if k == ID else np.float64) for n, k in zip(names, kinds, strict=True)}
    try:
        frame = pd.read_csv(io.StringIO(text), sep=r"\s+", header=None, names=list(names), dtype=dtypes)
    except (ValueError, OverflowError, pd.errors.ParserError):
        return None
    # pandas pads short lines with NaN and may take extra fields of the first line as an index.
    first = next(line for line in text.splitlines() if line.strip())
    numbers = frame[[n for n, k in zip(names, kinds, strict=True) if k == NUMBER]].to_numpy()
    if len(first.split()) != len(names) or frame.isna().any().any() or not np.isfinite(numbers).all():
        return None
    return frame


def _read_columns(
    path: Path, text: str, names: tuple[str, ...], kinds: tuple[str, ...], ids: str, remap: bool
) -> pd.DataFrame:
    """Whitespace-separated columns; malformed lines raise with file:line."""
    if ids != "text":
        frame = _integer_frame(text, names, kinds)
        if frame is not None:
            return frame
    what = f"{len(names)} fields {', '.join(names)}"
    rows, lines = [], []
    for number, line in enumerate(io.StringIO(text, newline=""), start=1):
        if not number % CHECK_EVERY:
            stopping.check()
        fields = line.split()
        if not fields:
            continue
        if len(fields) != len(names):
            raise DataError(f"{path}:{number}: expected {what}; got {len(fields)}: {brief(line.strip())}")
        rows.append(fields)
        lines.append(number)
    if not rows:
        raise DataError(f"{path}: no interactions (the file is empty)")
    columns = [np.array(c, dtype=object) for c in zip(*rows, strict=True)]

    def fail(name: str, row: int, why: str) -> DataError:
        value = columns[names.index(name)][row]
        return DataError(f"{path}:{lines[row]}: expected {what}; got {name} {brief(value)}, {why}")

    return _columns(
        dict(zip(names, columns, strict=True)), dict(zip(names, kinds, strict=True)), ids, remap, fail
    )


def read_movielens(
    path: Path,
    min_rating: float | None = None,
    k_core: int | None = None,
    remap: bool = True,
    encoding: str | None = None,
    ids: str = "auto",
) -> Interactions:
    """Read ``user item rating timestamp`` lines (tab, whitespace or ``::`` separated)."""
    text = read_text(path, encoding)
    if "::" in text[:4096]:
        text = text.replace("::", "\t")
    frame = _read_columns(path, text, FIELDS, (ID, ID, NUMBER, NUMBER), ids, remap)
    return sequences(frame, str(path), Filters(min_rating, k_core, remap))


def read_user_item(
    path: Path, k_core: int | None = None, remap: bool = True, encoding: str | None = None, ids: str = "auto"
) -> Interactions:
    """SASRec format: ``user item`` per line (whitespace separated), each user's lines in
    chronological order. There is no time: file order is the order."""
    frame = _read_columns(path, read_text(path, encoding), ("user", "item"), (ID, ID), ids, remap)
    return sequences(frame, str(path), Filters(None, k_core, remap))


def read_user_lines(
    path: Path, k_core: int | None = None, remap: bool = True, encoding: str | None = None, ids: str = "auto"
) -> Interactions:
    """One line per user: ``user i1 i2 …`` (whitespace separated, chronological)."""
    text = read_text(path, encoding)
    users, items, lines = [], [], []
    for number, line in enumerate(io.StringIO(text, newline=""), start=1):
        if not number % CHECK_EVERY:
            stopping.check()
        fields = line.split()
        if not fields:
            continue
        if len(fields) < 2:
            raise DataError(
                f"{path}:{number}: expected 'user item item …'; got a user with no items: {line.strip()!r}"
            )
        users += [fields[0]] * (len(fields) - 1)
        items += fields[1:]
        lines += [number] * (len(fields) - 1)
    if not users:
        raise DataError(f"{path}: no interactions (the file is empty)")
    values = {"user": np.array(users, dtype=object), "item": np.array(items, dtype=object)}

    def fail(name: str, row: int, why: str) -> DataError:
        return DataError(
            f"{path}:{lines[row]}: expected ids 'user item item …'; got {brief(values[name][row])}, {why}"
        )

    frame = _columns(values, {"user": ID, "item": ID}, ids, remap, fail)
    return sequences(frame, str(path), Filters(None, k_core, remap))


# ---------------------------------------------------------------------------------------
# CSV / TSV


def read_table(
    path: Path,
    sep: str = ",",
    header: bool = True,
    user: str | int = "user",
    item: str | int = "item",
    timestamp: str | int | None = None,
    rating: str | int | None = None,
    min_rating: float | None = None,
    k_core: int | None = None,
    remap: bool = True,
    encoding: str | None = None,
    ids: str = "auto",
) -> Interactions:
    """CSV / TSV: columns named (with a header) or 0-based indices (without one). Other columns
    are ignored. Ratings and timestamps must be numbers; ids follow ``ids``."""
    if min_rating is not None and rating is None:
        raise DataError(f"{path}: min_rating needs a rating column (set 'rating')")
    wanted = {"user": user, "item": item, "timestamp": timestamp, "rating": rating}
    wanted = {k: v for k, v in wanted.items() if v is not None}
    jsonl = "; set data.format: jsonl to read one JSON object per line"
    records = read_records(path, read_text(path, encoding), sep, header, json_hint=jsonl)
    at = f"{path}:{records.header_line}" if header else str(path)
    for name, column in wanted.items():
        if column not in records.header:
            have = ", ".join(map(str, records.header))
            no_header = " (or header: false if the first line is data)" if header else ""
            raise DataError(
                f"{at}: no column {column!r} for {name} (columns: {have}); set data.{name} to one of them"
                f"{no_header}"
            )
    values = {name: records.column(column) for name, column in wanted.items()}
    kinds = {name: ID if name in ("user", "item") else NUMBER for name in wanted}
    return sequences(
        _columns(values, kinds, ids, remap, _table_fail(records, wanted)),
        str(path),
        Filters(min_rating, k_core, remap),
    )


def _table_fail(records: Records, wanted: dict[str, str | int]) -> Callable[[str, int, str], DataError]:
    def fail(name: str, row: int, why: str) -> DataError:
        value = records.rows[row][records.header.index(wanted[name])]
        return DataError(f"{records.where(row)}: {name} column {wanted[name]!r} holds {brief(value)}, {why}")

    return fail


# ---------------------------------------------------------------------------------------
# JSON lines

MS_PER_S = 1000.0
# Unix times in seconds from 1973-03-03 (1e8) to the year 5138 (1e11); in milliseconds they are
# 1000 times larger. A latest time in the seconds' band is seconds, above it milliseconds.
SECONDS_BAND = (1e8, 1e11)


def unit_mismatch(times: np.ndarray, unit: str) -> tuple[int, str] | None:
    """``(row, why)`` when the latest of ``times`` (as written) says they count the other unit than
    ``unit``: seconds read as milliseconds put every time in 1970, milliseconds read as seconds
    after the year 5000; None when they agree or the times are not Unix times (small counters)."""
    row = int(np.argmax(times))
    latest, (low, high) = float(times[row]), SECONDS_BAND
    if unit == "ms" and low <= latest < high:
        return row, "a Unix time in seconds (read as ms, every time falls in 1970); set timestamp_unit: s"
    if unit == "s" and latest >= high:
        return (
            row,
            "a Unix time in milliseconds (read as seconds: after the year 5000); set timestamp_unit: ms",
        )
    return None


def read_json_lines(
    path: Path,
    user: str = "user_id",
    item: str = "item_id",
    timestamp: str | None = None,
    timestamp_unit: str = "s",
    rating: str | None = None,
    min_rating: float | None = None,
    k_core: int | None = None,
    remap: bool = True,
    encoding: str | None = None,
    ids: str = "auto",
) -> Interactions:
    """One JSON object per line, one interaction each: ``user`` / ``item`` (and ``timestamp`` /
    ``rating``) name its keys. An id is a string or an integer; a timestamp or rating a number.
    A line that is not a JSON object, or lacks a key, stops the load naming its line."""
    if min_rating is not None and rating is None:
        raise DataError(f"{path}: min_rating needs a rating key (set 'rating')")
    wanted = {"user": user, "item": item, "timestamp": timestamp, "rating": rating}
    wanted = {k: v for k, v in wanted.items() if v is not None}
    columns: dict[str, list[str]] = {name: [] for name in wanted}
    lines: list[int] = []
    for number, line in enumerate(io.StringIO(read_text(path, encoding), newline=""), start=1):
        if not number % CHECK_EVERY:
            stopping.check()
        if not line.strip():
            continue
        try:
            record = parse_json(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}:{number}: not JSON ({exc.msg} at column {exc.colno})") from None
        if not isinstance(record, dict):
            got = {"list": "array", "str": "string", "int": "number", "float": "number"}.get(
                type(record).__name__, type(record).__name__
            )
            raise DataError(f"{path}:{number}: expected one JSON object per line; got a JSON {got}")
        for name, key in wanted.items():
            if key not in record:
                keys = ", ".join(list(record)[:12])
                raise DataError(f"{path}:{number}: no key {key!r} for {name} (keys: {keys}); set data.{name}")
            value = record[key]
            if isinstance(value, (dict, list, bool)) or value is None:
                shown = json.dumps(value)[:40]
                raise DataError(f"{path}:{number}: {name} key {key!r} holds {shown}, not a string or number")
            columns[name].append(str(value))
        lines.append(number)
    if not lines:
        raise DataError(f"{path}: no interactions (the file is empty)")
    values = {name: np.array(column, dtype=object) for name, column in columns.items()}

    def fail(name: str, row: int, why: str) -> DataError:
        held = values[name][row]
        return DataError(f"{path}:{lines[row]}: {name} key {wanted[name]!r} holds {brief(held)}, {why}")

    kinds = {name: ID if name in ("user", "item") else NUMBER for name in wanted}
    frame = _columns(values, kinds, ids, remap, fail)
    if "timestamp" in frame:
        mismatch = unit_mismatch(frame["timestamp"].to_numpy(float), timestamp_unit)
        if mismatch is not None:
            raise fail("timestamp", *mismatch)
    if "timestamp" in frame and timestamp_unit == "ms":
        frame["timestamp"] = frame["timestamp"] / MS_PER_S
    return sequences(frame, str(path), Filters(min_rating, k_core, remap))


def read_catalogue(path: Path) -> np.ndarray:
    """Every item id of a catalogue file: the first field of each non-empty line, before ``::``, a
    tab or a comma (MovieLens ``movies.dat``: ``id::title::genres``; its titles are Latin-1, so
    only the ids are decoded). Integers where every id is one, else text."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise DataError(f"{path}: catalogue file not found") from None
    except OSError as exc:
        raise DataError(f"{path}: cannot read the catalogue: {exc}") from None
    ids = []
    for number, line in enumerate(raw.splitlines(), start=1):
        if not line.strip():
            continue
        field = re.split(rb"::|\t|,", line, maxsplit=1)[0].strip()
        try:
            ids.append(field.decode("ascii"))
        except UnicodeDecodeError:
            raise DataError(f"{path}, line {number}: the item id is not ASCII text") from None
    if not ids:
        raise DataError(f"{path}: the catalogue lists no items")
    numeric = pd.to_numeric(pd.Series(ids), errors="coerce")
    if numeric.notna().all() and (numeric % 1 == 0).all():
        return numeric.to_numpy().astype(np.int64)
    return np.asarray(ids, dtype=str)

"""Interaction data for next-item prediction: one chronological item sequence per user.

Every loader reads its file into rows ``(user, item[, rating][, timestamp])`` in file order and
hands them to :func:`sequences`, which filters (rating threshold, k-core, users too short for
leave-one-out), orders each user's rows by timestamp with a *stable* sort (ties, and files
without time, keep file order), maps item ids to ``1..num_items`` (``0`` is padding) and reports
every row it filtered instead of dropping rows silently.

* :func:`read_movielens` — MovieLens ``u.data`` (tab) or ``ratings.dat`` (``::``), optionally gzipped.
* :func:`read_user_item` — SASRec's ``user item`` lines, chronological per user.
* :func:`read_user_lines` — one line per user: ``user i1 i2 …`` (S3-Rec / ICLRec).
* :func:`read_table` — CSV / TSV with configurable user / item / rating / timestamp columns.
* :func:`synthetic` — sequences with planted successor structure a sequence model can learn.
* :func:`cached` — any of the above, stored on disk keyed by the file's hash and the options.

Dimensions: ``u`` users, ``r`` rows (interactions).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from ablate.errors import DataError

log = logging.getLogger(__name__)

# A user needs a training item, a validation target and a test target (leave-one-out).
MIN_INTERACTIONS = 3
FIELDS = ("user", "item", "rating", "timestamp")


@dataclass
class Interactions:
    """Per-user chronological item sequences.

    ``sequences[u]`` holds item indices in ``1..num_items``; ``timestamps[u]`` (seconds, same
    length) is None for data without time. ``users[u]`` is the user's id in the source;
    ``item_ids[i]`` is the source id of item index ``i`` (``item_ids[0]`` is padding, -1).
    """

    users: np.ndarray  # [u] int64
    sequences: list[np.ndarray]  # u × [len] int64
    timestamps: list[np.ndarray] | None  # u × [len] float64
    num_items: int
    item_ids: np.ndarray  # [num_items + 1] int64
    source: str
    rows_filtered: int = 0  # rows below min_rating
    users_dropped: int = 0  # users left with fewer than MIN_INTERACTIONS (after the other filters)
    interactions_dropped: int = 0  # their interactions
    k_core_rows: int = 0  # rows removed by k-core filtering
    from_cache: bool = field(default=False, compare=False)
    # Evaluation batches kept between evaluations (:func:`.batches.eval_batches`); not saved.
    batch_cache: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def num_users(self) -> int:
        return len(self.sequences)

    @property
    def num_interactions(self) -> int:
        return int(sum(len(s) for s in self.sequences))

    def describe(self) -> str:
        """One line: sizes and everything the loader filtered."""
        return (
            f"{self.source}: {self.num_users} users, {self.num_items} items, "
            f"{self.num_interactions} interactions; {self.rows_filtered} rows below min_rating, "
            f"{self.k_core_rows} rows removed by k-core, "
            f"{self.users_dropped} users left with < {MIN_INTERACTIONS} interactions dropped "
            f"(with their {self.interactions_dropped} remaining interactions)"
        )


@dataclass(frozen=True)
class Filters:
    """What :func:`sequences` filters and how it maps ids."""

    min_rating: float | None = None  # keep rows with rating >= this
    k_core: int | None = None  # repeatedly drop users and items with < k rows until none is left
    remap: bool = True  # items → 1..m in id order; False keeps the file's ids (positive integers)


# ---------------------------------------------------------------------------------------
# Reading files


def _read_text(path: Path) -> str:
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except FileNotFoundError:
        raise DataError(f"{path}: file not found") from None
    except (OSError, EOFError) as exc:
        raise DataError(f"{path}: cannot read: {exc}") from None
    return raw.decode("latin-1")


def _check_lines(path: Path, text: str, names: tuple[str, ...], kinds: tuple[type, ...], what: str) -> None:
    """Raise ``DataError('<file>:<line>: ...')`` at the first non-blank line that is not
    ``len(names)`` fields of the given kinds."""
    for number, line in enumerate(text.splitlines(), start=1):
        fields = line.split()
        if not fields:
            continue
        if len(fields) != len(names):
            raise DataError(f"{path}:{number}: expected {what}; got {len(fields)}: {line.strip()!r}")
        for name, value, kind in zip(names, fields, kinds, strict=False):
            try:
                kind(value)
            except ValueError:
                raise DataError(
                    f"{path}:{number}: expected {what}; got {name} {value!r}, which is not "
                    f"{'an integer' if kind is int else 'a number'}"
                ) from None


def _read_columns(path: Path, text: str, names: tuple[str, ...], kinds: tuple[type, ...]) -> pd.DataFrame:
    """Whitespace-separated columns of the given kinds; malformed lines raise with file:line."""
    what = f"{len(names)} fields {', '.join(names)}"
    if not text.strip():
        raise DataError(f"{path}: no interactions (the file is empty)")
    dtypes = {n: (np.int64 if k is int else np.float64) for n, k in zip(names, kinds, strict=False)}
    try:
        frame = pd.read_csv(io.StringIO(text), sep=r"\s+", header=None, names=list(names), dtype=dtypes)
    except (ValueError, pd.errors.ParserError) as exc:
        _check_lines(path, text, names, kinds, what)  # raises with file:line
        raise DataError(f"{path}: could not parse: {str(exc).splitlines()[0]}") from None
    if frame.isna().any().any():
        _check_lines(path, text, names, kinds, what)
        raise DataError(f"{path}: could not parse: missing values")
    # pandas reads rows with fewer fields (padding with NaN, caught above) but not always rows
    # with more; count fields on the first line as a cheap guard against silently losing columns.
    first = next(line for line in text.splitlines() if line.strip())
    if len(first.split()) != len(names):
        _check_lines(path, text, names, kinds, what)
    return frame


def read_movielens(
    path: Path, min_rating: float | None = None, k_core: int | None = None, remap: bool = True
) -> Interactions:
    """Read ``user item rating timestamp`` lines (tab, whitespace or ``::`` separated)."""
    text = _read_text(path)
    if "::" in text[:4096]:
        text = text.replace("::", "\t")
    frame = _read_columns(path, text, FIELDS, (int, int, float, float))
    return sequences(frame, str(path), Filters(min_rating, k_core, remap))


def read_user_item(path: Path, k_core: int | None = None, remap: bool = True) -> Interactions:
    """SASRec format: ``user item`` per line (whitespace separated), each user's lines in
    chronological order. There is no time: file order is the order."""
    frame = _read_columns(path, _read_text(path), ("user", "item"), (int, int))
    return sequences(frame, str(path), Filters(None, k_core, remap))


def read_user_lines(path: Path, k_core: int | None = None, remap: bool = True) -> Interactions:
    """One line per user: ``user i1 i2 …`` (whitespace separated, chronological)."""
    text = _read_text(path)
    users, items = [], []
    for number, line in enumerate(text.splitlines(), start=1):
        fields = line.split()
        if not fields:
            continue
        try:
            values = [int(v) for v in fields]
        except ValueError:
            bad = next(v for v in fields if not _is_int(v))
            raise DataError(
                f"{path}:{number}: expected integer ids 'user item item …'; "
                f"got {bad!r}, which is not an integer"
            ) from None
        if len(values) < 2:
            raise DataError(
                f"{path}:{number}: expected 'user item item …'; got a user with no items: {line.strip()!r}"
            )
        users.append(np.full(len(values) - 1, values[0], dtype=np.int64))
        items.append(np.asarray(values[1:], dtype=np.int64))
    if not users:
        raise DataError(f"{path}: no interactions (the file is empty)")
    frame = pd.DataFrame({"user": np.concatenate(users), "item": np.concatenate(items)})
    return sequences(frame, str(path), Filters(None, k_core, remap))


def _is_int(value: str) -> bool:
    try:
        int(value)
    except ValueError:
        return False
    return True


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
) -> Interactions:
    """CSV / TSV: columns named (with a header) or 0-based indices (without one). Other columns
    are ignored. Users and items must be integer ids; ratings and timestamps numbers."""
    if min_rating is not None and rating is None:
        raise DataError(f"{path}: min_rating needs a rating column (set 'rating')")
    wanted = {"user": user, "item": item, "timestamp": timestamp, "rating": rating}
    wanted = {k: v for k, v in wanted.items() if v is not None}
    text = _read_text(path)
    if not text.strip():
        raise DataError(f"{path}: no interactions (the file is empty)")
    try:
        frame = pd.read_csv(
            io.StringIO(text),
            sep=sep,
            header=0 if header else None,
            dtype=str,
            keep_default_na=False,
            engine="c" if len(sep) == 1 else "python",
        )
    except pd.errors.ParserError as exc:
        raise DataError(f"{path}:{_parser_line(str(exc))}") from None
    first_line = 2 if header else 1  # file line of the first data row
    columns = {}
    for name, column in wanted.items():
        if column not in frame.columns:
            have = ", ".join(map(str, frame.columns))
            raise DataError(f"{path}: no column {column!r} for {name} (columns: {have})")
        kind = int if name in ("user", "item") else float
        values = pd.to_numeric(frame[column].str.strip(), errors="coerce")
        bad = values.isna() | ((values % 1 != 0) if kind is int else False)
        if bad.any():
            row = int(np.flatnonzero(bad.to_numpy())[0])
            raise DataError(
                f"{path}:{row + first_line}: {name} column {column!r} holds "
                f"{frame[column].iloc[row]!r}, which is not "
                f"{'an integer' if kind is int else 'a number'}"
            )
        columns[name] = values.to_numpy().astype(np.int64 if kind is int else np.float64)
    return sequences(pd.DataFrame(columns), str(path), Filters(min_rating, k_core, remap))


def _parser_line(message: str) -> str:
    """pandas' 'Expected 3 fields in line 5, saw 4' → '5: expected 3 fields, got 4'."""
    match = re.search(r"Expected (\d+) fields in line (\d+), saw (\d+)", message)
    if match:
        want, line, got = match.groups()
        return f"{line}: expected {want} fields, got {got}"
    return f" could not parse: {message.strip().splitlines()[-1]}"


# ---------------------------------------------------------------------------------------
# Rows → sequences


def sequences(frame: pd.DataFrame, source: str, filters: Filters = Filters()) -> Interactions:
    """Filter ``frame`` (columns ``user``, ``item`` and optionally ``rating``, ``timestamp``;
    rows in file order) and group it into per-user chronological sequences."""
    users_in_file = frame["user"].nunique()
    rows_filtered = 0
    if filters.min_rating is not None:
        keep = frame["rating"].to_numpy() >= filters.min_rating
        rows_filtered = int((~keep).sum())
        frame = frame[keep]
    k_core_rows = 0
    if filters.k_core:
        before = len(frame)
        frame = k_core(frame, filters.k_core)
        k_core_rows = before - len(frame)
    if not filters.remap and len(frame) and frame["item"].min() < 1:
        raise DataError(
            f"{source}: item ids must be positive integers when remap is off "
            f"(found {frame['item'].min()}); 0 is padding"
        )
    user = frame["user"].to_numpy()
    item = frame["item"].to_numpy()
    has_time = "timestamp" in frame
    time = frame["timestamp"].to_numpy() if has_time else np.zeros(len(frame))
    # Stable: by user, then timestamp, then position in the file.
    order = np.lexsort((np.arange(len(frame)), time, user))
    user, item, time = user[order], item[order], time[order]

    users, counts = np.unique(user, return_counts=True)
    kept = counts >= MIN_INTERACTIONS
    users_dropped = users_in_file - int(kept.sum())  # including users the filters left empty
    interactions_dropped = int(counts[~kept].sum())
    row_kept = np.repeat(kept, counts)
    item, time = item[row_kept], time[row_kept]
    users, counts = users[kept], counts[kept]
    if not len(users):
        raise DataError(f"{source}: no user has {MIN_INTERACTIONS} interactions after filtering")

    if filters.remap:
        item_ids, index = np.unique(item, return_inverse=True)
        index = index.astype(np.int64) + 1
        item_ids = np.concatenate([[-1], item_ids])
    else:
        index = item.astype(np.int64)
        item_ids = np.arange(int(index.max()) + 1)
        item_ids[0] = -1
    bounds = np.cumsum(counts)[:-1]
    data = Interactions(
        users=users.astype(np.int64),
        sequences=np.split(index, bounds),
        timestamps=np.split(time.astype(np.float64), bounds) if has_time else None,
        num_items=len(item_ids) - 1,
        item_ids=item_ids.astype(np.int64),
        source=source,
        rows_filtered=rows_filtered,
        users_dropped=users_dropped,
        interactions_dropped=interactions_dropped,
        k_core_rows=k_core_rows,
    )
    if rows_filtered or users_dropped or k_core_rows:
        log.warning("%s", data.describe())
    return data


def k_core(frame: pd.DataFrame, k: int) -> pd.DataFrame:
    """Rows of ``frame`` left after repeatedly removing users and items with fewer than ``k``
    rows, until every remaining user and item has at least ``k``."""
    while True:
        user_n = frame.groupby("user")["item"].transform("size").to_numpy()
        item_n = frame.groupby("item")["user"].transform("size").to_numpy()
        keep = (user_n >= k) & (item_n >= k)
        if keep.all():
            return frame
        frame = frame[keep]


# ---------------------------------------------------------------------------------------
# On-disk cache

CACHE_VERSION = 1


def cache_dir() -> Path:
    """``$ABLATE_CACHE_DIR``, else ``$XDG_CACHE_HOME/ablate``, else ``~/.cache/ablate``."""
    if os.environ.get("ABLATE_CACHE_DIR"):
        return Path(os.environ["ABLATE_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ablate"


def file_hash(path: Path) -> str:
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    except FileNotFoundError:
        raise DataError(f"{path}: file not found") from None
    except OSError as exc:
        raise DataError(f"{path}: cannot read: {exc}") from None
    return digest.hexdigest()


def cached(
    path: Path, options: dict, load: Callable[[], Interactions], directory: Path | None = None
) -> Interactions:
    """``load()``'s result, stored under ``directory`` (default :func:`cache_dir`) as
    ``seqrec-<key>.npz`` with ``key`` the hash of the file's bytes, ``options`` and the cache
    version: trials and studies over the same file and options parse it once. A cache that
    cannot be written (read-only disk) is skipped with a warning."""
    key_source = json.dumps(
        {"file": file_hash(path), "options": options, "version": CACHE_VERSION}, sort_keys=True, default=str
    )
    key = hashlib.sha256(key_source.encode()).hexdigest()[:24]
    target = (directory or cache_dir()) / f"seqrec-{key}.npz"
    if target.is_file():
        try:
            data = _from_npz(target, str(path))
            log.info("%s: loaded from cache %s", path, target)
            if data.rows_filtered or data.users_dropped or data.k_core_rows:
                log.warning("%s", data.describe())
            return data
        except (OSError, ValueError, KeyError) as exc:
            log.warning("%s: ignoring unreadable cache %s (%s)", path, target, exc)
    data = load()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(f".{os.getpid()}.tmp.npz")
        _to_npz(data, partial)
        partial.replace(target)  # atomic: a concurrent reader sees the old file or the whole new one
    except OSError as exc:
        log.warning("%s: could not write the dataset cache %s (%s)", path, target, exc)
    return data


def _to_npz(data: Interactions, target: Path) -> None:
    lengths = np.array([len(s) for s in data.sequences], dtype=np.int64)
    counts = np.array([data.rows_filtered, data.users_dropped, data.interactions_dropped, data.k_core_rows])
    arrays = dict(
        users=data.users,
        lengths=lengths,
        items=np.concatenate(data.sequences),
        item_ids=data.item_ids,
        counts=counts,
    )
    if data.timestamps is not None:
        arrays["timestamps"] = np.concatenate(data.timestamps)
    np.savez(target, **arrays)


def _from_npz(target: Path, source: str) -> Interactions:
    with np.load(target) as z:
        bounds = np.cumsum(z["lengths"])[:-1]
        rows_filtered, users_dropped, interactions_dropped, k_core_rows = (int(c) for c in z["counts"])
        return Interactions(
            users=z["users"],
            sequences=np.split(z["items"], bounds),
            timestamps=np.split(z["timestamps"], bounds) if "timestamps" in z else None,
            num_items=len(z["item_ids"]) - 1,
            item_ids=z["item_ids"],
            source=source,
            rows_filtered=rows_filtered,
            users_dropped=users_dropped,
            interactions_dropped=interactions_dropped,
            k_core_rows=k_core_rows,
            from_cache=True,
        )


# ---------------------------------------------------------------------------------------
# Synthetic


def synthetic(
    users: int, items: int, min_len: int, max_len: int, follow: float, seed: int, timestamps: bool
) -> Interactions:
    """Sequences with a planted successor map.

    A fixed random cyclic permutation maps every item to its successor. Each user starts at
    a uniformly random item; each next item is ``successor[prev]`` with probability
    ``follow``, else a draw from a Zipf(1) popularity over a random ordering of the items.
    Gaps between timestamps are 1 s plus an exponential with a one-day mean.
    """
    rng = np.random.default_rng(seed)
    cycle = rng.permutation(items) + 1
    successor = np.zeros(items + 1, dtype=np.int64)
    successor[cycle] = np.roll(cycle, -1)
    popularity = np.zeros(items + 1)
    popularity[rng.permutation(items) + 1] = 1.0 / np.arange(1, items + 1)
    popularity /= popularity.sum()

    sequences, times = [], []
    for _ in range(users):
        length = int(rng.integers(min_len, max_len + 1))
        follows = rng.random(length) < follow
        jumps = rng.choice(items + 1, size=length, p=popularity)
        seq = np.empty(length, dtype=np.int64)
        seq[0] = rng.integers(1, items + 1)
        for t in range(1, length):
            seq[t] = successor[seq[t - 1]] if follows[t] else jumps[t]
        gaps = 1.0 + np.floor(rng.exponential(86_400.0, size=length))
        sequences.append(seq)
        times.append(np.floor(rng.uniform(8e8, 9e8)) + np.cumsum(gaps) - gaps[0])
    return Interactions(
        users=np.arange(1, users + 1, dtype=np.int64),
        sequences=sequences,
        timestamps=times if timestamps else None,
        num_items=items,
        item_ids=np.r_[-1, 1 : items + 1].astype(np.int64),
        source=f"synthetic(seed={seed})",
    )

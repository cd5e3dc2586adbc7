"""Interaction data for next-item prediction: one chronological item sequence per user.

Every loader (:mod:`.readers`) reads its file into rows ``(user, item[, rating][, timestamp])`` in
file order and hands them to :func:`sequences`, which filters (rating threshold, k-core, users too
short for leave-one-out), orders each user's rows by timestamp with a *stable* sort (ties, and files
without time, keep file order), maps item ids to ``1..num_items`` (``0`` is padding) and users to
their place in id order (:mod:`.ids`), and reports every row it filtered instead of dropping rows
silently. :mod:`.cache` stores the result on disk.

* :func:`synthetic` — sequences with planted successor structure a sequence model can learn.

Dimensions: ``u`` users, ``r`` rows (interactions).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from ablate import stopping
from ablate.errors import DataError

from .ids import as_text, id_map

log = logging.getLogger(__name__)

# A user needs a training item, a validation target and a test target (leave-one-out).
MIN_INTERACTIONS = 3
FIELDS = ("user", "item", "rating", "timestamp")
STOP_CHECK_USERS = 1024  # users generated between stop-request checks


@dataclass
class Interactions:
    """Per-user chronological item sequences.

    ``sequences[u]`` holds item indices in ``1..num_items``; ``timestamps[u]`` (seconds, same
    length) is None for data without time. ``users[u]`` is the user's evaluation unit: its id in
    the source when ids are integers, else its index in ``user_ids`` (the source's text ids, None
    for integer ids). ``item_ids[i]`` is the source id of item index ``i`` (``item_ids[0]`` is
    padding: -1, or "" for text ids).
    """

    users: np.ndarray  # [u] int64
    sequences: list[np.ndarray]  # u × [len] int64
    timestamps: list[np.ndarray] | None  # u × [len] float64
    num_items: int
    item_ids: np.ndarray  # [num_items + 1] int64, or str for text ids
    source: str
    rows_filtered: int = 0  # rows below min_rating
    users_dropped: int = 0  # users left with fewer than MIN_INTERACTIONS (after the other filters)
    interactions_dropped: int = 0  # their interactions
    k_core_rows: int = 0  # rows removed by k-core filtering
    user_ids: np.ndarray | None = None  # [u] str: text ids, when ``users`` are indices
    from_cache: bool = field(default=False, compare=False)
    # Evaluation batches kept between evaluations (:func:`.batches.eval_batches`); not saved.
    batch_cache: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def num_users(self) -> int:
        return len(self.sequences)

    @property
    def num_interactions(self) -> int:
        return int(sum(len(s) for s in self.sequences))

    def id_maps(self) -> dict[str, bytes]:
        """Which source id each evaluation unit and item index stands for, as CSV files."""
        user_ids = self.users if self.user_ids is None else self.user_ids
        return {
            "users.csv": id_map(self.users, user_ids, "unit"),
            "items.csv": id_map(np.arange(1, self.num_items + 1), self.item_ids[1:], "index"),
        }

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
    if not filters.remap and len(frame):
        _check_kept_ids(frame["item"].to_numpy(), source)
    # Users as codes in id order (numeric, or text by code point), so text ids group as integers do.
    user_ids, user = np.unique(frame["user"].to_numpy(), return_inverse=True)
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
    users, counts = user_ids[users[kept]], counts[kept]
    if not len(users):
        raise DataError(f"{source}: no user has {MIN_INTERACTIONS} interactions after filtering")

    if filters.remap:
        item_ids, index = np.unique(item, return_inverse=True)
        index = index.astype(np.int64) + 1
        item_ids = (
            np.concatenate([[-1], item_ids]) if item_ids.dtype == np.int64 else as_text(["", *item_ids])
        )
    else:
        index = item.astype(np.int64)
        item_ids = np.arange(int(index.max()) + 1)
        item_ids[0] = -1
    text_users = users.dtype != np.int64
    bounds = np.cumsum(counts)[:-1]
    data = Interactions(
        users=np.arange(len(users), dtype=np.int64) if text_users else users.astype(np.int64),
        sequences=np.split(index, bounds),
        timestamps=np.split(time.astype(np.float64), bounds) if has_time else None,
        num_items=len(item_ids) - 1,
        item_ids=item_ids,
        source=source,
        rows_filtered=rows_filtered,
        users_dropped=users_dropped,
        interactions_dropped=interactions_dropped,
        k_core_rows=k_core_rows,
        user_ids=as_text(users) if text_users else None,
    )
    if rows_filtered or users_dropped or k_core_rows:
        log.warning("%s", data.describe())
    return data


def with_catalogue(data: Interactions, catalogue: np.ndarray, source: str) -> Interactions:
    """``data`` with its items numbered 1..m over every id of ``catalogue`` (in id order), the
    items no one rated included, so that negatives and rankings range over the whole catalogue.
    ``data`` numbers its items 1..n in id order (remap); an item missing from the catalogue is an
    error naming it."""
    ids = np.unique(catalogue)
    occurring = data.item_ids[1:]
    numeric = {"catalogue": ids.dtype.kind in "iu", "data": occurring.dtype.kind in "iu"}
    if numeric["catalogue"] != numeric["data"]:
        kinds = {True: "integers", False: "text"}
        raise DataError(
            f"{source}: the catalogue's ids are {kinds[numeric['catalogue']]} but the data's item ids "
            f"are {kinds[numeric['data']]}"
        )
    rows = np.searchsorted(ids, occurring)
    missing = (rows >= len(ids)) | (ids[np.minimum(rows, len(ids) - 1)] != occurring)
    if missing.any():
        raise DataError(
            f"{source}: item {occurring[missing][0]} of the data is not in the catalogue "
            f"({int(missing.sum())} of {len(occurring)} items missing)"
        )
    index = np.concatenate([[0], rows + 1]).astype(np.int64)  # old row → catalogue row
    padding = np.array([-1]) if numeric["data"] else as_text([""])
    return replace(
        data,
        sequences=[index[s] for s in data.sequences],
        num_items=len(ids),
        item_ids=np.concatenate([padding, ids]),
        batch_cache={},
    )


# With remap off item ids are embedding rows: past this an id means a table too large to train.
MAX_KEPT_ID = 2**31 - 1


def _check_kept_ids(items: np.ndarray, source: str) -> None:
    """Item ids used as indices (remap off): positive (0 is padding) and of a sane size."""
    low, high = items.min(), items.max()
    if low < 1:
        raise DataError(
            f"{source}: item ids must be positive integers when remap is off (found {low}); 0 is padding"
        )
    if high > MAX_KEPT_ID:
        raise DataError(
            f"{source}: item id {high} with remap: false would make an embedding table of {high + 1} "
            f"rows; set remap: true to number the {len(np.unique(items))} items 1..n"
        )


def k_core(frame: pd.DataFrame, k: int) -> pd.DataFrame:
    """Rows of ``frame`` left after repeatedly removing users and items with fewer than ``k``
    rows, until every remaining user and item has at least ``k``."""
    while True:
        stopping.check()  # k-core passes over a large file take a while
        user_n = frame.groupby("user")["item"].transform("size").to_numpy()
        item_n = frame.groupby("item")["user"].transform("size").to_numpy()
        keep = (user_n >= k) & (item_n >= k)
        if keep.all():
            return frame
        frame = frame[keep]


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
    for user in range(users):
        if not user % STOP_CHECK_USERS:
            stopping.check()  # a stop request interrupts generating a large data set
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

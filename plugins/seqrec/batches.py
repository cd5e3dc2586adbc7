"""Leave-one-out split and right-padded batches.

For a user sequence ``s``: training uses ``s[:-2]`` (every position predicts the next item),
validation predicts ``s[-2]`` from ``s[:-2]``, test predicts ``s[-1]`` from ``s[:-1]``. Inputs
are the last ``max_len`` items of the history. A batch is padded on the right to its longest
sequence. Dimensions: ``b`` users, ``n`` positions.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, fields, replace

import numpy as np
import torch
from torch import Tensor

from ablate.components import TokenContext

from .data import Interactions

SPLITS = ("valid", "test")


def train_part(seq: np.ndarray) -> np.ndarray:
    """The items training sees: all but the validation and test targets."""
    return seq[:-2]


def history(seq: np.ndarray, split: str) -> np.ndarray:
    """Items before the ``split`` target (validation: ``s[:-2]``, test: ``s[:-1]``)."""
    return seq[:-2] if _split(split) == "valid" else seq[:-1]


def target(seq: np.ndarray, split: str) -> int:
    return int(seq[-2] if _split(split) == "valid" else seq[-1])


def _split(split: str) -> str:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r} (expected one of {', '.join(SPLITS)})")
    return split


@dataclass
class Batch:
    items: Tensor  # [b, n] long, 0 = padding
    targets: Tensor  # [b, n] long, the item to predict at each position, 0 = none
    valid: Tensor  # [b, n] bool, True at real items
    positions: Tensor  # [b, n] long, 0..len-1 within the window
    # [b, n] float64 seconds since the window's first item: exact for whole seconds (up to 2⁵³), so
    # the time buckets and intervals see the gaps the data holds; float32 would round a gap of
    # three years to 8 s and move buckets near their edges.
    timestamps: Tensor | None
    users: Tensor  # [b] long, user ids in the source
    # Sorted ``row · (num_items + 1) + item`` over each row's training items (training batches
    # only; see :func:`seen_keys`), for negatives drawn among unseen items.
    seen: Tensor | None = None
    # [b, n] float64 seconds, same origin as ``timestamps``: the time of the item each position
    # predicts (the next one's; the target's at the last), HSTU's request time.
    request_times: Tensor | None = None

    def to(self, device: torch.device | str) -> Batch:
        moved = {f.name: getattr(self, f.name) for f in fields(self)}
        return replace(self, **{k: v.to(device) if v is not None else None for k, v in moved.items()})

    @property
    def lengths(self) -> Tensor:  # [b]
        return self.valid.sum(1)

    def token_context(self) -> TokenContext:
        return TokenContext(
            valid=self.valid,
            causal=True,
            positions=self.positions,
            timestamps=self.timestamps,
            request_times=self.request_times,
        )


def collate(
    items: list[np.ndarray],
    targets: list[np.ndarray],
    times: list[np.ndarray] | None,
    users: np.ndarray,
    next_times: np.ndarray | None = None,
) -> Batch:
    """Right-pad per-user windows (equal-length ``items``/``targets``/``times``) into a Batch;
    ``next_times`` ([b] seconds, with ``times``): each window's next item's time, for the
    request times."""
    b, n = len(items), max(len(x) for x in items)
    item_pad = np.zeros((b, n), dtype=np.int64)
    target_pad = np.zeros((b, n), dtype=np.int64)
    time_pad = np.zeros((b, n), dtype=np.float64)
    request_pad = np.zeros((b, n), dtype=np.float64)
    for row, (x, y) in enumerate(zip(items, targets, strict=False)):
        item_pad[row, : len(x)] = x
        target_pad[row, : len(y)] = y
        if times is not None:
            t = times[row] - times[row][0]
            time_pad[row, : len(t)] = t
            time_pad[row, len(t) :] = t[-1]  # padding repeats the last time: zero gaps
            if next_times is not None:
                r = np.append(t[1:], next_times[row] - times[row][0])
                request_pad[row, : len(r)] = r
                request_pad[row, len(r) :] = r[-1]
    valid = torch.from_numpy(item_pad > 0)
    timed = times is not None
    return Batch(
        items=torch.from_numpy(item_pad),
        targets=torch.from_numpy(target_pad),
        valid=valid,
        positions=torch.arange(n).expand(b, n).clone(),
        timestamps=torch.from_numpy(time_pad) if timed else None,
        users=torch.from_numpy(np.asarray(users, dtype=np.int64)),
        request_times=torch.from_numpy(request_pad) if timed and next_times is not None else None,
    )


def seen_keys(parts: list[np.ndarray], num_items: int) -> Tensor:
    """Sorted flat keys ``row · (num_items + 1) + item`` of the distinct items in each row's
    ``parts``: rows are disjoint key ranges, so one sorted array serves the whole batch."""
    width = num_items + 1
    keys = [row * width + np.unique(part) for row, part in enumerate(parts)]
    if not keys:
        return torch.zeros(0, dtype=torch.long)
    return torch.from_numpy(np.concatenate(keys).astype(np.int64))


def rows_of(batch: Batch, rows: Tensor, width: int) -> Batch:
    """The sub-batch of ``rows`` (in that order), cut to its own longest row; ``seen`` keys are
    re-keyed to the new row numbers (``width``: the key stride, ``num_items + 1``)."""
    n = int(batch.valid[rows].sum(1).max())
    seen = batch.seen
    if seen is not None:
        new_row = torch.full((len(batch.items),), -1, dtype=torch.long, device=seen.device)
        new_row[rows.to(seen.device)] = torch.arange(len(rows), device=seen.device)
        moved = new_row[seen // width]
        kept = moved >= 0
        seen = (moved[kept] * width + seen[kept] % width).sort().values
    timestamps = batch.timestamps[rows, :n] if batch.timestamps is not None else None
    request_times = batch.request_times[rows, :n] if batch.request_times is not None else None
    return Batch(
        items=batch.items[rows, :n],
        targets=batch.targets[rows, :n],
        valid=batch.valid[rows, :n],
        positions=batch.positions[rows, :n],
        timestamps=timestamps,
        users=batch.users[rows],
        seen=seen,
        request_times=request_times,
    )


def length_groups(batch: Batch, groups: int, width: int) -> list[Batch]:
    """``batch``'s rows sorted by length and cut into ``groups`` sub-batches of (nearly) equal row
    count, each padded only to its own longest row. Random ML-1M batches of 128: padded / real
    tokens 1.87 → 1.22 and attention entries × 0.54 with 4 groups.

    Longest rows first: parallel streams (ablate.training.parts) take the groups in this order, and
    starting the costliest first balances them — SASRec ML-1M at 2 threads, 6.4–6.6 s/epoch
    against 7.3–7.8 s shortest first (benchmarks/RESULTS.md, session 12)."""
    order = torch.argsort(batch.lengths, stable=True, descending=True)
    return [rows_of(batch, rows, width) for rows in order.tensor_split(min(groups, len(order)))]


def train_batches(
    data: Interactions, max_len: int, batch_size: int, generator: torch.Generator, pool: int = 1
) -> Iterator[Batch]:
    """One epoch over the users with at least one training target, shuffled by ``generator``.

    With ``pool > 1``, each run of ``pool · batch_size`` shuffled users is sorted by length
    before it is cut into batches, and the batches are shuffled again: every user is still
    seen once per epoch, but a batch pads to a length near its rows' own (attention costs
    ``n²`` per row)."""
    users = np.array([u for u, s in enumerate(data.sequences) if len(train_part(s)) >= 2], dtype=np.int64)
    shuffle = torch.randperm(len(users), generator=generator, device=generator.device)
    order = users[shuffle.cpu().numpy()]
    chunks = [order[start : start + batch_size] for start in range(0, len(order), batch_size)]
    if pool > 1:
        lengths = np.array([min(len(s) - 3, max_len) for s in data.sequences])
        chunks = []
        for start in range(0, len(order), pool * batch_size):
            run = order[start : start + pool * batch_size]
            run = run[np.argsort(lengths[run], kind="stable")]
            chunks += [run[i : i + batch_size] for i in range(0, len(run), batch_size)]
        again = torch.randperm(len(chunks), generator=generator, device=generator.device).cpu().numpy()
        chunks = [chunks[i] for i in again]
    for chunk in chunks:
        parts = [train_part(data.sequences[u]) for u in chunk]
        times = next_times = None
        if data.timestamps is not None:
            times = [train_part(data.timestamps[u])[:-1][-max_len:] for u in chunk]
            next_times = np.array([train_part(data.timestamps[u])[-1] for u in chunk])
        batch = collate(
            [p[:-1][-max_len:] for p in parts],
            [p[1:][-max_len:] for p in parts],
            times,
            data.users[chunk],
            next_times,
        )
        yield replace(batch, seen=seen_keys(parts, data.num_items))


# Evaluation batches of a split are kept on the data (validation runs every few epochs) up to
# this many padded tokens (≈ 30 bytes each): ML-1M's 6,040 users are 0.67 M.
EVAL_CACHE_TOKENS = 1 << 23


def eval_batches(
    data: Interactions, split: str, max_len: int, batch_size: int
) -> Iterable[tuple[Batch, list[np.ndarray], np.ndarray]]:
    """Batches whose only target is the ``split`` item at each user's last position, with each
    user's full history (for excluding seen items) and the users' rows in ``data``. Users go
    in order of history length (little padding). Made once per split and batch size when they
    fit :data:`EVAL_CACHE_TOKENS`."""
    key = (split, max_len, batch_size)
    if key in data.batch_cache:
        return data.batch_cache[key]
    lengths = np.array([len(history(s, split)) for s in data.sequences])
    made = _eval_batches(data, split, max_len, batch_size, np.argsort(lengths, kind="stable"))
    if np.minimum(lengths, max_len).sum() > EVAL_CACHE_TOKENS:
        return made
    data.batch_cache[key] = list(made)
    return data.batch_cache[key]


def _eval_batches(
    data: Interactions, split: str, max_len: int, batch_size: int, order: np.ndarray
) -> Iterator[tuple[Batch, list[np.ndarray], np.ndarray]]:
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        histories = [history(data.sequences[u], split) for u in chunk]
        windows = [h[-max_len:] for h in histories]
        targets = []
        for u, w in zip(chunk, windows, strict=False):
            y = np.zeros(len(w), dtype=np.int64)
            y[-1] = target(data.sequences[u], split)
            targets.append(y)
        times = next_times = None
        if data.timestamps is not None:
            times = [history(data.timestamps[u], split)[-max_len:] for u in chunk]
            # The target's time: the one after the history.
            next_times = np.array([data.timestamps[u][len(h)] for u, h in zip(chunk, histories, strict=True)])
        yield collate(windows, targets, times, data.users[chunk], next_times), histories, chunk

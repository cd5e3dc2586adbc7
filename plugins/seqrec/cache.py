"""The dataset cache: a parsed seqrec file stored on disk, keyed by the file's bytes and the
loader's options, so trials and studies over the same file parse it once. An entry is trained on
only where its content still has the digest written beside it, in a folder under the compiled
kernels' rules (this user's own, writable by no one else): another user cannot swap it, and an
edited or damaged one is parsed again."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ablate.cache import cache_dir, entry_problem, file_digest, keep_entry
from ablate.errors import DataError
from ablate.kernels.build import Unavailable, private_folder

from .data import Interactions

log = logging.getLogger(__name__)

# 2: text ids (``item_ids`` as str, ``user_ids``).
CACHE_VERSION = 2


def file_hash(path: Path) -> str:
    if path.is_dir():
        raise DataError(f"{path}: is a folder, not a data file")
    try:
        return file_digest(path)
    except FileNotFoundError:
        raise DataError(f"{path}: file not found") from None
    except OSError as exc:
        raise DataError(f"{path}: cannot read: {exc}") from None


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
    try:
        private_folder(target.parent)
    except Unavailable as exc:
        log.warning("%s: not using the dataset cache (%s)", path, exc)
        return load()
    if target.is_file():
        try:
            if problem := entry_problem(target):
                raise ValueError(f"{problem}: parsed again")
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
        keep_entry(partial, target)
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
    if data.user_ids is not None:
        arrays["user_ids"] = data.user_ids
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
            user_ids=z["user_ids"] if "user_ids" in z else None,
            from_cache=True,
        )

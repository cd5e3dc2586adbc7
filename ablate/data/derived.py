"""Data sets made here from another entry's download (``derive`` in ``datasets.toml``): the recipes.

Some data sets the studies use were cut from a publisher's file whose licence forbids copies
(MovieLens): no one may serve the cut, but anyone can make it. Such an entry names the entry it
is made from (``from``), a recipe below (``recipe``) and the recipe's settings. ``ablate data
fetch`` downloads the source into the cache as any entry is downloaded, runs the recipe over its
lines and keeps the result at the entry's path, checked against the entry's SHA-256. That digest is
of the content (decompressed, for a path ending in ``.gz``): a compressor's bytes differ from one
gzip build to the next, the lines do not.
"""

from __future__ import annotations

import gzip
import hashlib
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from itertools import chain
from pathlib import Path
from typing import IO

from ablate.data.catalog import Dataset, data_dir, lookup
from ablate.errors import DataError

Lines = Iterable[tuple[int, bytes]]  # (line number, the line with its end) of the source file


def users_between(lines: Lines, users: list[int], where: str) -> Iterator[bytes]:
    """MovieLens ``user::item::rating::time`` lines of the users ``users[0]..users[1]``, in the
    file's order (ML-1M's ratings.dat is sorted by user: its first lines)."""
    first, last = users
    for number, line in lines:
        head = line.split(b"::", 1)[0]
        if not head.strip().isdigit():
            raise DataError(f"{where}:{number}: not a MovieLens user::item::rating::time line")
        if first <= int(head) <= last:
            yield line


def drop_penultimate(lines: Lines, users: list[int], where: str) -> Iterator[bytes]:
    """SASRec ``user item`` lines, grouped by user in time order, with the second-to-last line of
    each user in ``users`` left out."""
    listed, seen = set(users), set()
    group: list[bytes] = []
    current = None
    for number, line in chain(lines, [(0, b"")]):  # an empty last line ends the last group
        head = line.split(None, 1)[0] if line.strip() else b""
        if line and not head.isdigit():
            raise DataError(f"{where}:{number}: not a `user item` line")
        user = int(head) if line else None
        if user != current and current is not None:
            if current in listed:
                if len(group) < 2:
                    raise DataError(f"{where}: user {current} has {len(group)} line(s), no second-to-last")
                del group[-2]
            yield from group
            seen.add(current)
            group = []
        if user is not None and user in seen:
            raise DataError(f"{where}:{number}: user {user}'s lines are not together")
        current = user
        group.append(line)
    if missing := listed - seen:
        raise DataError(f"{where}: holds no line of user(s) {sorted(missing)[:5]} the recipe names")


# recipe name → (what it does, in a few words; the function of the lines)
RECIPES: dict[str, tuple[str, Callable[..., Iterator[bytes]]]] = {
    "movielens-users": ("the ratings of users {users[0]}-{users[1]}", users_between),
    "drop-penultimate": ("{count} users' second-to-last item left out", drop_penultimate),
}


def describe(dataset: Dataset) -> str:
    """How ``dataset`` is made, in one clause (``derived from ml-1m: the ratings of users 1-2999``)."""
    recipe = dataset.derive["recipe"]
    what = RECIPES[recipe][0].format(**dataset.derive, count=len(dataset.derive.get("users", [])))
    return f"derived from {dataset.derive['from']}: {what}"


def problem(dataset: Dataset) -> str | None:
    """What is wrong with a ``derive`` table, or None (the registry's own test calls this)."""
    derive = dataset.derive
    if derive.get("recipe") not in RECIPES:
        return f"derive.recipe: one of {', '.join(RECIPES)}"
    try:
        source = lookup(derive.get("from"))
    except ValueError as exc:
        return f"derive.from: {exc}"
    if source.derive or not source.url:
        return f"derive.from: '{source.name}' is not downloaded from a URL"
    if len(dataset.files) != 1 or not next(iter(dataset.files.values()))[0]:
        return "a derived entry is one file with its SHA-256 recorded: nothing else checks the recipe"
    return None


def make(dataset: Dataset, made_from: Path, say: Callable[[str], None]) -> Path:
    """Derive ``dataset``'s file from its source's download (``made_from``, in the cache) and keep
    it when its content's SHA-256 is the recorded one (``DataError`` in one line otherwise)."""
    ((relpath, (sha, _)),) = dataset.files.items()
    target = data_dir() / relpath
    source = lookup(dataset.derive["from"])
    recipe = RECIPES[dataset.derive["recipe"]][1]
    settings = {k: v for k, v in dataset.derive.items() if k not in ("from", "recipe")}
    partial = target.with_name(target.name + ".deriving")
    target.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    try:
        with open(made_from, "rb") as src, _sink(partial, target.suffix == ".gz") as sink:
            for line in recipe(enumerate(src, 1), where=str(made_from), **settings):
                sink.write(line)
                digest.update(line)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    if digest.hexdigest() != sha:
        partial.unlink()
        raise DataError(
            f"data set '{dataset.name}': refused, what {source.name}'s download gave ({made_from}) "
            f"derives to content of SHA-256 {digest.hexdigest()[:16]}…, expected {sha[:16]}…: "
            f"not the file it was made from"
        )
    partial.replace(target)
    say(f"{dataset.name}: {target} made, its content checked against the recorded SHA-256")
    return target


@contextmanager
def _sink(path: Path, zipped: bool) -> Iterator[IO[bytes]]:
    """A file to write the derived lines to: gzip for a ``.gz`` target, with no name or time in
    its header, so that one build of zlib writes the same bytes each time."""
    with open(path, "wb") as raw:
        if not zipped:
            yield raw
            return
        with gzip.GzipFile(filename="", fileobj=raw, mode="wb", compresslevel=6, mtime=0) as packed:
            yield packed  # type: ignore[misc]

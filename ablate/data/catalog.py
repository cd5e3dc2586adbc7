"""Data sets by name: the registry (``datasets.toml``, the one table of names), where a named data
set's files are on this machine, and its download.

Where the files are: under the folder ``$ABLATE_DATA_MIRROR`` names, when it is set — a mirror
stands in for the network (CI and the tests point it at the shared data folder beside the clone),
laid out as the registry's paths (``movielens/ml-100k/u.data``); else in the download cache,
``$ABLATE_DATA_DIR`` or ``<cache_dir>/datasets`` (:func:`ablate.cache.cache_dir`), laid out the
same way. A file with a recorded SHA-256 is checked against it wherever it is read from (a
``.gz`` file's content, decompressed: what the loaders read).

Downloads go through pooch (a registry of checksums, retries, a progress bar); its downloader here
resumes an interrupted download with an HTTP ``Range`` request (:class:`ResumingDownloader`). An
entry with ``derive`` is made here from another entry's download (:mod:`ablate.derived`).

In a study file, ``task.data`` names a data set (``ml-100k``, or ``{name: ml-100k, k_core: 5}``
with settings of the study's own over the entry's loader settings) or lists several
(``[beauty, sports]``: one study per data set, :mod:`ablate.commands.across`); a mapping with a ``path``
reads the user's own file as before.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import tomllib
import zlib
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ablate.cache import cache_dir, file_digest
from ablate.schema import Vocabulary

if TYPE_CHECKING:
    pass

MIRROR_ENV = "ABLATE_DATA_MIRROR"  # a folder standing in for the network
DATA_DIR_ENV = "ABLATE_DATA_DIR"  # where downloads are kept
RETRIES = 2  # a failed download (or a checksum mismatch) is tried this many more times
CHUNK = 1 << 14  # bytes read at a time: what an interrupted read got, less its last chunk, is kept
# How the study files spelt a mirrored data set before names existed: this prefix and its path
# under the mirror (the shared data folder beside the clone, seen from studies/). Trials recorded
# then carry the text-based fingerprint of that spelling (:func:`legacy_task`); the data's
# digest, recorded with new trials and checked, is what makes them the same data.
LEGACY_PREFIX = "../../shared/data/"


@dataclass(frozen=True)
class Dataset:
    """One registry entry (see the head of ``datasets.toml`` for what each field means)."""

    name: str
    title: str
    task: str
    data: dict[str, Any]
    split: str
    path: str
    files: dict[str, tuple[str, int]]  # path under the mirror → (sha256 or "", bytes or 0)
    url: str
    licence: str
    citation: str
    redistribute: bool
    member: str = ""
    why: str = ""
    derive: dict[str, Any] = field(default_factory=dict)  # made from another entry: ablate.derived

    @property
    def fetchable(self) -> bool:
        """Whether ``ablate data fetch`` can get it: downloaded, or made from a download."""
        return bool(self.url or self.derive)

    @property
    def verified(self) -> bool:
        """Whether every file has a recorded SHA-256."""
        return all(sha for sha, _ in self.files.values())

    @property
    def size(self) -> int:
        return sum(size for _, size in self.files.values())

    def source_of(self, relpath: str) -> str:
        """The URL a file is downloaded from (a folder's ``{file}`` filled in; an archive's URL)."""
        return self.url.format(file=Path(relpath).name)


@cache
def registry() -> Vocabulary[Dataset]:
    """Every named data set, as ``datasets.toml`` has them."""
    table = tomllib.loads((Path(__file__).with_name("datasets.toml")).read_text(encoding="utf-8"))
    entries = {}
    for name, entry in table.items():
        files = {path: (sha, size) for path, (sha, size) in entry.pop("files").items()}
        entries[name] = Dataset(name=name, files=files, **entry)
    return Vocabulary("data set", entries)


def lookup(name: Any) -> Dataset:
    """The entry of ``name``; ``ValueError`` with a did-you-mean for an unknown one."""
    return registry()[registry().check(name)]


def mirror() -> Path | None:
    folder = os.environ.get(MIRROR_ENV)
    return Path(folder).expanduser().resolve() if folder else None  # relative: to the working folder


def data_dir() -> Path:
    folder = os.environ.get(DATA_DIR_ENV)
    return (Path(folder).expanduser() if folder else cache_dir() / "datasets").resolve()


def root() -> Path:
    """Where named data sets are read from here: the mirror when one is set, else the cache."""
    return mirror() or data_dir()


# (resolved path, size, mtime in ns) → SHA-256 of a .gz file's decompressed content
_CONTENT_DIGESTS: dict[tuple[str, int, int], str] = {}


def content_digest(file: Path) -> str:
    """The SHA-256 the registry records for a file: of its bytes, or, for a ``.gz`` file, of its
    decompressed content (gzip builds write different bytes for the same lines). Raises
    ``OSError`` (or ``EOFError``, ``zlib.error``) where it cannot be read."""
    if file.suffix != ".gz":
        return file_digest(file)
    stat = file.stat()
    key = (str(file.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _CONTENT_DIGESTS:
        digest = hashlib.sha256()
        with gzip.open(file, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        _CONTENT_DIGESTS[key] = digest.hexdigest()
    return _CONTENT_DIGESTS[key]


def checksum_problem(dataset: Dataset, relpath: str, file: Path) -> str | None:
    sha = dataset.files[relpath][0]
    if not sha:
        return None
    try:
        got = content_digest(file)
    except (OSError, EOFError, zlib.error) as exc:
        return f"{file} cannot be read ({exc})"
    if got != sha:
        what = "SHA-256 of its decompressed content" if file.suffix == ".gz" else "SHA-256"
        return f"{file} does not hold the recorded data ({what} {got[:16]}…, expected {sha[:16]}…)"
    return None


def present(dataset: Dataset) -> bool:
    """Whether every file of ``dataset`` is where it is read from (:func:`root`) and checks out."""
    base = root()
    files = [(rel, base / rel) for rel in dataset.files]
    return all(f.is_file() for _, f in files) and not any(checksum_problem(dataset, r, f) for r, f in files)


def how_to_get(dataset: Dataset) -> str:
    """The sentence saying how to get a data set that is not here."""
    where = f"set {MIRROR_ENV} to a folder holding {dataset.path} (the mirror's layout)"
    if not dataset.fetchable:
        return f"it cannot be downloaded ({dataset.why}): {where}"
    if dataset.derive:
        source = lookup(dataset.derive["from"])
        return (
            f"run `ablate data fetch {dataset.name}` where {_host(source.url)} can be reached "
            f"(it is made from {source.name}'s download), or {where}"
        )
    return f"run `ablate data fetch {dataset.name}` where {_host(dataset.url)} can be reached, or {where}"


def _host(url: str) -> str:
    return url.split("/")[2] if "//" in url else url


# -- a study file's task.data -------------------------------------------------------------------

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
(``[beauty, sports]``: one study per data set, :mod:`ablate.across`); a mapping with a ``path``
reads the user's own file as before.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import sys
import tomllib
import zipfile
import zlib
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .cache import cache_dir, file_digest
from .errors import DataError
from .schema import Vocabulary

if TYPE_CHECKING:
    from .studyfile import Locator

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


def _checksum_problem(dataset: Dataset, relpath: str, file: Path) -> str | None:
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
    return all(f.is_file() for _, f in files) and not any(_checksum_problem(dataset, r, f) for r, f in files)


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


def locate(dataset: Dataset, fetch: bool = True, say=None) -> Path:
    """Where ``task.data.path`` of ``dataset`` is on this machine. With a mirror: its file, which
    must be there (``DataError`` naming the data set and where it was looked for). Without one:
    the cache, downloaded into first when ``fetch`` and not there yet (``say``: where the licence
    and progress lines go, default stderr). ``fetch=False`` only names the place."""
    base = mirror()
    if base is not None:
        if fetch:
            for relpath in dataset.files:
                file = base / relpath
                if not file.is_file():
                    raise DataError(
                        f"data set '{dataset.name}': {relpath} is not in the data mirror: looked for "
                        f"{file} ({MIRROR_ENV}={base})"
                    )
                if problem := _checksum_problem(dataset, relpath, file):
                    raise DataError(f"data set '{dataset.name}': {problem}")
        return base / dataset.path
    if fetch and not present(dataset):
        download(dataset, say=say)
    return data_dir() / dataset.path


def download(dataset: Dataset, progress: bool | None = None, retries: int = RETRIES, say=None) -> Path:
    """Download every file of ``dataset`` not in the cache yet (each checked against its SHA-256;
    one without a recorded hash is kept and its hash printed, flagged as unverified). The licence
    is printed first. Raises ``DataError`` with one line on any failure."""
    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    if not dataset.fetchable:
        raise DataError(f"data set '{dataset.name}' is not here: {how_to_get(dataset)}")
    base = data_dir()
    say(f"{dataset.name}: {dataset.licence}. Cite: {dataset.citation}")
    if dataset.derive:
        if present(dataset):
            return base / dataset.path
        from .derived import make

        return make(dataset, progress, retries, say)
    import pooch
    import requests

    pooch.get_logger().setLevel("WARNING")
    progress = sys.stderr.isatty() if progress is None else progress
    downloader = ResumingDownloader(base / ".partial", progress)
    for relpath, (sha, _) in dataset.files.items():
        target = base / relpath
        if target.is_file() and not _checksum_problem(dataset, relpath, target):
            continue
        url = dataset.source_of(relpath)
        fetched = f".archives/{dataset.name}/{Path(url).name}" if dataset.member else relpath
        known = None if dataset.member or not sha else f"sha256:{sha}"
        store = pooch.create(path=base, base_url="", registry={fetched: known}, urls={fetched: url})
        store.retry_if_failed = retries
        try:
            got = Path(store.fetch(fetched, downloader=downloader))
        except (requests.RequestException, OSError) as exc:
            raise DataError(
                f"data set '{dataset.name}': cannot download {url} ({type(exc).__name__}); "
                f"{how_to_get(dataset)}"
            ) from None
        except ValueError as exc:  # pooch: the downloaded file's hash is not the recorded one
            raise DataError(f"data set '{dataset.name}': {url}: refused, {exc}".replace("\n", " ")) from None
        if dataset.member:
            _extract(got, dataset.member, target)
        if problem := _checksum_problem(dataset, relpath, target):
            target.unlink()
            raise DataError(f"data set '{dataset.name}': refused, {problem}")
        if not sha:
            say(
                f"warning: {relpath}: no SHA-256 is recorded for it, so nothing verified this download; "
                f"its SHA-256 is {content_digest(target)}"
            )
    return base / dataset.path


def _extract(archive: Path, member: str, target: Path) -> None:
    """``member`` of a zip ``archive`` written to ``target`` (through a temporary name)."""
    partial = target.with_name(target.name + ".extracting")
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        with zipfile.ZipFile(archive) as packed, packed.open(member) as src, open(partial, "wb") as dst:
            shutil.copyfileobj(src, dst, CHUNK)
    except (zipfile.BadZipFile, KeyError) as exc:
        raise DataError(f"{archive}: cannot read {member} from it ({exc})") from None
    partial.replace(target)


class ResumingDownloader:
    """A pooch downloader that resumes. pooch's own HTTPDownloader streams into a fresh temporary
    file each attempt, so an interrupted download starts again from byte 0 (pooch 1.9); this one
    keeps the bytes it got in ``<folder>/<digest of the URL>.part`` and asks only for the rest
    (``Range: bytes=N-``). A server that ignores the range (200, not 206) sends the whole file,
    which replaces the partial one. pooch checks the finished file's hash as it does its own."""

    def __init__(self, folder: Path, progress: bool = False, timeout: float = 30.0):
        self.folder, self.progress, self.timeout = folder, progress, timeout

    def __call__(self, url: str, output_file: Any, pooch: Any = None, check_only: bool = False) -> Any:
        import requests

        if check_only:
            return requests.head(url, timeout=self.timeout, allow_redirects=True).ok
        self.folder.mkdir(parents=True, exist_ok=True)
        part = self.folder / (hashlib.sha256(url.encode()).hexdigest()[:24] + ".part")
        have = part.stat().st_size if part.exists() else 0
        headers = {"Range": f"bytes={have}-"} if have else {}
        with requests.get(url, headers=headers, stream=True, timeout=self.timeout) as response:
            if response.status_code == 416:  # the partial file is whole already (or longer)
                have, mode = 0, None
            else:
                response.raise_for_status()
                resumed = have and response.status_code == 206
                mode, have = ("ab", have) if resumed else ("wb", 0)
            if mode is not None:
                length = have + int(response.headers.get("Content-Length", 0) or 0)
                bar = self._bar(length, have, url)
                with open(part, mode) as sink:
                    for chunk in response.iter_content(CHUNK):
                        sink.write(chunk)
                        if bar is not None:
                            bar.update(len(chunk))
                if bar is not None:
                    bar.close()
        shutil.move(str(part), str(output_file))
        return None

    def _bar(self, total: int, done: int, url: str):
        if not self.progress:
            return None
        from tqdm import tqdm

        return tqdm(
            total=total or None, initial=done, unit="B", unit_scale=True, desc=Path(url).name, file=sys.stderr
        )


# -- a study file's task.data -------------------------------------------------------------------


@dataclass(frozen=True)
class NamedData:
    """``task.data`` spelt by name: the entry, the settings the study wrote beside the name, and
    the file (or folder) its path names on this machine."""

    dataset: Dataset
    written: dict[str, Any] = field(default_factory=dict)
    local: Path = Path()
    entries: tuple[Any, ...] = ()  # task.data lists several: each entry as written (this is the first)

    def options(self) -> dict[str, Any]:
        """The ``task.data`` mapping the task validates: the loader settings, the study's own
        over them, and the path of the files here."""
        return {**self.dataset.data, **self.written, "path": str(self.local)}

    def spelt_by_name(self, options: dict[str, Any]) -> dict[str, Any]:
        """The task's options as dumped for a fingerprint, its data named instead of placed: where
        the files sit on this machine (mirror or cache) does not change the numbers."""
        data = options.get("data")
        if not isinstance(data, dict):
            return options
        return {**options, "data": {**data, "path": f"data set {self.dataset.name}"}}

    def spelt_as_before(self, task: dict[str, Any]) -> dict[str, Any]:
        """The study file's task mapping with ``data`` as study files spelt this data set before
        names (:data:`LEGACY_PREFIX` and its mirror path): what the text-based fingerprint of the
        trials recorded then was computed from."""
        return {
            **task,
            "data": {**self.dataset.data, **self.written, "path": LEGACY_PREFIX + self.dataset.path},
        }


def entries_of(raw_data: Any) -> list[Any] | None:
    """The entries of ``task.data`` when it lists several data sets, else None."""
    return list(raw_data) if isinstance(raw_data, list) else None


def label_of(entry: Any) -> str | None:
    """The name an entry of ``task.data`` gives, or None (a path of the user's own)."""
    if isinstance(entry, str):
        return entry
    return entry.get("name") if isinstance(entry, dict) and isinstance(entry.get("name"), str) else None


def entry_override(entry: Any) -> str:
    """The ``task.data=…`` override that picks one entry of a list (JSON is YAML's flow style)."""
    return "task.data=" + json.dumps(entry)


def named_data(
    where: Locator, raw_task: dict[str, Any], check_files: bool
) -> tuple[NamedData | None, dict[str, Any]]:
    """``task.data`` of a study file read for names: the named data set the study trains on (None
    for a path of its own; a list's entries in its ``entries``: the study stands for its first entry
    until :mod:`ablate.across` loads one study per entry), and the task mapping with ``data`` as
    the task reads it. Every problem names the key; a data set not here is a ``DataError`` saying
    how to get it."""
    raw = raw_task.get("data")
    entries = entries_of(raw)
    labels: list[str] = []
    if entries is not None:
        if not entries:
            raise where.error(("task", "data"), "an empty list: name at least one data set")
        for i, entry in enumerate(entries):
            label = label_of(entry)
            if label is None:
                raise where.error(
                    ("task", "data", i), "a list of data sets holds names (ml-100k or {name: ml-100k, ...})"
                )
            if label in labels:
                raise where.error(("task", "data", i), f"data set '{label}' is listed twice")
            labels.append(label)
        raw = entries[0]
    name = label_of(raw)
    if name is None:
        return None, raw_task
    key = ("task", "data") if entries is None else ("task", "data", 0)
    try:
        dataset = lookup(name)
    except ValueError as exc:
        raise where.error(key if isinstance(raw, str) else (*key, "name"), str(exc)) from None
    written = {k: v for k, v in raw.items() if k != "name"} if isinstance(raw, dict) else {}
    if "path" in written:
        raise where.error(
            (*key, "path"), f"data set '{name}' has its own files: give a name or a path, not both"
        )
    try:
        local = locate(dataset, fetch=check_files)
    except DataError as exc:
        raise DataError(f"{where.path}: task.data: {exc}") from None
    named = NamedData(dataset, written, local, tuple(entries or ()))
    return named, {**raw_task, "data": named.options()}

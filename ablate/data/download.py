"""Getting a named data set's files here: from the mirror, the download cache, or its publisher
(pooch: checksums, retries, an interrupted download resumed with HTTP ``Range``), a derived one
made from its source's download (:mod:`.derived`)."""

from __future__ import annotations

import hashlib
import shutil
import sys
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ablate.data import derived
from ablate.data.catalog import (
    CHUNK,
    MIRROR_ENV,
    RETRIES,
    Dataset,
    checksum_problem,
    content_digest,
    data_dir,
    how_to_get,
    lookup,
    mirror,
    present,
)
from ablate.errors import DataError

if TYPE_CHECKING:
    pass


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
                if problem := checksum_problem(dataset, relpath, file):
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
        source = lookup(dataset.derive["from"])
        why = " (its licence forbids copies)" if not dataset.redistribute else ""
        say(f"{dataset.name}: {derived.describe(dataset)}, made here from its download{why}")
        return derived.make(dataset, download(source, progress=progress, retries=retries, say=say), say)
    import pooch
    import requests

    pooch.get_logger().setLevel("WARNING")
    progress = sys.stderr.isatty() if progress is None else progress
    downloader = ResumingDownloader(base / ".partial", progress)
    for relpath, (sha, _) in dataset.files.items():
        target = base / relpath
        if target.is_file() and not checksum_problem(dataset, relpath, target):
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
        if problem := checksum_problem(dataset, relpath, target):
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

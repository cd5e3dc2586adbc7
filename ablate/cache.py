"""Where the package keeps what it derives from its inputs: parsed data sets and trained
tokenizers (tasks) and compiled kernels (:mod:`ablate.kernels`); how a kept entry is checked (the
SHA-256 of its content, written beside it, before it is used); and the content digest of a data
file, which names what a trial was trained on."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def cache_dir() -> Path:
    """``$ABLATE_CACHE_DIR``, else ``$XDG_CACHE_HOME/ablate``, else ``~/.cache/ablate``."""
    if os.environ.get("ABLATE_CACHE_DIR"):
        return Path(os.environ["ABLATE_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ablate"


# (resolved path, size, mtime in ns) → SHA-256: a file read once per process while it is unchanged.
_DIGESTS: dict[tuple[str, int, int], str] = {}


def file_digest(path: Path) -> str:
    """The SHA-256 of a file's content (streamed), or of a folder's files (their relative names
    and digests, in name order). Raises ``OSError`` where it cannot be read."""
    path = Path(path)
    if path.is_dir():
        digest = hashlib.sha256()
        for child in sorted(p for p in path.rglob("*") if p.is_file()):
            digest.update(f"{child.relative_to(path).as_posix()}\0{file_digest(child)}\n".encode())
        return digest.hexdigest()
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _DIGESTS:
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        _DIGESTS[key] = digest.hexdigest()
    return _DIGESTS[key]


def digest_beside(entry: Path) -> Path:
    """Where the SHA-256 of a cache entry's content is written: beside it, as ``.sha256``."""
    return entry.with_suffix(".sha256")


def entry_problem(entry: Path) -> str | None:
    """Why the cache entry ``entry`` may not be used (an edit, a write cut short), or None where
    its content has the digest written beside it."""
    try:
        written = digest_beside(entry).read_text(encoding="ascii").strip()
        if written != file_digest(entry):
            return "its content is not what was written"
    except (OSError, UnicodeDecodeError):
        return "no digest of it was written"
    return None


def keep_entry(partial: Path, entry: Path) -> None:
    """``partial`` put in place as the cache entry ``entry``, its digest written beside it first;
    each is replaced atomically, so a reader between the two finds a mismatch and rebuilds."""
    partial_digest = digest_beside(entry).with_suffix(f".{os.getpid()}.tmp")
    partial_digest.write_text(file_digest(partial), encoding="ascii")
    partial_digest.replace(digest_beside(entry))
    partial.replace(entry)

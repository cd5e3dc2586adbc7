"""Where the package keeps what it derives from its inputs: parsed data sets (tasks) and compiled
kernels (:mod:`ablate.kernels`); and the content digest of a data file, which names what a trial
was trained on."""

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

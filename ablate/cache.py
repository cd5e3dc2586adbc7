"""Where the package keeps what it derives from its inputs: parsed data sets (tasks) and compiled
kernels (:mod:`ablate.kernels`)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """``$ABLATE_CACHE_DIR``, else ``$XDG_CACHE_HOME/ablate``, else ``~/.cache/ablate``."""
    if os.environ.get("ABLATE_CACHE_DIR"):
        return Path(os.environ["ABLATE_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ablate"

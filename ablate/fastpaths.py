"""One switch for the package's fast paths: faster forms of a computation that give the same
numbers as the plain torch form they stand in for (or, for ``lanes``, the same distribution).

* ``kernels``: the fused C kernels of :mod:`ablate.kernels` (dropout, causal softmax-dropout,
  Sinkhorn-Knopp, stream mixing, dot products with gathered rows); off, their torch forms run
  (:mod:`ablate.kernels.unfused`), as on a machine without a C compiler.
* ``lanes``: CPU dropout drawn from counter-based lanes (:func:`ablate.components.dropout`);
  off, torch's own dropout (other draws).
* ``dense``: a sampled softmax's per-position negatives scored by one ``[t, m]`` matmul on small
  catalogues instead of gathering their rows (``ablate_plugins.seqrec.losses``).
* ``fbgemm``: fbgemm-gpu's jagged conversions where ``fbgemm_gpu`` is importable
  (:mod:`ablate.jagged`).

All are on unless ``ABLATE_FAST_PATHS`` says otherwise: ``0`` switches them all off, ``1`` on,
and a list such as ``kernels=0,fbgemm=0`` names some. ``ABLATE_FUSED_KERNELS=0`` is the older
name of ``kernels=0``. In code, :func:`fast_paths` switches them for a block (benchmarks,
tests) and :func:`set_fast_paths` from then on; both take precedence over the environment.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache

from ablate.errors import AblateError

PATHS = ("kernels", "lanes", "dense", "fbgemm")

# Switched in code: these names' values stand instead of the environment's.
_chosen: dict[str, bool] = {}


def enabled(path: str) -> bool:
    """Whether fast path ``path`` (one of :data:`PATHS`) is on."""
    if path in _chosen:
        return _chosen[path]
    return _from_environment(
        os.environ.get("ABLATE_FAST_PATHS", ""), os.environ.get("ABLATE_FUSED_KERNELS", "")
    )[PATHS.index(path)]


@cache
def _from_environment(value: str, fused_kernels: str) -> tuple[bool, ...]:
    """The paths' values that ``ABLATE_FAST_PATHS=value`` and ``ABLATE_FUSED_KERNELS=fused_kernels``
    ask for, in :data:`PATHS` order."""
    chosen = dict.fromkeys(PATHS, value.strip() != "0")
    if fused_kernels.strip() == "0":
        chosen["kernels"] = False
    if value.strip() not in ("", "0", "1"):
        for item in value.split(","):
            name, _, on = item.partition("=")
            if name.strip() not in PATHS or on.strip() not in ("0", "1"):
                raise AblateError(
                    f"ABLATE_FAST_PATHS={value!r}: {item.strip()!r} is not one of "
                    f"{', '.join(f'{p}=0|1' for p in PATHS)} (or 0 / 1 for all)"
                )
            chosen[name.strip()] = on.strip() == "1"
    return tuple(chosen[path] for path in PATHS)


def set_fast_paths(on: bool | None = None, **paths: bool) -> None:
    """Switch every fast path (``on``) and then the ones named (``kernels=False``) from now on, in
    every thread; ``on=None`` and no names leave them as they are."""
    unknown = set(paths) - set(PATHS)
    if unknown:
        raise TypeError(f"unknown fast paths {sorted(unknown)}: the fast paths are {', '.join(PATHS)}")
    if on is not None:
        _chosen.update(dict.fromkeys(PATHS, bool(on)))
    _chosen.update({name: bool(value) for name, value in paths.items()})


@contextmanager
def fast_paths(on: bool | None = None, **paths: bool) -> Iterator[None]:
    """:func:`set_fast_paths` for the block: ``with fast_paths(False):`` runs the plain torch
    forms, ``with fast_paths(kernels=False):`` everything but the C kernels."""
    saved = dict(_chosen)
    try:
        set_fast_paths(on, **paths)
        yield
    finally:
        _chosen.clear()
        _chosen.update(saved)

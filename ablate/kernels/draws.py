"""Dropout and its draws: which generator (or, for members stacked under ``vmap``, which supplied
keys) a call's counter-based lanes come from, and the dropout function and module the
components use (re-exported by :mod:`ablate.components`)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ablate import fastpaths, kernels
from ablate.kernels import lanes
from ablate.kernels.lanes import keep_threshold


def thread_dropout_generator() -> torch.Generator | None:
    """The generator this thread's CPU dropout draws from (:func:`dropout_generator`; None: global)."""
    return getattr(_DROPOUT, "generator", None)


def dropout_key() -> int | Tensor:
    """One 64-bit draw of this thread's dropout generator: the key of a call's lanes; under
    :func:`dropout_keys`, the next key supplied."""
    keys = getattr(_DROPOUT, "keys", None)
    if keys is not None:
        return next(keys)
    return _draw(thread_dropout_generator())


def _draw(generator: torch.Generator | None) -> int:
    return int(torch.empty((), dtype=torch.int64).random_(-(2**63), None, generator=generator))


def key_source() -> Iterator[int | Tensor]:
    """The keys :func:`dropout_key` would return here from now on, one per ``next``: the keys
    supplied (:func:`dropout_keys`), else this thread's generator's draws. For a caller that
    draws a block's keys itself and supplies them (a compiled forward: ``train.compile``)."""
    keys = getattr(_DROPOUT, "keys", None)
    return keys if keys is not None else _draws(thread_dropout_generator())


def _draws(generator: torch.Generator | None) -> Iterator[int]:
    while True:
        yield _draw(generator)


def lanes_dropout(device: torch.device) -> bool:
    """Whether dropout on ``device`` draws counter-based lanes: on the CPU with the ``lanes`` fast
    path on, and on any device while keys are supplied (:func:`dropout_keys`)."""
    supplied = getattr(_DROPOUT, "keys", None) is not None
    return supplied or (device.type == "cpu" and fastpaths.enabled("lanes"))


def keep_lanes(shape: tuple[int, ...], device: torch.device, key: int | None = None) -> Tensor:
    """``shape`` int16 lanes uniform over -32768..32767: entry ``i`` (row-major) is 16-bit lane
    ``i mod 4`` of splitmix64's output for counter ``i // 4`` under ``key`` (default: a fresh
    :func:`dropout_key`). The fused kernels (:mod:`ablate.kernels`) compute the same lanes where
    they use them and compare them with :func:`keep_threshold` themselves."""
    return lanes.lanes(shape, device, dropout_key() if key is None else key)


def keep_mask(shape: tuple[int, ...], keep: float, device: torch.device) -> Tensor:
    """``shape`` bool, each True with probability ``keep`` (to within 2⁻¹⁷), independently."""
    return keep_lanes(shape, device) >= keep_threshold(keep)


# The generator CPU dropout keys are drawn from in this thread (None: the global one), so that
# loss parts trained in parallel streams (ablate.training.parts) each draw from their own.
_DROPOUT = threading.local()


@contextmanager
def _set(name: str, value: object) -> Iterator[None]:
    """This thread's ``name`` draw setting is ``value`` while the block runs."""
    saved = getattr(_DROPOUT, name, None)
    setattr(_DROPOUT, name, value)
    try:
        yield
    finally:
        setattr(_DROPOUT, name, saved)


def dropout_generator(generator: torch.Generator | None) -> AbstractContextManager[None]:
    """CPU dropout masks drawn in this thread while the block runs come from ``generator``."""
    return _set("generator", generator)


def dropout_keys(keys: Iterator[int | Tensor]) -> AbstractContextManager[None]:
    """Dropout in this thread takes its keys from ``keys`` while the block runs, on any device:
    members stacked under ``vmap`` pass each member's own keys (a batched tensor), drawn before
    from its generator in the order it would draw them alone (benchmarks/stacked.py)."""
    return _set("keys", keys)


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """Inverted dropout, as :func:`torch.nn.functional.dropout`: zero each entry with probability
    ``p`` and scale the rest by ``1 / (1 - p)``. On CPU (and on any device while keys are
    supplied: :func:`dropout_keys`) the mask is :func:`keep_mask`'s (``p`` rounded to a multiple
    of 2⁻¹⁶), applied by :func:`ablate.kernels.dropout` (the fused kernel where it is built: one
    pass each way, no mask stored); elsewhere, or with the ``lanes`` fast path off
    (:mod:`ablate.fastpaths`), torch's own dropout."""
    if not training or p == 0.0:
        return x
    if not lanes_dropout(x.device):
        return F.dropout(x, p, True)
    return kernels.dropout(x, dropout_key(), keep_threshold(1.0 - p), 1.0 / (1.0 - p))


class Dropout(nn.Module):
    """:func:`dropout` as a module: ``nn.Dropout``'s drop-in, active in training mode only."""

    def __init__(self, p: float = 0.5):
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"

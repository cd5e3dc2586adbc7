"""Jagged token layouts: a batch of variable-length rows as ``values [t, ...]`` (the real
tokens, row after row) plus ``offsets [b + 1]`` (row ``r`` is ``values[offsets[r]:offsets[r+1]]``).

Position-wise layers (embeddings, projections, FFN, norms, residual joins, losses) run on the
``t`` real tokens; attention runs on padded blocks ``[b, n, ...]``. The conversions use
fbgemm-gpu's ``jagged_to_padded_dense`` / ``dense_to_jagged`` / ``asynchronous_complete_cumsum``
when ``fbgemm_gpu`` is importable (an optional dependency, the ``fbgemm`` extra) and the
``fbgemm`` fast path is on (:mod:`ablate.fastpaths`), and a pure-torch form otherwise; both give
the same values and gradients.

A layout is handed to the blocks inside :class:`~ablate.components.TokenContext`:
:class:`Padded` (the identity) or :class:`Jagged`. Dimensions: ``b`` rows, ``n`` padded length,
``t`` real tokens, ``d`` width.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ablate import fastpaths

_PROBED: list[bool] = []  # the probe's answer, once made


def _probe() -> bool:
    """Whether fbgemm's kernels are there; the first call imports fbgemm_gpu (registering
    torch.ops.fbgemm.*). Deferred to first use: it takes longer to import than reading a study
    file (`ablate validate`) takes. Kept in a list, not looked up in ``globals()``, which a
    ``torch.compile`` trace cannot call (``train.compile``: a graph break at every jagged op)."""
    if not _PROBED:
        try:
            import fbgemm_gpu  # noqa: F401

            found = hasattr(torch.ops.fbgemm, "jagged_to_padded_dense")
        except Exception:  # ImportError, or a build that does not match this torch
            found = False
        _PROBED.append(found)
        globals()["HAVE_FBGEMM"] = found  # ``jagged.HAVE_FBGEMM`` from now on without asking
    return _PROBED[0]


def __getattr__(name: str) -> bool:
    if name == "HAVE_FBGEMM":
        return _probe()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _fbgemm(use_fbgemm: bool | None) -> bool:
    """None: fbgemm when it is importable and the ``fbgemm`` fast path is on
    (:mod:`ablate.fastpaths`; read at call time, so a caller can switch it off)."""
    if use_fbgemm is None:
        return fastpaths.enabled("fbgemm") and _probe()  # off: fbgemm_gpu is not even imported
    _probe()  # asked for explicitly: the ops must be registered
    return use_fbgemm


def complete_cumsum(lengths: Tensor, use_fbgemm: bool | None = None) -> Tensor:
    """``[b]`` lengths → ``[b + 1]`` offsets starting at 0."""
    if _fbgemm(use_fbgemm):
        return torch.ops.fbgemm.asynchronous_complete_cumsum(lengths)
    return torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])


def to_padded(values: Tensor, offsets: Tensor, n: int, use_fbgemm: bool | None = None) -> Tensor:
    """``values [t, *f]`` → ``[b, n, *f]`` with zeros after each row's end."""
    if _fbgemm(use_fbgemm):
        flat = values.reshape(values.shape[0], -1)
        dense = torch.ops.fbgemm.jagged_to_padded_dense(flat, [offsets], [n], 0.0)
        return dense.reshape(dense.shape[0], n, *values.shape[1:])
    b = offsets.numel() - 1
    lengths = offsets[1:] - offsets[:-1]
    valid = torch.arange(n, device=values.device)[None, :] < lengths[:, None]  # [b, n]
    return values.new_zeros(b, n, *values.shape[1:]).masked_scatter(
        valid.view(b, n, *[1] * (values.dim() - 1)), values
    )


def to_values(dense: Tensor, offsets: Tensor, use_fbgemm: bool | None = None) -> Tensor:
    """``dense [b, n, *f]`` → ``values [t, *f]``: each row's first ``length`` positions."""
    if _fbgemm(use_fbgemm) and dense.is_floating_point():
        b, n = dense.shape[:2]
        flat = dense.reshape(b, n, -1)
        values = torch.ops.fbgemm.dense_to_jagged(flat, [offsets])[0]
        return values.reshape(values.shape[0], *dense.shape[2:])
    lengths = offsets[1:] - offsets[:-1]
    valid = torch.arange(dense.shape[1], device=dense.device)[None, :] < lengths[:, None]
    return dense[valid]


def last_of_rows(dense: Tensor, lengths: Tensor) -> Tensor:
    """``[b, n, ...] → [b, ...]``: each right-padded row's last real token (``lengths ≥ 1``)."""
    return dense[torch.arange(len(lengths), device=dense.device), lengths - 1]


class Padded:
    """Tokens stay ``[b, n, ...]``: the conversions are the identity."""

    jagged = False

    def values(self, dense: Tensor) -> Tensor:
        return dense

    def padded(self, values: Tensor) -> Tensor:
        return values

    def last(self, tokens: Tensor, lengths: Tensor) -> Tensor:
        return last_of_rows(tokens, lengths)


class Jagged:
    """Real tokens only: ``values [t, ...]`` with ``offsets [b + 1]``, padded to length ``n``
    for attention."""

    jagged = True

    def __init__(self, offsets: Tensor, n: int, use_fbgemm: bool | None = None):
        self.offsets, self.n, self.use_fbgemm = offsets, n, use_fbgemm

    @classmethod
    def from_valid(cls, valid: Tensor, use_fbgemm: bool | None = None) -> Jagged:
        """From a right-padded ``valid [b, n]`` mask."""
        offsets = complete_cumsum(valid.sum(1), use_fbgemm)
        return cls(offsets, valid.shape[1], use_fbgemm)

    def values(self, dense: Tensor) -> Tensor:
        return to_values(dense, self.offsets, self.use_fbgemm)

    def padded(self, values: Tensor) -> Tensor:
        return to_padded(values, self.offsets, self.n, self.use_fbgemm)

    def last(self, tokens: Tensor, lengths: Tensor) -> Tensor:
        """``[t, ...] → [b, ...]``: each row's last real token (rows of ``lengths ≥ 1``)."""
        return tokens[self.offsets[1:] - 1]

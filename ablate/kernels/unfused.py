"""The torch forms of the fused kernels: what runs where a kernel does not (no C compiler, the
``kernels`` fast path off, GPU tensors, other dtypes), and the references the kernels are
tested against. Each computes what its kernel computes, with the same dropout draws.

Dimensions: ``s`` residual streams, ``d`` width, ``t`` positions, ``k`` gathered rows per
position, ``m`` table rows (or keys per attention row).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ablate.kernels.lanes import lanes, strided_lanes


def dropout(x: Tensor, key: int, threshold: int, scale: float) -> Tensor:
    """``where(lane ≥ threshold, x · scale, 0)``, entry ``i`` of ``x`` (row-major) drawing lane ``i``."""
    # A float mask: a bool one would be converted inside the product, forward and backward.
    return x * (lanes(x.shape, x.device, key) >= threshold).to(x.dtype).mul_(scale)


def softmax_dropout(
    logits: Tensor,
    key: int,
    lane_strides: tuple[int, int, int],
    threshold: int,
    scale: float,
    offset: int = 0,
    causal: bool = True,
) -> Tensor:
    """``where(lane ≥ threshold, softmax(logits masked causally) · scale, 0)`` for ``logits [r,
    rows, m]``; row ``i`` sees keys ``j ≤ offset + i`` when ``causal``; entry ``[b, i, j]`` draws
    lane ``base + b · matrix_stride + i · row_stride + j``."""
    r, rows, m = logits.shape
    if causal:
        seen = torch.ones(rows, m, dtype=torch.bool, device=logits.device).tril(offset)
        logits = logits.masked_fill(~seen, float("-inf"))
    keep = strided_lanes((r, rows, m), lane_strides, logits.device, key) >= threshold
    return logits.softmax(-1) * keep * scale


def sinkhorn(logits: Tensor, iters: int) -> Tensor:
    """Sinkhorn-Knopp over the last two dims of ``logits [..., s, s]``: ``M = exp(logits)``, then
    ``iters`` rounds of column then row normalisation."""
    m = torch.exp(logits - logits.amax(dim=(-2, -1), keepdim=True))  # scaling cancels below
    for _ in range(iters):
        m = m / m.sum(dim=-2, keepdim=True)  # columns
        m = m / m.sum(dim=-1, keepdim=True)  # rows
    return m


def mix_in(x: Tensor, pre: Tensor) -> Tensor:
    """``h = Σ_s pre_s x_s`` per token: ``x [..., s, d]``, ``pre [..., s]`` → ``[..., d]``."""
    return torch.einsum("...s,...sd->...d", pre, x)


def mix_out(x: Tensor, res: Tensor, post: Tensor, y: Tensor) -> Tensor:
    """``out_t = Σ_s res_ts x_s + post_t y`` per token: ``x [..., s, d]``, ``res [..., s, s]``,
    ``post [..., s]``, ``y [..., d]``."""
    return torch.einsum("...ts,...sd->...td", res, x) + post.unsqueeze(-1) * y.unsqueeze(-2)


def gathered_dot(h: Tensor, table: Tensor, index: Tensor) -> Tensor:
    """``out[t, j] = h[t] · table[index[t, j]]`` from the ``[t, k, d]`` gathered rows."""
    # F.embedding: its backward sums repeated rows in a fixed order (advanced indexing's adds
    # them with atomics across threads, differently from run to run).
    return torch.einsum("td,tkd->tk", h, F.embedding(index, table))

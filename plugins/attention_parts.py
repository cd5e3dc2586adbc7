"""Pieces several plugin modules build attention from: head bookkeeping and the learned relative
position / time tables (HSTU / FuXi-α) that the ``ams`` attention and the ``rel_pos`` /
``rel_time`` bias channels share.

Dimensions: ``b`` batch, ``n`` tokens, ``h`` heads, ``e`` head width, ``d`` model width,
``L`` max_len.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ablate.components import TokenContext, default

__all__ = [
    "check_heads",
    "head_width",
    "split_heads",
    "merge_heads",
    "logit_bias",
    "true_lengths",
    "RelativePositionTable",
    "time_buckets",
    "RelativeTimeTable",
]


def check_heads(kind: str, d: int, h: int) -> None:
    """Heads must split the model width evenly."""
    if d % h:
        raise ValueError(
            f"{kind} attention: model width dim={d} is not divisible by heads={h}; "
            f"choose heads among the divisors of {d} or change dim"
        )


def head_width(kind: str, d: int, h: int, given: int | None) -> int:
    """A per-head width: ``given``, else ``d / h`` (which must then be whole)."""
    if given is None and d % h:
        raise ValueError(
            f"{kind} attention: model width dim={d} is not divisible by heads={h}; choose heads among "
            f"the divisors of {d}, or set the per-head widths (qk_dim, v_dim) explicitly"
        )
    return default(given, d // h)


def split_heads(t: Tensor, h: int) -> Tensor:
    """``[b, n, (h e)] -> [b, h, n, e]``."""
    b, n, _ = t.shape
    return t.view(b, n, h, -1).transpose(1, 2)


def merge_heads(t: Tensor) -> Tensor:
    """``[b, h, n, e] -> [b, n, (h e)]``."""
    b, h, n, e = t.shape
    return t.transpose(1, 2).reshape(b, n, h * e)


def logit_bias(tokens: TokenContext, like: Tensor) -> Tensor | float:
    """The bias channels' additive logit bias ``[b|1, h|1, n, n]`` in ``like``'s dtype, or 0."""
    return 0.0 if tokens.logit_bias is None else tokens.logit_bias.to(like.dtype)


def true_lengths(tokens: TokenContext, like: Tensor) -> Tensor:
    """``[b, 1, 1, 1]`` number of real tokens of each row (at least 1), in ``like``'s dtype."""
    return tokens.valid.sum(-1).clamp(min=1).to(like.dtype)[:, None, None, None]


# ----------------------------------------------------------------------------------------------
# Relative position / time tables (HSTU / FuXi-α).


class RelativePositionTable(nn.Module):
    """Learned relative-position bias, one scalar per offset (HSTU / FuXi-α ``_pos_w``)::

        P[b, i, j] = w[clamp(pos_j − pos_i, −(L−1), L−1)]        w: [2L − 1], L = max_len

    ``forward(tokens) -> [b, n, n]`` (query i, key j), built from ``tokens.positions``; offsets
    beyond ±(L−1) share the outermost entries. Shared across heads; initialised N(0, 0.02²) as in
    HSTU. Used by the ``ams`` attention and the ``rel_pos`` bias channel.
    """

    def __init__(self, max_len: int):
        super().__init__()
        self.max_len = max_len
        self.weight = nn.Parameter(torch.empty(2 * max_len - 1).normal_(std=0.02))

    def forward(self, tokens: TokenContext) -> Tensor:
        p = tokens.positions
        offset = (p[:, None, :] - p[:, :, None]).clamp(-(self.max_len - 1), self.max_len - 1)
        return self.weight[offset + self.max_len - 1]


def time_buckets(dt: Tensor, buckets: int, log_base_step: float = 0.301) -> Tensor:
    """``clamp(⌊ln max(|Δt|, 1) / log_base_step⌋, 0, buckets)`` as long (HSTU / FuXi-α bucketing;
    0.301 ≈ ln 1.35, so a bucket spans a factor of 1.35 in |Δt|, |Δt| ≤ 1 s falls in bucket 0)."""
    return (dt.abs().clamp(min=1).log() / log_base_step).floor().clamp(0, buckets).long()


class RelativeTimeTable(nn.Module):
    """Learned bias over log-bucketed time differences (HSTU / FuXi-α ``_ts_w``)::

        T[b, i, j] = w[bucket(t_i − t_j)]        w: [buckets + 1], bucket() as in :func:`time_buckets`

    ``forward(tokens) -> [b, n, n]`` (query i, key j) from ``tokens.timestamps``. The difference is
    taken to the query's own time t_i. HSTU's and FuXi-α's code use the time of the item *after*
    the query (t_{i+1} − t_j); that time is not part of a causal prefix, so it is not used here.
    Shared across heads; initialised N(0, 0.02²) as in HSTU. Used by the ``ams`` attention and the
    ``rel_time`` bias channel.
    """

    def __init__(self, buckets: int = 128, log_base_step: float = 0.301):
        super().__init__()
        self.buckets, self.log_base_step = buckets, log_base_step
        self.weight = nn.Parameter(torch.empty(buckets + 1).normal_(std=0.02))

    def forward(self, tokens: TokenContext) -> Tensor:
        if tokens.timestamps is None:
            raise ValueError(
                "relative time table: these tokens carry no timestamps; the task's data must "
                "provide the feature 'timestamps'"
            )
        t = tokens.timestamps
        return self.weight[time_buckets(t[:, :, None] - t[:, None, :], self.buckets, self.log_base_step)]

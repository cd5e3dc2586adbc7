"""Pieces several plugin modules build attention from: head bookkeeping, the pointwise attentions'
normalisers and initialisation, and the learned relative position / time tables (HSTU / FuXi-α)
that the ``ams`` attention and the ``rel_pos`` / ``rel_time`` bias channels share.

Dimensions: ``b`` batch, ``n`` tokens, ``h`` heads, ``e`` head width, ``d`` model width,
``L`` max_len.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ablate.components import TokenContext, default, values_readable

__all__ = [
    "check_heads",
    "head_width",
    "split_heads",
    "merge_heads",
    "logit_bias",
    "true_lengths",
    "NORMALISERS",
    "INITIALISATIONS",
    "PROJECTION_INITIALISATIONS",
    "RelativePositionTable",
    "time_buckets",
    "QUERY_TIMES",
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
# Pointwise (SiLU) attention: what the weights are divided by, and how the projections start.


def padded_width(tokens: TokenContext, like: Tensor, width: int) -> float:
    """The fixed padded width ``width`` (HSTU's and FuXi-α's ``N = max_seq_len + max_output_len``),
    whatever the row's length or the batch's padding."""
    return float(width)


def row_lengths(tokens: TokenContext, like: Tensor, width: int) -> Tensor:
    """:func:`true_lengths`, in a normaliser's signature."""
    return true_lengths(tokens, like)


# The ``normaliser`` option of the pointwise attentions → ``N`` in ``SiLU(q kᵀ + bias) / N``, called
# as ``(tokens, like, width)``: a ``[b, 1, 1, 1]`` tensor or a number.
NORMALISERS = {"length": row_lengths, "padded": padded_width}


def keep_torch_initialisation(inputs: list[nn.Linear], output: nn.Linear) -> None:
    """``nn.Linear``'s own initialisation: nothing to redo."""


def published_initialisation(inputs: list[nn.Linear], output: nn.Linear) -> None:
    """HSTU's and FuXi-α's: input projections (``_uvqk``) ``N(0, 0.02²)``, the output projection's
    weight Xavier-uniform (its bias keeps ``nn.Linear``'s)."""
    for layer in inputs:
        nn.init.normal_(layer.weight, std=0.02)
    nn.init.xavier_uniform_(output.weight)


# The ``init`` option of the pointwise attentions → how their projections are initialised.
INITIALISATIONS = {"torch": keep_torch_initialisation, "published": published_initialisation}


# ----------------------------------------------------------------------------------------------
# Softmax and FR-Graph attention: FT-Transformer's / T2G-Former's ``initialization``.


def keep_linear_initialisation(
    query_key: list[Tensor], value: Tensor | None, biases: list, heads: int
) -> None:
    """``nn.Linear``'s own: weights and biases uniform in ±1/√fan_in; nothing to redo."""


def kaiming_initialisation(query_key: list[Tensor], value: Tensor | None, biases: list, heads: int) -> None:
    """FT-Transformer's and T2G-Former's ``"kaiming"``: ``nn.Linear``'s weights (Kaiming-uniform,
    a = √5), every projection's bias zero."""
    for bias in biases:
        if bias is not None:
            nn.init.zeros_(bias)


def xavier_initialisation(query_key: list[Tensor], value: Tensor | None, biases: list, heads: int) -> None:
    """FT-Transformer's and T2G-Former's ``"xavier"``: the query and key (head and tail) weights
    Xavier-uniform with gain 1/√2, the value weight too when there is more than one head; every
    projection's bias zero."""
    for weight in query_key + ([value] if value is not None and heads > 1 else []):
        nn.init.xavier_uniform_(weight, gain=2**-0.5)
    kaiming_initialisation(query_key, value, biases, heads)


# The ``init`` option of the softmax and fr_graph attentions → how their projections start, called
# as ``(query_key weights, value weight, biases, heads)`` (each weight ``[d_out, d_in]``, a view of
# a fused projection's rows where the kind fuses them).
PROJECTION_INITIALISATIONS = {
    "torch": keep_linear_initialisation,
    "kaiming": kaiming_initialisation,
    "xavier": xavier_initialisation,
}


# ----------------------------------------------------------------------------------------------
# Relative position / time tables (HSTU / FuXi-α).


def table_lookup(weight: Tensor, index: Tensor) -> Tensor:
    """``weight[index]`` for a 1-D table: ``index_select``, whose gradient is ``index_add_``; at
    ``[32, 200, 200]`` indices into 129 entries, forward + backward took 5.0 ms against 19.0 ms
    for advanced indexing (its backward accumulates through ``index_put_``), one CPU thread."""
    return weight.index_select(0, index.reshape(-1)).view(index.shape)


class RelativePositionTable(nn.Module):
    """Learned relative-position bias, one scalar per offset (HSTU / FuXi-α ``_pos_w``)::

        P[b, i, j] = w[clamp(pos_j − pos_i, −(L−1), L−1)]        w: [2L − 1], L = max_len

    ``forward(tokens) -> [b|1, n, n]`` (query i, key j), built from ``tokens.positions``; offsets
    beyond ±(L−1) share the outermost entries. Where every row has the same positions (right-
    padded sequences: 0..n−1) the one ``[1, n, n]`` table broadcasts over the batch. Shared
    across heads; initialised N(0, 0.02²) as in HSTU. Used by the ``ams`` attention and the
    ``rel_pos`` bias channel.
    """

    def __init__(self, max_len: int):
        super().__init__()
        self.max_len = max_len
        self.weight = nn.Parameter(torch.empty(2 * max_len - 1).normal_(std=0.02))

    def forward(self, tokens: TokenContext) -> Tensor:
        p = tokens.positions
        if len(p) > 1 and values_readable(p) and bool((p == p[:1]).all()):  # one [n, n] gather, not b
            p = p[:1]
        offset = (p[:, None, :] - p[:, :, None]).clamp(-(self.max_len - 1), self.max_len - 1)
        return table_lookup(self.weight, offset + self.max_len - 1)


def own_times(tokens: TokenContext) -> Tensor:
    """``[b, n]`` each query's own timestamp."""
    return tokens.timestamps


def request_times(tokens: TokenContext) -> Tensor:
    """``[b, n]`` the time of the interaction each query's prediction is for (its next token's)."""
    if tokens.request_times is None:
        raise ValueError(
            "relative time table: time_reference 'request' takes each query's time from the item "
            "after it (HSTU / FuXi-α), but these tokens carry no request times; the task must "
            "provide them (seqrec does wherever the data has timestamps), or use time_reference 'query'"
        )
    return tokens.request_times


# The ``time_reference`` option of the time tables → the query-side time of ``Δt = t_query − t_j``:
# the query's own time (ours: within the causal prefix) or the request time (HSTU / FuXi-α: the
# next item's time, which is not part of the prefix — its time, never its identity).
QUERY_TIMES = {"query": own_times, "request": request_times}


def time_buckets(dt: Tensor, buckets: int, log_base_step: float = 0.301) -> Tensor:
    """``clamp(⌊ln max(|Δt|, 1) / log_base_step⌋, 0, buckets)`` as long (HSTU / FuXi-α bucketing;
    0.301 ≈ ln 1.35, so a bucket spans a factor of 1.35 in |Δt|, |Δt| ≤ 1 s falls in bucket 0)."""
    return (dt.abs().clamp(min=1).log() / log_base_step).floor().clamp(0, buckets).long()


class RelativeTimeTable(nn.Module):
    """Learned bias over log-bucketed time differences (HSTU / FuXi-α ``_ts_w``)::

        T[b, i, j] = w[bucket(τ_i − t_j)]        w: [buckets + 1], bucket() as in :func:`time_buckets`

    ``forward(tokens) -> [b, n, n]`` (query i, key j) from ``tokens.timestamps``. ``τ_i`` is set by
    ``reference`` (:data:`QUERY_TIMES`): ``query``, the query's own time t_i (the default: nothing
    outside the causal prefix), or ``request``, the time of the item after the query, t_{i+1}
    (``tokens.request_times``; for a row's last query, the time of the item it predicts), as
    HSTU's and FuXi-α's code do. Shared across heads; initialised N(0, 0.02²) as in HSTU. Used by
    the ``ams`` attention and the ``rel_time`` bias channel.
    """

    def __init__(self, buckets: int = 128, log_base_step: float = 0.301, reference: str = "query"):
        super().__init__()
        self.buckets, self.log_base_step = buckets, log_base_step
        self.query_times = QUERY_TIMES[reference]
        self.weight = nn.Parameter(torch.empty(buckets + 1).normal_(std=0.02))

    def forward(self, tokens: TokenContext) -> Tensor:
        if tokens.timestamps is None:
            raise ValueError(
                "relative time table: these tokens carry no timestamps; the task's data must "
                "provide the feature 'timestamps'"
            )
        t, query = tokens.timestamps, self.query_times(tokens)
        return table_lookup(
            self.weight, time_buckets(query[:, :, None] - t[:, None, :], self.buckets, self.log_base_step)
        )

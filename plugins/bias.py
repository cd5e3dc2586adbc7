"""Bias channels: position and time information for ordered tokens.

Dimensions: ``b`` batch, ``n`` tokens, ``d`` model width, ``h`` heads, ``e`` head width,
``L`` max_len (positions table size). Logit biases are ``[b|1, h|1, n, n]`` (query ``i``,
key ``j``); timestamps are seconds (float64 from the seqrec task, so whole seconds stay exact),
only their differences ``t_i − t_j`` are used.

* on the embeddings: ``abs_pos`` (learned), ``sinusoidal`` (fixed);
* on queries / keys: ``rope``;
* on the logits: ``rel_pos``, ``rel_time`` (learned tables shared with the ``ams`` attention;
  one for all blocks, or with ``per_layer`` one per block as in HSTU), ``log_time_gap`` (TiSASRec
  as the seed simplifies it).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Literal

import torch
from pydantic import Field
from torch import Tensor, nn

from ablate.components import BiasChannel, BuildContext, Options, TokenContext, values_readable
from ablate_plugins.attention_parts import QUERY_TIMES, RelativePositionTable, RelativeTimeTable


def check_positions(positions: Tensor, max_len: int, kind: str = "abs_pos") -> None:
    """Raise unless every position indexes a row of an ``[L, d]`` table (``0 ≤ p < L``). Under
    ``vmap`` (members stacked) values cannot be read: an out-of-range position then fails as the
    table's index."""
    if positions.numel() == 0 or not values_readable(positions):
        return
    lo, hi = (int(p) for p in torch.aminmax(positions))
    if lo < 0 or hi >= max_len:
        raise ValueError(
            f"{kind}: token positions span {lo}..{hi} but the position table has max_len={max_len} "
            f"rows (0..{max_len - 1}); raise max_len or truncate sequences to at most {max_len} tokens"
        )


def xavier_normal_table(table: Tensor) -> None:
    """``N(0, 2 / (L + d))``: SASRec's code, and HSTU's and FuXi-α's models, which re-initialise
    every parameter outside their blocks and item table so."""
    nn.init.xavier_normal_(table)


def truncated_normal_table(table: Tensor) -> None:
    """``N(0, 1/d)`` cut at ±2 standard deviations: the position table of the HSTU code base's
    SASRec (its model leaves the input preprocessor's own initialisation in place)."""
    std = table.shape[-1] ** -0.5
    nn.init.trunc_normal_(table, std=std, a=-2 * std, b=2 * std)


# ``abs_pos``'s ``init`` option → how its table starts.
POSITION_INITS = {"xavier_normal": xavier_normal_table, "truncated_normal": truncated_normal_table}


class AbsolutePositionOptions(Options):
    # "start": token i of a row gets row i of the table (HSTU, FuXi-α: right-padded rows). "end":
    # rows are counted back from the last real token, which always gets row L - 1 — what SASRec's
    # left-padded windows do, so the row that predicts the next item is the same for every user,
    # however long its history.
    align: Literal["start", "end"] = "start"
    init: Literal[tuple(POSITION_INITS)] = "xavier_normal"


class AbsolutePosition(BiasChannel):
    """Learned absolute positions (SASRec; HSTU's and FuXi-α's trainers): ``x ← x + P[positions]``,
    ``P: [L, d]``; with ``align: end`` every position of a row is shifted so that its last real
    token's is ``L − 1`` (SASRec), with ``start`` not (HSTU, FuXi-α). ``P`` starts Xavier-normal
    (SASRec, HSTU, FuXi-α) or, with ``init: truncated_normal``, ``N(0, 1/d)`` cut at ±2σ (the HSTU
    code base's SASRec).

    Scaling the token embeddings (SASRec's ``√d``) is the task's business, not this channel's:
    otherwise replacing ``abs_pos`` by another bias kind would silently change the input scale.
    Padded tokens look up row 0; their value is unused."""

    Options = AbsolutePositionOptions
    ordered_only = True

    def __init__(self, options: AbsolutePositionOptions, ctx: BuildContext):
        super().__init__(options, ctx)
        self.table = nn.Embedding(ctx.max_len, ctx.dim)
        POSITION_INITS[options.init](self.table.weight)

    def embed(self, x: Tensor, tokens: TokenContext) -> Tensor:
        rows = self.table.num_embeddings
        positions = end_aligned(tokens, rows) if self.options.align == "end" else tokens.positions
        positions = positions.masked_fill(~tokens.valid, 0)
        check_positions(positions, rows)
        return x + self.table(positions)


def end_aligned(tokens: TokenContext, rows: int) -> Tensor:
    """``[b, n]`` positions counted back from each row's last real token, which gets ``rows − 1``
    (SASRec's and TiSASRec's left-padded windows); padded tokens' values are meaningless."""
    last = (tokens.lengths - 1)[:, None]  # rows are right-padded
    return tokens.positions + (rows - 1 - tokens.positions.gather(1, last))


# ---------------------------------------------------------------------------------------------
# fixed positions: sinusoidal embeddings and rotary q/k


class FrequencyOptions(Options):
    base: float = Field(10000.0, gt=1.0)  # wavelengths run from 2π to 2π·base


def inverse_frequencies(width: int, base: float, dtype: torch.dtype, device: torch.device) -> Tensor:
    """``θ_i = base^{−2i/width}`` for ``i = 0 … ⌈width/2⌉ − 1``."""
    return base ** (-torch.arange(0, width, 2, dtype=dtype, device=device) / width)


def angles(positions: Tensor, width: int, base: float, dtype: torch.dtype) -> Tensor:
    """``positions [b, n] → p·θ_i [b, n, ⌈width/2⌉]``, computed in at least float32."""
    dtype = torch.promote_types(dtype, torch.float32)
    return positions.to(dtype).unsqueeze(-1) * inverse_frequencies(width, base, dtype, positions.device)


class SinusoidalPosition(BiasChannel):
    """Fixed sinusoidal positions (Vaswani et al.): ``x ← x + PE[positions]`` with
    ``PE[p, 2i] = sin(p·θ_i)``, ``PE[p, 2i+1] = cos(p·θ_i)``, ``θ_i = base^{−2i/d}``.

    Computed on the fly, so it has no table and no length limit; padded positions get the
    value of their index, which is unused."""

    Options = FrequencyOptions
    ordered_only = True

    def embed(self, x: Tensor, tokens: TokenContext) -> Tensor:
        d = x.shape[-1]
        a = angles(tokens.positions, d, self.options.base, x.dtype)  # [b, n, ⌈d/2⌉]
        pe = torch.stack([a.sin(), a.cos()], dim=-1).flatten(-2)[..., :d]  # interleave sin, cos
        return x + pe.to(x.dtype)


class Rotary(BiasChannel):
    """Rotary position embedding (RoPE, Su et al.; MiniMind) on ``q, k: [b, h, n, e]``.

    Each pair ``(q_{2i}, q_{2i+1})`` is rotated by the angle ``p·θ_i``, ``θ_i = base^{−2i/e}``
    (MiniMind's complex form ``q_i · e^{i p θ_i}``), so ``⟨R_p q, R_r k⟩`` depends on the
    positions only through ``r − p``; norms are kept. ``e`` must be even."""

    Options = FrequencyOptions
    ordered_only = True
    rotates = True

    def rotate(self, q: Tensor, k: Tensor, tokens: TokenContext) -> tuple[Tensor, Tensor]:
        e = q.shape[-1]
        if e % 2:
            raise ValueError(
                f"rope: rotary embeddings rotate pairs of features, but the head width is "
                f"{e} (odd); choose dim / heads even"
            )
        a = angles(tokens.positions, e, self.options.base, q.dtype).unsqueeze(1)  # [b, 1, n, e/2]
        cos, sin = a.cos(), a.sin()
        return self.turn(q, cos, sin), self.turn(k, cos, sin)

    @staticmethod
    def turn(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """``(x_{2i}, x_{2i+1}) ← (x_{2i} cos − x_{2i+1} sin, x_{2i} sin + x_{2i+1} cos)``."""
        even, odd = x.unflatten(-1, (-1, 2)).unbind(-1)
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        return torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2)


# ---------------------------------------------------------------------------------------------
# time differences


def time_differences(tokens: TokenContext, kind: str) -> Tensor:
    """``Δt[b, i, j] = t_i − t_j`` in seconds (query ``i`` minus key ``j``)."""
    if tokens.timestamps is None:
        raise ValueError(
            f"{kind}: this bias channel needs per-token timestamps, but the batch has none; "
            f"use data with timestamps or drop the '{kind}' bias"
        )
    t = tokens.timestamps
    return t.unsqueeze(-1) - t.unsqueeze(-2)


class LogTimeGapOptions(Options):
    alpha: float = 1.0  # initial weight α of the time-gap term
    max_gap: float = Field(30 * 86400.0, gt=0.0)  # T_max in seconds (the seed's 30 days)
    # Gaps above T_max count as T_max (the seed's text: T_max is a threshold), so T ∈ [0, 1]; false:
    # log1p(Δ) / log1p(T_max) grows past 1 for longer gaps, as the seed's code computes it
    ceiling: bool = True
    # A constant factor on α·T. 1/√e (e: the attention's head width) puts the term inside the
    # attention's 1/√e, as the seed's softmax((QKᵀ + α·T) / √d_k) does: the same function and the
    # same training steps on α as the seed's (1 only rescales the learned α, not its Adam steps)
    scale: float = Field(1.0, gt=0.0)

    # Options added after trials existed: at these values the kind trains as before them.
    ADDED_LATER: ClassVar[dict[str, Any]] = {"ceiling": True, "scale": 1.0}


class LogTimeGap(BiasChannel):
    """TiSASRec as simplified in the seed: ``α · T`` added to the attention logits, with
    ``T_ij = log1p(min(|t_i − t_j|, T_max)) / log1p(T_max) ∈ [0, 1]`` and one learned ``α``
    shared by all heads; returns ``[b, 1, n, n]``. The seed adds ``α·T`` before dividing by
    ``√e``: ``scale: 1/√e`` does the same, and ``ceiling: false`` leaves out the cut at T_max as
    its code does. The published TiSASRec form is the attention kind ``time_interval``."""

    # 2: times reach it as float64 (exact whole seconds), not float32 (2026-11-26): the numbers of a
    # trial trained before differ, so its records are not reused as this kind's
    version = 2
    Options = LogTimeGapOptions
    ordered_only = True
    requires = frozenset({"timestamps"})

    def __init__(self, options: LogTimeGapOptions, ctx: BuildContext):
        super().__init__(options, ctx)
        self.alpha = nn.Parameter(torch.tensor(float(options.alpha)))

    def logits(self, tokens: TokenContext) -> Tensor:
        gap = time_differences(tokens, "log_time_gap").abs()
        if self.options.ceiling:
            gap = gap.clamp(max=self.options.max_gap)
        # In the times' precision (float64 from the task), then in the module's: a float32 module's
        # logits stay float32, a float64 one's float64.
        gap = gap.to(torch.promote_types(gap.dtype, self.alpha.dtype))
        t = (torch.log1p(gap) / math.log1p(self.options.max_gap)).to(self.alpha.dtype)
        return (self.options.scale * self.alpha * t).unsqueeze(1)


# ---------------------------------------------------------------------------------------------
# learned relative position / time biases (HSTU, FuXi-α); the tables are the ``ams`` attention's


class RelativePositionOptions(Options):
    # One table per block (HSTU: each layer has its own) instead of one all blocks share.
    per_layer: bool = False


class RelativePosition(BiasChannel):
    """Learned relative-position bias (HSTU / FuXi-α), one scalar per offset, shared by heads::

        B[b, 0, i, j] = w[clamp(pos_j − pos_i, −(L−1), L−1)]        w: [2L − 1], L = max_len

    added to every head's logits; returns ``[b, 1, n, n]``. The table is
    :class:`ablate_plugins.attention_parts.RelativePositionTable`, the one the ``ams`` attention
    uses. With ``per_layer`` each block has a table of its own (HSTU), else all blocks share one."""

    Options = RelativePositionOptions
    ordered_only = True

    def __init__(self, options: RelativePositionOptions, ctx: BuildContext):
        super().__init__(options, ctx)
        self.table = RelativePositionTable(ctx.max_len)

    @classmethod
    def one_per_block(cls, options: RelativePositionOptions) -> bool:
        return options.per_layer

    def logits(self, tokens: TokenContext) -> Tensor:
        return self.table(tokens).unsqueeze(1)


class RelativeTimeOptions(Options):
    buckets: int = Field(128, ge=1)  # the largest bucket index; the table has buckets + 1 rows
    log_base_step: float = Field(0.301, gt=0.0)  # bucket width in ln|Δt| (0.301 ≈ ln 1.35)
    # One table per block (HSTU: each layer has its own) instead of one all blocks share.
    per_layer: bool = False
    # The query's side of Δt: its own time ("query") or the next item's, the request time ("request":
    # HSTU / FuXi-α; the last query's is the time of the item it predicts).
    time_reference: Literal[tuple(QUERY_TIMES)] = "query"


class RelativeTime(BiasChannel):
    """Learned bias over log-bucketed time differences (HSTU / FuXi-α), shared by heads::

        B[b, 0, i, j] = w[clamp(⌊ln max(|τ_i − t_j|, 1) / 0.301⌋, 0, buckets)]     w: [buckets + 1]

    with ``t`` in seconds; returns ``[b, 1, n, n]``. The table is
    :class:`ablate_plugins.attention_parts.RelativeTimeTable`, the one the ``ams`` attention uses.
    ``τ_i`` is the query's own time ``t_i`` (default: a causal prefix contains it) or, with
    ``time_reference: request``, the next item's ``t_{i+1}`` (HSTU / FuXi-α). With ``per_layer``
    each block has a table of its own (HSTU), else all blocks share one."""

    # 2: times reach it as float64 (exact whole seconds), not float32 (2026-11-26): the numbers of a
    # trial trained before differ, so its records are not reused as this kind's
    version = 2
    Options = RelativeTimeOptions
    ordered_only = True
    requires = frozenset({"timestamps"})

    def __init__(self, options: RelativeTimeOptions, ctx: BuildContext):
        super().__init__(options, ctx)
        self.table = RelativeTimeTable(options.buckets, options.log_base_step, options.time_reference)

    @classmethod
    def one_per_block(cls, options: RelativeTimeOptions) -> bool:
        return options.per_layer

    def logits(self, tokens: TokenContext) -> Tensor:
        time_differences(tokens, "rel_time")  # a clear error when the batch has no timestamps
        return self.table(tokens).unsqueeze(1)

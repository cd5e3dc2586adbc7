"""Attention kinds: token mixers ``[b, n, d] -> [b, n, d]``.

Dimensions: ``b`` batch, ``n`` tokens, ``h`` heads, ``e`` head width, ``d`` model width (``d = h·e``
by default); ``e_qk`` / ``e_v`` query-key / value head widths where they may differ, ``C`` enabled AMS
channels, ``k`` the largest time-interval index (``k + 1`` interval embeddings).
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Callable
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import Tensor, nn

from ablate import components, kernels
from ablate.components import Attention, BuildContext, Dropout, Options, TokenContext, default
from ablate.jagged import last_of_rows
from ablate_plugins.attention_parts import (
    INITIALISATIONS,
    NORMALISERS,
    PROJECTION_INITIALISATIONS,
    QUERY_TIMES,
    RelativePositionTable,
    RelativeTimeTable,
    check_heads,
    head_width,
    logit_bias,
    merge_heads,
    split_heads,
)
from ablate_plugins.bias import check_positions, end_aligned


class SoftmaxOptions(Options):
    heads: int = Field(1, gt=0)
    # Grouped-query attention (MiniMind's num_key_value_heads): g key / value heads, each shared by
    # heads / g query heads; None: one per query head (multi-head attention).
    kv_heads: int | None = Field(None, gt=0)
    # Dropout on the attention probabilities; None uses the model's dropout.
    dropout: float | None = Field(None, ge=0.0, lt=1.0)
    bias: bool = True  # biases in the QKV and output projections
    # How the projections start: "torch" (nn.Linear's), or FT-Transformer's "kaiming" (nn.Linear's
    # weights, zero biases) or "xavier" (query/key weights, and value weights with > 1 head,
    # Xavier-uniform with gain 1/√2; zero biases).
    init: Literal[tuple(PROJECTION_INITIALISATIONS)] = "torch"

    @model_validator(mode="after")
    def _groups(self) -> SoftmaxOptions:
        if self.kv_heads is not None and self.heads % self.kv_heads:
            raise ValueError(
                f"kv_heads={self.kv_heads} must divide heads={self.heads} (each key / value head "
                f"serves heads / kv_heads query heads)"
            )
        return self


# Query chunks of causal attention on the CPU dropout path (benchmarks/RESULTS.md, session 11).
CAUSAL_QUERY_CHUNKS = 2


def scaled_dot_product_attention(
    q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None, is_causal: bool, dropout_p: float
) -> Tensor:
    """``softmax(q kᵀ / √e + mask) v`` with dropout on the probabilities, as torch's
    ``scaled_dot_product_attention`` (``is_causal``: query i sees keys ``j ≤ i``). With dropout on
    CPU torch leaves its fused kernel for one that draws a random number per probability; the
    same math written out here draws the mask with :func:`ablate.components.dropout` instead
    (about twice as fast per training step's attention, benchmarks/RESULTS.md)."""
    if dropout_p == 0.0 or not components.lanes_dropout(q.device):
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, is_causal=is_causal, dropout_p=dropout_p
        )
    b, h, n, e = q.shape
    m = k.shape[2]
    # Three-dimensional bmm: matmul on [b, h, ...] tensors loops over the leading dims in backward.
    q, k, v = q.reshape(b * h, n, e) * e**-0.5, k.reshape(b * h, m, e), v.reshape(b * h, m, e)
    key = components.dropout_key()  # one key for the whole [b·h, n, m]: chunks draw what one call would
    threshold, scale = components.keep_threshold(1.0 - dropout_p), 1.0 / (1.0 - dropout_p)
    causal = is_causal and n == m
    # Causal queries [s, t) see keys [0, t) only: query chunks skip most of the masked upper
    # triangle, whose logits and probabilities are much of a causal step's memory traffic.
    bounds = (
        [round(n * i / CAUSAL_QUERY_CHUNKS) for i in range(CAUSAL_QUERY_CHUNKS + 1)] if causal else [0, n]
    )
    outs = []
    for s, t in itertools.pairwise(bounds):
        keys = t if causal else m
        logits = torch.bmm(q[:, s:t], k[:, :keys].transpose(1, 2))
        if attn_mask is not None:
            part = attn_mask[..., s:t, :keys] if attn_mask.shape[-2] > 1 else attn_mask[..., :keys]
            logits = logits.view(b, h, t - s, keys)
            logits = logits.masked_fill(~part, float("-inf")) if part.dtype == torch.bool else logits + part
            logits = logits.reshape(b * h, t - s, keys)
        # The chunk's entries draw the lanes of their place in the whole [b·h, n, m].
        probs = kernels.softmax_dropout(logits, key, (s * m, n * m, m), threshold, scale, s, is_causal)
        outs.append(torch.bmm(probs.to(v.dtype), v[:, :keys]))
    return (outs[0] if len(outs) == 1 else torch.cat(outs, 1)).view(b, h, n, e)


class SoftmaxAttention(Attention):
    """Multi-head scaled dot-product attention (Vaswani et al. 2017; SASRec)::

    q, k, v = x W_qkv                                   q [b, n, d] in h heads, k, v [b, n, g·e] in g
    q, k    = rotate(q, k)                              rotary bias channels, if any
    k, v    = repeat(k), repeat(v)                      head i reads key / value head ⌊i·g / h⌋
    A       = softmax(q kᵀ / √e + mask + logit_bias)    [b, h, n, n]
    out     = merge_heads(A v) W_o                      [b, n, d]

    ``g = kv_heads`` (default ``h``): grouped-query attention (Ainslie et al. 2023; MiniMind's
    ``repeat_kv``), the key and value projections ``d → g·e``.
    """

    Options = SoftmaxOptions

    def __init__(self, options: SoftmaxOptions, ctx: BuildContext):
        super().__init__(options, ctx)
        d, h = ctx.dim, options.heads
        check_heads("softmax", d, h)
        self.heads, self.kv_heads = h, default(options.kv_heads, h)
        kv = self.kv_heads * (d // h)  # g·e, the key and value width
        self.dropout_p = ctx.dropout if options.dropout is None else options.dropout
        self.qkv = nn.Linear(d, d + 2 * kv, bias=options.bias)
        self.out = nn.Linear(d, d, bias=options.bias)
        w = self.qkv.weight.data
        PROJECTION_INITIALISATIONS[options.init](
            [w[:d], w[d : d + kv]], w[d + kv :], [self.qkv.bias, self.out.bias], h
        )

    takes_source = True

    def project_query(self, x: Tensor) -> Tensor:
        d, b = x.shape[-1], self.qkv.bias
        return F.linear(x, self.qkv.weight[:d], None if b is None else b[:d])

    def project_key_value(self, source: Tensor) -> tuple[Tensor, Tensor]:
        d, b = source.shape[-1], self.qkv.bias
        return F.linear(source, self.qkv.weight[d:], None if b is None else b[d:]).chunk(2, dim=-1)

    def repeat(self, t: Tensor) -> Tensor:
        """``[b, g, n, e] → [b, h, n, e]``: each key / value head repeated for its h / g query heads."""
        return t if self.kv_heads == self.heads else t.repeat_interleave(self.heads // self.kv_heads, dim=1)

    def forward(self, x: Tensor, tokens: TokenContext, source: Tensor | None = None) -> Tensor:
        """Queries, keys and values from ``x``; with ``source``, keys and values from it."""
        if source is None:  # one fused projection
            d = x.shape[-1]
            q, kv = self.qkv(x).split([d, self.qkv.out_features - d], dim=-1)
            k, v = kv.chunk(2, dim=-1)
        else:
            q, (k, v) = self.project_query(x), self.project_key_value(source)
        q, k, v = split_heads(q, self.heads), split_heads(k, self.kv_heads), split_heads(v, self.kv_heads)
        q, k = tokens.rotate(q, k)
        k, v = self.repeat(k), self.repeat(v)
        attn_mask, is_causal = tokens.attention_mask(q.dtype)
        p = self.dropout_p if self.training else 0.0
        return self.out(merge_heads(scaled_dot_product_attention(q, k, v, attn_mask, is_causal, p)))

    def last_query(self, x: Tensor, tokens: TokenContext, source: Tensor | None = None) -> Tensor:
        """One query per row (its last real token) against the row's real keys, with the key and
        value projections folded into that query instead of applied to every token::

            q_k = W_k,hᵀ q_h                  [b, h, d]   so  q_h · k_j = q_k · s_j + q_h · b_k,h
            p   = softmax(q_k sᵀ / √e + mask)  [b, h, n]   (q_h · b_k,h is the same for every j)
            o_h = (p̃ s) W_v,hᵀ + b_v,h         [b, h, e]   (p sums to 1)

        ``p̃`` is ``p`` after the attention dropout in training; its rows no longer sum to 1, so
        ``b_v,h`` is scaled by ``Σ_j p̃_j``, as in ``Σ_j p̃_j (W_v,h s_j + b_v,h)`` unfolded.
        ``s`` is the key / value source (``x`` unless given). Per row that is ``2·n·h·d`` work
        on all tokens instead of the ``n·2d·d`` of projecting every key and value."""
        if tokens.rotations or self.kv_heads != self.heads:  # rotated or shared keys: the general path
            return last_of_rows(self.forward(x, tokens, source=source), tokens.lengths)
        source = x if source is None else source
        lengths = tokens.lengths
        b, _, d = source.shape
        h = self.heads
        e = d // h
        rows = torch.arange(b, device=x.device)
        q = self.project_query(x[rows, lengths - 1]).view(b, h, e)
        w_k, w_v = self.qkv.weight[d : 2 * d].view(h, e, d), self.qkv.weight[2 * d :].view(h, e, d)
        q_k = torch.einsum("bhe,hed->bhd", q, w_k) * e**-0.5
        logits = torch.bmm(q_k, source.transpose(1, 2))  # [b, h, n]
        logits = logits.masked_fill(~tokens.valid[:, None, :], float("-inf"))
        if tokens.logit_bias is not None:
            bias = tokens.logit_bias.to(logits.dtype)
            logits = logits + bias.expand(b, -1, -1, -1)[rows, :, lengths - 1]
        probs = components.dropout(logits.softmax(-1), self.dropout_p, self.training)  # [b, h, n]
        context = torch.bmm(probs, source)  # [b, h, d]
        o = torch.einsum("bhd,hed->bhe", context, w_v)
        if self.qkv.bias is not None:
            value_bias = self.qkv.bias[2 * d :].view(h, e)
            dropped = self.training and self.dropout_p > 0.0
            o = o + (probs.sum(-1, keepdim=True) * value_bias if dropped else value_bias)
        return self.out(o.reshape(b, h * e))


class SiLUAttentionOptions(Options):
    """What the pointwise (HSTU) and AMS (FuXi-α) attentions share: how N is chosen, the dropout
    after the output projection, and how the projections are initialised."""

    # N in SiLU(q kᵀ + bias) / N: the row's true length ("length") or a fixed padded width
    # ("padded": HSTU's and FuXi-α's code, which pad every row to max_seq_len + max_output_len).
    normaliser: Literal[tuple(NORMALISERS)] = "length"
    padded_width: int | None = Field(None, gt=0)  # N under normaliser "padded"; None: the model's max_len
    # Dropout on the output projection's result, inside the attention (neither paper has one there;
    # the residual connection's own dropout acts at the same place, so set that to 0 to drop it).
    output_dropout: float = Field(0.0, ge=0.0, lt=1.0)
    # "torch": nn.Linear's initialisation; "published": input projections N(0, 0.02²), the output
    # projection's weight Xavier-uniform (HSTU's and FuXi-α's code).
    init: Literal[tuple(INITIALISATIONS)] = "torch"

    @model_validator(mode="after")
    def _width_with_padded(self) -> SiLUAttentionOptions:
        if self.padded_width is not None and self.normaliser != "padded":
            raise ValueError(
                f"padded_width={self.padded_width} is N under normaliser 'padded', but normaliser "
                f"is {self.normaliser!r}; set normaliser: padded, or leave padded_width out"
            )
        return self


class PointwiseOptions(SiLUAttentionOptions):
    heads: int = Field(1, gt=0)
    qk_dim: int | None = Field(None, gt=0)  # per-head query/key width; None: dim / heads
    v_dim: int | None = Field(None, gt=0)  # per-head value (and U) width; None: dim / heads
    # Dropout on U ⊙ Norm(A V) before the output projection (HSTU); None uses the model's dropout.
    dropout: float | None = Field(None, ge=0.0, lt=1.0)


class PointwiseAttention(Attention):
    """HSTU pointwise aggregated attention (Zhai et al. 2024), no softmax::

        U, V, Q, K = split(SiLU(x W_uvqk))                  [b, n, h·e_v] ×2, [b, n, h·e_qk] ×2
        q, k       = rotate(Q, K)                           per head, rotary bias channels if any
        A          = SiLU(q kᵀ + logit_bias) / N            [b, h, n, n], 0 where key_mask forbids
        out        = dropout_out(W_o(dropout(U ⊙ LayerNorm(merge_heads(A v)))))

    ``W_uvqk`` has no bias (HSTU's ``_uvqk``); ``LayerNorm`` has no affine parameters and runs
    over the ``h·e_v`` values of all heads concatenated (HSTU); ``W_o`` has a bias;
    ``dropout_out`` is ``output_dropout`` (0 by default, as in HSTU).

    **Which N** (``normaliser``). ``length`` (the default): the number of real tokens of each
    row. ``padded``: a fixed width (``padded_width``, else ``max_len``), what HSTU's and FuXi-α's
    code do — their rows are all padded to ``max_seq_len + max_output_len`` (211 on ML-1M). Never
    the batch's own padded width, which depends on the other rows of the batch, so that a row's
    output would change with its neighbours and with extra padding; both choices keep dense-padded
    and jagged layouts numerically identical. Under causal use ``length`` scales a query at
    position i by the row's length, i.e. by how many tokens follow it (their number, never their
    content). 1/N is one scalar per row, shared by every query and head, so the scale-invariant
    LayerNorm that follows removes it up to its ε — but at HSTU's initial weights A v is so small
    that ε dominates, and there the two choices differ by up to 0.36 at N = 211 (issue 20).
    """

    Options = PointwiseOptions

    def __init__(self, options: PointwiseOptions, ctx: BuildContext):
        super().__init__(options, ctx)
        d, h = ctx.dim, options.heads
        self.heads = h
        self.e_qk = head_width("pointwise", d, h, options.qk_dim)
        self.e_v = head_width("pointwise", d, h, options.v_dim)
        self.normaliser = NORMALISERS[options.normaliser]
        self.width = default(options.padded_width, ctx.max_len)
        self.uvqk = nn.Linear(d, 2 * h * self.e_v + 2 * h * self.e_qk, bias=False)
        self.norm = nn.LayerNorm(h * self.e_v, eps=1e-6, elementwise_affine=False)
        self.dropout = Dropout(default(options.dropout, ctx.dropout))
        self.out = nn.Linear(h * self.e_v, d)
        self.output_dropout = Dropout(options.output_dropout)
        INITIALISATIONS[options.init]([self.uvqk], self.out)

    def forward(self, x: Tensor, tokens: TokenContext) -> Tensor:
        hv, hq = self.heads * self.e_v, self.heads * self.e_qk
        u, v, q, k = F.silu(self.uvqk(x)).split([hv, hv, hq, hq], dim=-1)
        q, k, v = (split_heads(t, self.heads) for t in (q, k, v))  # [b, h, n, e]
        q, k = tokens.rotate(q, k)
        n = self.normaliser(tokens, q, self.width)
        a = F.silu(torch.einsum("bhie,bhje->bhij", q, k) + logit_bias(tokens, q)) / n
        a = a.masked_fill(~tokens.key_mask(), 0.0)
        o = self.norm(merge_heads(a @ v))  # [b, n, h·e_v]
        return self.output_dropout(self.out(self.dropout(u * o)))


# ----------------------------------------------------------------------------------------------
# FuXi-α adaptive multi-channel attention.


class SemanticChannel(nn.Module):
    """AMS semantic channel: ``Q, K = split(SiLU(x W_qk))``, ``A = SiLU(q kᵀ + logit_bias) / N``,
    ``[b, h, n, n]``; ``normaliser(tokens, like, width)`` gives N (see :class:`PointwiseAttention`).
    Bias channels the study adds (``logit_bias``, rotations) act here, as in HSTU."""

    def __init__(self, d: int, h: int, e_qk: int, normaliser: Callable[..., Tensor | float], width: int):
        super().__init__()
        self.heads, self.normaliser, self.width = h, normaliser, width
        self.qk = nn.Linear(d, 2 * h * e_qk, bias=False)

    def forward(self, x: Tensor, tokens: TokenContext) -> Tensor:
        q, k = (split_heads(t, self.heads) for t in F.silu(self.qk(x)).chunk(2, dim=-1))
        q, k = tokens.rotate(q, k)
        n = self.normaliser(tokens, q, self.width)
        return F.silu(torch.einsum("bhie,bhje->bhij", q, k) + logit_bias(tokens, q)) / n


class TableChannel(nn.Module):
    """AMS positional / temporal channel: the table's ``[b|1, n, n]`` bias used directly as
    attention weights, shared by every head: ``[b|1, 1, n, n]``."""

    def __init__(self, table: nn.Module):
        super().__init__()
        self.table = table

    def forward(self, x: Tensor, tokens: TokenContext) -> Tensor:
        return self.table(tokens).to(x.dtype)[:, None]


class AMSOptions(SiLUAttentionOptions):
    heads: int = Field(1, gt=0)
    qk_dim: int | None = Field(None, gt=0)  # per-head query/key width; None: dim / heads
    v_dim: int | None = Field(None, gt=0)  # per-head value width; None: dim / heads
    semantic: bool = True  # SiLU(q kᵀ)/N channel
    positional: bool = True  # relative-position channel
    temporal: bool = True  # relative-time channel (needs timestamps)
    buckets: int = Field(128, gt=0)  # largest time-bucket index: the time table has buckets + 1 entries
    log_base_step: float = Field(0.301, gt=0.0)  # bucket = ⌊ln|Δt| / log_base_step⌋
    # The query's side of the temporal channel's Δt: its own time ("query") or the next item's,
    # the request time ("request": FuXi-α's code; the last query's is the time of the item it predicts).
    time_reference: Literal[tuple(QUERY_TIMES)] = "query"
    # Dropout on U ⊙ RMSNorm(z) before the output projection (FuXi-α); None uses the model's dropout.
    dropout: float | None = Field(None, ge=0.0, lt=1.0)

    @model_validator(mode="after")
    def _some_channel(self) -> AMSOptions:
        if not (self.semantic or self.positional or self.temporal):
            raise ValueError(
                "ams attention: semantic, positional and temporal are all false; "
                "switch on at least one channel (or use attention kind 'none')"
            )
        return self


class AMSAttention(Attention):
    """FuXi-α adaptive multi-channel self-attention (Ye et al. 2025). With C enabled channels::

        U, V   = split(SiLU(x W_uv))                        [b, n, C·h·e_v], [b, n, h·e_v]
        A_sem  = SiLU(Q Kᵀ + logit_bias) / N                [b, h, n, n], Q, K = split(SiLU(x W_qk))
        A_pos  = P[pos_j − pos_i]                           [b, 1, n, n],   shared by heads
        A_time = T[bucket(τ_i − t_j)]                       [b, 1, n, n],   shared by heads
        z      = concat_c (A_c ⊙ key_mask) V               [b, n, h, C·e_v] → [b, n, C·h·e_v]
        out    = dropout_out(W_o(dropout(U ⊙ RMSNorm(z))))  [b, n, d]

    Channels that are switched off are left out of the list (and of U's width), so their
    parameters do not exist; their order in z is semantic, positional, temporal. The channel
    weights are used as they are (no softmax; the table channels without SiLU or 1/N, as in
    FuXi-α's code). RMSNorm has no learned scale (FuXi-α); ``W_uv`` and ``W_qk`` have no bias,
    ``W_o`` (FuXi-α's MFFN stage-1 ``lin0``) has one; ``dropout_out`` is ``output_dropout``
    (0 by default, as in FuXi-α). The FuXi block's input RMSNorm is the block's norm, not part of
    this kind. N is set by ``normaliser`` as in :class:`PointwiseAttention`; unlike there, it also
    sets the semantic channel's weight against the other channels before the RMSNorm, so the two
    choices differ by up to 5.4 at FuXi-α's initial weights and N = 211 (issue 20). ``τ_i`` is the
    query's own time t_i, or with ``time_reference: request`` the next item's t_{i+1} (FuXi-α).
    """

    # 2: times reach it as float64 (exact whole seconds), not float32 (2026-11-26): the numbers of a
    # trial trained before differ, so its records are not reused as this kind's
    version = 2
    Options = AMSOptions
    ordered_only = True

    def __init__(self, options: AMSOptions, ctx: BuildContext):
        super().__init__(options, ctx)
        d, h = ctx.dim, options.heads
        self.heads = h
        e_qk = head_width("ams", d, h, options.qk_dim)
        self.e_v = head_width("ams", d, h, options.v_dim)
        normaliser, width = NORMALISERS[options.normaliser], default(options.padded_width, ctx.max_len)
        makers = {
            "semantic": lambda: SemanticChannel(d, h, e_qk, normaliser, width),
            "positional": lambda: TableChannel(RelativePositionTable(ctx.max_len)),
            "temporal": lambda: TableChannel(
                RelativeTimeTable(options.buckets, options.log_base_step, options.time_reference)
            ),
        }
        enabled = [name for name in makers if getattr(options, name)]
        self.channels = nn.ModuleDict({name: makers[name]() for name in enabled})
        self.width = len(self.channels) * h * self.e_v  # C·h·e_v
        self.uv = nn.Linear(d, self.width + h * self.e_v, bias=False)
        self.norm = nn.RMSNorm(self.width, eps=1e-6, elementwise_affine=False)
        self.dropout = Dropout(default(options.dropout, ctx.dropout))
        self.out = nn.Linear(self.width, d)
        self.output_dropout = Dropout(options.output_dropout)
        semantic = [c.qk for c in self.channels.values() if isinstance(c, SemanticChannel)]
        INITIALISATIONS[options.init]([self.uv, *semantic], self.out)

    @classmethod
    def requirements(cls, options: AMSOptions) -> frozenset[str]:
        return frozenset({"timestamps"}) if options.temporal else frozenset()

    def forward(self, x: Tensor, tokens: TokenContext) -> Tensor:
        u, v = F.silu(self.uv(x)).split([self.width, self.heads * self.e_v], dim=-1)
        v = split_heads(v, self.heads)  # [b, h, n, e_v]
        allowed = tokens.key_mask()  # [b, 1, n, n]
        z = [channel(x, tokens).masked_fill(~allowed, 0.0) @ v for channel in self.channels.values()]
        z = torch.cat(z, dim=-1)  # [b, h, n, C·e_v]
        return self.output_dropout(self.out(self.dropout(u * self.norm(merge_heads(z)))))


# ----------------------------------------------------------------------------------------------
# TiSASRec time-interval aware attention.


def interval_units(t: Tensor, valid: Tensor, last: Tensor) -> Tensor:
    """``[b, n]``: for each query, the smallest non-zero gap |t_a − t_b| between real tokens a, b
    at indices ≤ ``last`` (``[b, n]``, the last key the query sees); 1 where there is none.

    TiSASRec's personal unit r_min^u is this minimum over the user's whole history; here it is
    taken over what the query may see, so under causal use later timestamps cannot change it.
    """
    n = t.shape[-1]
    gap = (t[:, :, None] - t[:, None, :]).abs()  # [b, n, n]
    earlier = torch.ones(n, n, dtype=torch.bool, device=t.device).tril(-1)
    pair = valid[:, :, None] & valid[:, None, :] & earlier & (gap > 0)
    nearest = gap.masked_fill(~pair, float("inf")).amin(-1)  # [b, n] smallest gap to an earlier token
    prefix = nearest.cummin(-1).values  # [b, n] smallest gap among tokens 0..a
    unit = prefix.gather(-1, last)
    return unit.masked_fill(unit.isinf(), 1.0)


def floor_of_gap(t: Tensor, unit: Tensor) -> Tensor:
    """``⌊|t_i − t_j| / u_i⌋`` (the paper's ``r_ij``), ``[b, n, n]``."""
    return ((t[:, :, None] - t[:, None, :]).abs() / unit[:, :, None]).floor()


def difference_of_rounded_times(t: Tensor, unit: Tensor) -> Tensor:
    """``|a_i − a_j|`` with ``a = round((t − t_min) / u_i) + 1`` (the authors' ``cleanAndsort``,
    Python's round: half to even, as ``torch.round``), ``[b, n, n]``. ``t_min`` is the row's first
    real time, which every query sees; the authors' is the user's first, before the window."""
    rounded = ((t - t[:, :1])[:, None, :] / unit[:, :, None]).round()  # [b, i, j]: a_j in u_i
    return (rounded.diagonal(dim1=1, dim2=2)[:, :, None] - rounded).abs()


# ``time_interval``'s ``interval_index`` option → r_ij before it is clipped to 0..k.
INTERVAL_INDICES = {"floor_of_gap": floor_of_gap, "difference_of_rounded_times": difference_of_rounded_times}


class TimeIntervalOptions(Options):
    heads: int = Field(1, gt=0)
    max_interval: int = Field(256, gt=0)  # k: intervals are clipped to 0..k
    # How a gap becomes an index: the paper's ⌊|t_i − t_j| / u⌋, or the authors' code's difference
    # of times each rounded to units first (16.7 % of ML-1M's causal test indices differ)
    interval_index: Literal[tuple(INTERVAL_INDICES)] = "floor_of_gap"
    # Dropout on the attention probabilities; None uses the model's dropout.
    dropout: float | None = Field(None, ge=0.0, lt=1.0)
    bias: bool = True  # biases in the QKV and output projections
    # How the projections start: "torch" (nn.Linear's), or FT-Transformer's "kaiming" (nn.Linear's
    # weights, zero biases) or "xavier" (query/key weights, and value weights with > 1 head,
    # Xavier-uniform with gain 1/√2; zero biases).
    init: Literal[tuple(PROJECTION_INITIALISATIONS)] = "torch"
    # TiSASRec as published (its paper's equations; the authors' model.py / modules.py), each off by
    # default so that the kind differs from `softmax` only by the interval terms:
    # learned absolute positions P^K, P^V [max_len, d] added to the keys and values inside the
    # attention, counted back from the last real token as in TiSASRec's left-padded windows
    positions: bool = False
    output_projection: bool = True  # False: the heads' outputs concatenated, no W_o
    # Dropout on the looked-up tables, E^K_{r_ij}, E^V_{r_ij} (each (i, j) pair its own draw) and
    # P^K_j, P^V_j; None uses the model's dropout (TiSASRec's dropout_rate)
    table_dropout: float | None = Field(0.0, ge=0.0, lt=1.0)
    # One set of tables for every block, looked up and dropped once per forward (TiSASRec's)
    share_tables: bool = False

    # Options added after trials existed: at these values the kind trains as before them.
    ADDED_LATER: ClassVar[dict[str, Any]] = {
        "positions": False,
        "output_projection": True,
        "table_dropout": 0.0,
        "share_tables": False,
        "interval_index": "floor_of_gap",
    }


class TimeIntervalAttention(Attention):
    """TiSASRec time-interval aware self-attention (Li, Wang & McAuley 2020)::

        r_ij   = min(⌊|t_i − t_j| / r_min⌋, k)              [b, n, n] interval index, k = max_interval
                 (``interval_index: difference_of_rounded_times``: the authors' code's, see there)
        q, k, v = x W_qkv, rotated                          [b, h, n, e]
        a_ij   = softmax_j(q_i · (k_j + E^K_{r_ij} + P^K_j) / √e + logit_bias, masked)
        out_i  = W_o concat_h Σ_j a_ij (v_j + E^V_{r_ij} + P^V_j)

    ``E^K, E^V: [k + 1, d]``, ``P^K, P^V: [max_len, d]`` (``positions``), split into per-head
    slices. ``r_min`` is the smallest non-zero gap between real tokens the query may see
    (:func:`interval_units`): the user's personal unit in TiSASRec, restricted to the causal
    prefix so that nothing leaks. By default the kind has no ``P`` (positions come from bias
    channels) and keeps ``W_o``, so that it differs from ``softmax`` only by the interval terms;
    ``positions``, ``output_projection: false``, ``table_dropout`` and ``share_tables`` give the
    published form.

    Cost: the formula reads ``E^K_{r_ij}`` as a ``[b, n, n, d]`` tensor; without table dropout the
    key term is ``(q_i E^Kᵀ)[r_ij]`` (a gather from ``[b, h, n, k+1]``) and the value term scatters
    ``a_ij`` into ``k + 1`` interval bins before one product with ``E^V``: memory O(b·h·n·(n + k))
    rather than O(b·n²·d). Dropout on the looked-up ``E_{r_ij}`` draws per (i, j) pair, so a
    training step with ``table_dropout`` reads the ``[b, n, n, d]`` form.
    """

    # 2: times reach it as float64 (exact whole seconds), not float32 (2026-11-26): the numbers of a
    # trial trained before differ, so its records are not reused as this kind's
    version = 2
    Options = TimeIntervalOptions
    ordered_only = True
    requires = frozenset({"timestamps"})

    def __init__(self, options: TimeIntervalOptions, ctx: BuildContext):
        super().__init__(options, ctx)
        d, h = ctx.dim, options.heads
        check_heads("time_interval", d, h)
        self.heads, self.max_interval = h, options.max_interval
        self.qkv = nn.Linear(d, 3 * d, bias=options.bias)
        shared = ctx.shared.get(SHARED_TABLES) if options.share_tables else None
        tables = shared or {
            "interval_k": xavier_table(options.max_interval + 1, d),
            "interval_v": xavier_table(options.max_interval + 1, d),
            **(
                {"position_k": xavier_table(ctx.max_len, d), "position_v": xavier_table(ctx.max_len, d)}
                if options.positions
                else {}
            ),
        }
        if options.share_tables:
            ctx.shared[SHARED_TABLES] = tables
        for name, table in tables.items():  # the same Parameter in every block when shared
            self.register_parameter(name, table)
        self.dropout = Dropout(default(options.dropout, ctx.dropout))
        self.table_dropout = Dropout(default(options.table_dropout, ctx.dropout))
        self.out = nn.Linear(d, d, bias=options.bias) if options.output_projection else None
        w = self.qkv.weight.data
        biases = [self.qkv.bias, None if self.out is None else self.out.bias]
        PROJECTION_INITIALISATIONS[options.init]([w[:d], w[d : 2 * d]], w[2 * d :], biases, h)

    def intervals(self, tokens: TokenContext) -> Tensor:
        """``[b, n, n]`` long: r_ij for query i, key j."""
        if tokens.timestamps is None:
            raise ValueError(
                "time_interval attention: these tokens carry no timestamps; the task's data "
                "must provide the feature 'timestamps'"
            )
        t, n = tokens.timestamps, tokens.shape[1]
        allowed = tokens.key_mask()[:, 0]  # [b, n, n]
        last = (allowed * torch.arange(n, device=t.device)).amax(-1)  # [b, n] last key each query sees
        unit = interval_units(t, tokens.valid, last)  # [b, n]
        index = INTERVAL_INDICES[self.options.interval_index](t, unit)
        return index.clamp(0, self.max_interval).long()

    def looked_up(self, tokens: TokenContext) -> dict[str, Tensor]:
        """The tables' rows for this forward, each ``[b, n(, n), h, e]``, dropped: ``E^K_{r_ij}``,
        ``E^V_{r_ij}`` when table dropout is active, ``P^K_j``, ``P^V_j`` with ``positions``.
        Computed once per backbone forward for tables the blocks share (one dropout draw, as
        TiSASRec), in ``tokens.memo``, which each backbone forward starts empty."""
        key = f"time_interval:{id(self.interval_k)}"
        # The same batch in the same mode: a copy of the context (a block's bias, a row) may share the memo.
        batch = (tokens.valid, tokens.timestamps, self.training)
        saved = tokens.memo.get(key)
        if self.options.share_tables and saved is not None and all(map(operator.is_, saved[0], batch)):
            return saved[1]
        h, rows = self.heads, {}
        if self.training and self.table_dropout.p > 0:
            r = self.intervals(tokens)
            rows |= {name: self.interval_rows(name, r) for name in ("interval_k", "interval_v")}
        if hasattr(self, "position_k"):
            at = end_aligned(tokens, self.position_k.shape[0]).masked_fill(~tokens.valid, 0)
            check_positions(at, self.position_k.shape[0], "time_interval")
            for name in ("position_k", "position_v"):
                table = getattr(self, name)
                rows[name] = self.table_dropout(table[at]).unflatten(-1, (h, -1))  # [b, n, h, e]
        tokens.memo[key] = (batch, rows)
        return rows

    def interval_rows(self, name: str, r: Tensor) -> Tensor:
        table = getattr(self, name)
        return self.table_dropout(table[r]).unflatten(-1, (self.heads, -1))  # [b, n, n, h, e]

    takes_source = True  # TiSASRec's keys and values come from the un-normalised stream

    def forward(self, x: Tensor, tokens: TokenContext, source: Tensor | None = None) -> Tensor:
        """Queries, keys and values from ``x``; with ``source``, keys and values from it."""
        h, w, b = self.heads, self.qkv.weight, self.qkv.bias
        if source is None:
            qkv = self.qkv(x).chunk(3, dim=-1)
        else:
            d = x.shape[-1]
            qkv = (F.linear(x, w[:d], None if b is None else b[:d]),)
            qkv += F.linear(source, w[d:], None if b is None else b[d:]).chunk(2, dim=-1)
        q, k, v = (split_heads(t, h) for t in qkv)  # [b, h, n, e]
        q, k = tokens.rotate(q, k)
        e = q.shape[-1]
        rows = self.looked_up(tokens)
        dense = "interval_k" in rows  # dropped per (i, j): the [b, n, n, d] form, for keys and values
        r = None if dense else self.intervals(tokens)[:, None].expand(-1, h, -1, -1)  # [b, h, n, n]
        logits = torch.einsum("bhie,bhje->bhij", q, k)
        if dense:
            logits = logits + torch.einsum("bhie,bijhe->bhij", q, rows["interval_k"])
        else:
            e_k = self.interval_k.view(-1, h, e)  # [k+1, h, e]
            logits = logits + torch.einsum("bhie,rhe->bhir", q, e_k).gather(-1, r)  # q_i · E^K_{r_ij}
        if "position_k" in rows:
            logits = logits + torch.einsum("bhie,bjhe->bhij", q, rows["position_k"])
        logits = logits / math.sqrt(e) + logit_bias(tokens, q)
        a = logits.masked_fill(~tokens.key_mask(), float("-inf")).softmax(-1)
        a = self.dropout(a)
        o = a @ v
        if dense:
            o = o + torch.einsum("bhij,bijhe->bhie", a, rows["interval_v"])
        else:
            bins = torch.zeros(*a.shape[:-1], self.max_interval + 1, dtype=a.dtype, device=a.device)
            bins = bins.scatter_add(-1, r, a)  # [b, h, n, k+1]: Σ_{j: r_ij = r} a_ij
            o = o + torch.einsum("bhir,rhe->bhie", bins, self.interval_v.view(-1, h, e))
        if "position_v" in rows:
            o = o + torch.einsum("bhij,bjhe->bhie", a, rows["position_v"])
        o = merge_heads(o)
        return o if self.out is None else self.out(o)

    def last_query(self, x: Tensor, tokens: TokenContext, source: Tensor | None = None) -> Tensor:
        return last_of_rows(self.forward(x, tokens, source), tokens.lengths)


# The key under which blocks share TiSASRec's tables (BuildContext.shared: one dict per backbone).
SHARED_TABLES = "time_interval.tables"


def xavier_table(rows: int, d: int) -> nn.Parameter:
    return nn.Parameter(nn.init.xavier_normal_(torch.empty(rows, d)))


# ----------------------------------------------------------------------------------------------


class NoOptions(Options):
    pass


class NoAttention(Attention):
    """No token mixing (ablation baseline): returns zeros, so the attention sub-layer adds
    nothing to the residual stream. No parameters."""

    Options = NoOptions
    mixes_tokens = False

    def forward(self, x: Tensor, tokens: TokenContext) -> Tensor:
        return torch.zeros_like(x)

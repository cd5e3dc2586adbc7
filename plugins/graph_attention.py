"""Attention kinds for unordered token sets (tabular features, forecasting channels).

Dimensions: ``b`` batch, ``n`` tokens, ``h`` heads, ``e`` head width, ``d = h·e`` model width,
``w`` lookback window (a channel's raw values), ``f = ⌊w/2⌋ + 1`` rfft length, ``m`` column-
embedding slots (``= max_len``), ``c`` column-embedding width.

Both kinds mix a *set*: a token has no position in time, only an identity (its column / channel).
Neither may be used causally, and neither is built for ordered tokens: there is nothing a
"future" token could leak, so the causal-leak property does not apply; the mask each one learns is
over token identities (``fr_graph``) or token contents (``channel_masked``).

* ``fr_graph``: T2G-Former's FR-Graph attention (Yan et al., AAAI 2023).
* ``channel_masked``: DUET's Mahalanobis-masked channel attention (Qiu et al., KDD 2025).

The pieces the reports and tests look at are pure functions: :func:`fr_adjacency`,
:func:`mahalanobis_probabilities`, :func:`gumbel_mask`, :func:`threshold_mask`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor, nn

from ablate.components import Attention, BuildContext, Dropout, Options, TokenContext, default
from ablate.jagged import last_of_rows
from ablate_plugins.attention_parts import PROJECTION_INITIALISATIONS, check_heads, merge_heads, split_heads

__all__ = [
    "FRGraphAttention",
    "ChannelMaskedAttention",
    "fr_adjacency",
    "mahalanobis_probabilities",
    "gumbel_mask",
    "threshold_mask",
    "NO_EDGE_LOGIT",
    "MASKED_LOGIT",
]

# T2G-Former: logits of pairs outside the learned topology get (1 − A)·(−1e4).
NO_EDGE_LOGIT = -1e4
# DUET: masked scores become −ln(1e10) ≈ −23.03, before the 1/√e scale (as published).
MASKED_LOGIT = -math.log(1e10)


def straight_through(hard: Tensor, soft: Tensor) -> Tensor:
    """Forward value exactly ``hard``; backward the gradient of ``soft``."""
    return hard.to(soft.dtype) + (soft - soft.detach())


def _unordered_only(kind: str, ctx: BuildContext) -> None:
    if ctx.ordered:
        raise ValueError(
            f"attention kind '{kind}' mixes an unordered token set (tabular features, channels) and is "
            f"not built for ordered/causal tokens; use it with a task whose tokens are unordered "
            f"(tabular, forecast), or choose softmax/pointwise attention for sequences"
        )


def _refuse_causal(kind: str, tokens: TokenContext) -> None:
    if tokens.causal:
        raise ValueError(
            f"attention kind '{kind}' cannot be used causally: it attends over an unordered set of "
            f"tokens (causal=True was given); use it with non-causal tokens (tabular, forecast tasks)"
        )


def _masked_softmax(logits: Tensor, tokens: TokenContext) -> Tensor:
    """``softmax`` over keys, padded keys excluded (a query always keeps itself: no empty rows)."""
    if tokens.logit_bias is not None:
        logits = logits + tokens.logit_bias.to(logits.dtype)
    return logits.masked_fill(~tokens.key_mask(), float("-inf")).softmax(dim=-1)


# ---------------------------------------------------------------------------------------
# fr_graph — T2G-Former FR-Graph attention
# ---------------------------------------------------------------------------------------


def fr_adjacency(
    col_head: Tensor, col_tail: Tensor, bias: Tensor, slots: Tensor, readout: Tensor | None = None
) -> Tensor:
    """FR-Graph topology ``A [b, h, n, n]``: 0/1 forward, sigmoid gradient backward::

        Gt   = normalize(E_head[slot_i]) · normalize(E_tail[slot_j])ᵀ      cosine, per head
        P    = sigmoid(Gt + b) ⊙ (1 − I) ⊙ (1 − readout_j)                  no self-loops, no edges
                                                                            into the readout token
        A    = 1[P > 0.5]   (straight-through: ∂A/∂P = 1)

    ``col_head, col_tail``: ``[h, m, c]`` column embeddings; ``bias``: ``[1]``;
    ``slots``: ``[b, n]`` long, which column each token is; ``readout``: ``[b, n]`` bool or None.
    """
    n = slots.shape[-1]
    e_head = F.normalize(col_head[:, slots], p=2, dim=-1).transpose(0, 1)  # [b, h, n, c]
    e_tail = F.normalize(col_tail[:, slots], p=2, dim=-1).transpose(0, 1)  # [b, h, n, c]
    score = e_head @ e_tail.transpose(-1, -2)  # [b, h, n, n]
    keep = 1.0 - torch.eye(n, dtype=score.dtype, device=score.device)  # no self-interaction
    if readout is not None:
        keep = keep * (~readout)[:, None, None, :].to(score.dtype)  # no edges into readout
    probs = torch.sigmoid(score + bias) * keep
    return straight_through(probs > 0.5, probs)


class FRGraphOptions(Options):
    heads: int = Field(1, gt=0)
    # Dropout on the FR-Graph (attention) probabilities; None uses the model's dropout.
    dropout: float | None = Field(None, ge=0.0, lt=1.0)
    # Start with the topology frozen (no gradient to column embeddings and the topology bias).
    frozen_topology: bool = False
    # Freeze the topology after this many training epochs (then train on with it fixed), the
    # schedule form of T2G-Former's freeze-at-early-stop; None: learn it throughout.
    freeze_after: int | None = Field(None, gt=0)
    # Learning-rate multiplier of the column embeddings (T2G-Former trains them at lr 0.01, ~100×
    # the rest). The topology depends only on their direction, so they are initialised 1/mult
    # smaller: an Adam-family optimiser then moves them as if their lr were mult × lr.
    topology_lr_mult: float = Field(1.0, gt=0.0)
    # Share one column-embedding table for heads and tails (symmetric topology score).
    sym_topology: bool = False
    # Share the head and tail projections (T2G-Former's default: symmetric edge weights).
    sym_weight: bool = True
    # How the projections start: T2G-Former's "xavier" (head / tail weights, and value weights with
    # > 1 head, Xavier-uniform with gain 1/√2) or "kaiming" (nn.Linear's weights), both with zero
    # biases; or "torch" (nn.Linear's weights and biases). Its configs choose per data set.
    init: Literal[tuple(PROJECTION_INITIALISATIONS)] = "xavier"


class Topology(nn.Module):
    """Learned FR-Graph topology: column embeddings ``[h, m, c]`` (head, tail) and a bias ``[1]``."""

    def __init__(self, heads: int, slots: int, symmetric: bool, lr_mult: float = 1.0):
        super().__init__()
        c = max(1, math.ceil(2 * math.log2(max(slots, 2))))  # T2G: d_col = ⌈2·log2(n_cols)⌉
        self.col_head = nn.Parameter(torch.empty(heads, slots, c))
        self.col_tail = self.col_head if symmetric else nn.Parameter(torch.empty(heads, slots, c))
        for w in {id(p): p for p in (self.col_head, self.col_tail)}.values():
            nn.init.kaiming_uniform_(w, a=math.sqrt(5))  # as the tokenizer (direction only matters)
            # Scale-invariant use (cosine): Adam's step is ~lr whatever the scale, so 1/mult smaller
            # parameters turn by mult × as much per step, i.e. an lr of mult × lr.
            w.data.div_(lr_mult)
        self.bias = nn.Parameter(torch.zeros(1))

    def forward(self, slots: Tensor, readout: Tensor | None) -> Tensor:
        return fr_adjacency(self.col_head, self.col_tail, self.bias, slots, readout)


class EdgeWeights(nn.Module):
    """``Gw = f_head · diag(r) · f_tailᵀ / √e`` per head, ``f_head = x W_head``, ``f_tail = x W_tail``."""

    def __init__(self, d: int, heads: int, symmetric: bool, init: str = "xavier"):
        super().__init__()
        self.heads = heads
        self.w_head = nn.Linear(d, d)
        self.w_tail = self.w_head if symmetric else nn.Linear(d, d)
        self.rel = nn.Parameter(torch.ones(heads, d // heads))  # r: learnable diagonal relation
        layers = list({id(m): m for m in (self.w_head, self.w_tail)}.values())
        PROJECTION_INITIALISATIONS[init]([m.weight for m in layers], None, [m.bias for m in layers], heads)

    def forward(self, x: Tensor, tokens: TokenContext, queries: Tensor | None = None) -> Tensor:
        """``[b, h, n, n]``; with ``queries [b, q, d]`` (heads from those tokens, not rotated)
        ``[b, h, q, n]``."""
        f_head = split_heads(self.w_head(x if queries is None else queries), self.heads)  # [b, h, n|q, e]
        f_tail = split_heads(self.w_tail(x), self.heads)  # [b, h, n, e]
        f_head, f_tail = tokens.rotate(f_head, f_tail)
        e = f_head.shape[-1]
        return torch.einsum("bhie,he,bhje->bhij", f_head, self.rel, f_tail) / math.sqrt(e)


class SetAttention(Attention):
    """Base of the attention kinds over unordered token sets (features, channels): refuses
    ordered builds, checks the heads, holds the dropout."""

    unordered_only = True  # the study validator refuses these on sequence tasks, naming both
    label: ClassVar[str]

    def __init__(self, options, ctx: BuildContext):
        super().__init__(options, ctx)
        _unordered_only(self.label, ctx)
        check_heads(self.label, ctx.dim, options.heads)
        self.heads = options.heads
        self.dropout = Dropout(default(options.dropout, ctx.dropout))


class FRGraphAttention(SetAttention):
    """FR-Graph attention (T2G-Former, Yan et al. 2023) over an unordered token set::

        Gw  = f_head · diag(r) · f_tailᵀ / √e                  edge weights      [b, h, n, n]
        A   = fr_adjacency(E_head, E_tail, b, slots, readout)   0/1 topology      [b, h, n, n]
        G   = softmax(Gw + (1 − A)·(−1e4)), padded keys → −∞    the FR-Graph      [b, h, n, n]
        out = merge_heads(G · x W_v) W_o                                          [b, n, d]

    A token's column ("slot") is ``tokens.positions``: which feature (or channel) it is — the
    tabular task gives its readout column 0 though the token sits last — so the column-embedding
    table has ``ctx.max_len`` rows. A row whose topology has no
    edge at all falls back to ``softmax(Gw)`` over every real key (the −1e4 shifts all alike),
    as in the published code. Unordered only: refuses ordered builds and causal use.
    """

    Options = FRGraphOptions
    label = "fr_graph"

    def __init__(self, options: FRGraphOptions, ctx: BuildContext):
        super().__init__(options, ctx)
        d, h = ctx.dim, options.heads
        self.edges = EdgeWeights(d, h, options.sym_weight, options.init)
        self.topology = Topology(h, ctx.max_len, options.sym_topology, options.topology_lr_mult)
        self.value = nn.Linear(d, d)
        self.out = nn.Linear(d, d)
        PROJECTION_INITIALISATIONS[options.init]([], self.value.weight, [self.value.bias, self.out.bias], h)
        self.topology.requires_grad_(not options.frozen_topology)

    def freeze_topology(self) -> None:
        """Stop learning the topology (T2G-Former freezes it at early stop, then trains on)."""
        self.topology.requires_grad_(False)

    def epoch_end(self, epoch: int) -> None:
        """Freeze the topology once ``freeze_after`` epochs have been trained."""
        if self.options.freeze_after is not None and epoch >= self.options.freeze_after:
            self.freeze_topology()

    def stage_end(self, stage: int) -> None:
        """T2G-Former's second stage (``train.second_stage``) trains on with the topology fixed."""
        self.freeze_topology()

    @property
    def topology_frozen(self) -> bool:
        return not any(p.requires_grad for p in self.topology.parameters())

    def adjacency(self, tokens: TokenContext) -> Tensor:
        """The 0/1 topology ``A [b, h, n, n]`` for these tokens (straight-through)."""
        n = tokens.shape[1]
        if n > self.ctx.max_len:
            raise ValueError(
                f"fr_graph: {n} tokens but the column-embedding table was built for max_len="
                f"{self.ctx.max_len}; build with max_len ≥ the number of features (+ readout)"
            )
        return self.topology(tokens.positions, tokens.readout)

    def graph(self, x: Tensor, tokens: TokenContext, last_only: bool = False) -> Tensor:
        """The FR-Graph ``G [b, h, n, n]`` (attention probabilities, before dropout); with
        ``last_only`` its row at each row's last real token, ``[b, h, 1, n]``."""
        _refuse_causal("fr_graph", tokens)
        adj = self.adjacency(tokens)
        if not last_only:
            return _masked_softmax(self.edges(x, tokens) + (1.0 - adj) * NO_EDGE_LOGIT, tokens)
        # The [b, h, n, n] terms are cheap at a tabular row's width: build them whole, keep one row.
        rest = (1.0 - adj) * NO_EDGE_LOGIT
        if tokens.logit_bias is not None:
            rest = rest + tokens.logit_bias.to(rest.dtype)
        rest = last_of_rows(
            rest.masked_fill(~tokens.key_mask(), float("-inf")).transpose(1, 2), tokens.lengths
        )
        queries = last_of_rows(x, tokens.lengths)[:, None]  # [b, 1, d]
        return (self.edges(x, tokens, queries) + rest[:, :, None]).softmax(dim=-1)

    def forward(self, x: Tensor, tokens: TokenContext) -> Tensor:
        return self._attend(x, tokens, last_only=False)

    def last_query(self, x: Tensor, tokens: TokenContext) -> Tensor:
        """``[b, d]``: the output at each row's last real token only (a readout token placed
        last; T2G-Former's final layer runs its [CLS] query alone). Keys, values and topology as
        in :meth:`forward`; the edge weights, graph row and output projection of one query."""
        if tokens.rotations:  # rotary channels rotate heads and tails by position: general path
            return super().last_query(x, tokens)
        return self._attend(x, tokens, last_only=True)[:, 0]

    def _attend(self, x: Tensor, tokens: TokenContext, last_only: bool) -> Tensor:
        g = self.dropout(self.graph(x, tokens, last_only))  # [b, h, n|1, n]
        v = split_heads(self.value(x), self.heads)  # [b, h, n, e]
        return self.out(merge_heads(g @ v))


# ---------------------------------------------------------------------------------------
# channel_masked — DUET masked channel attention
# ---------------------------------------------------------------------------------------


def mahalanobis_probabilities(
    values: Tensor, A: Tensor, valid: Tensor | None = None, eps: float = 1e-10
) -> Tensor:
    """DUET's channel-relation probabilities ``p [b, n, n]`` from lookback windows ``[b, n, w]``::

        X_i    = |rfft(x_i)|                                   [b, n, f]
        D_ij   = ‖A (X_i − X_j)‖²                              learned Mahalanobis-style distance
        S_ij   = 1 / (D_ij + ε)  for j ≠ i (j real), else 0
        p_ij   = 0.99 · ( S_ij / max_k S_ik   (max detached)   for j ≠ i
                          1                                    for j = i )

    ``A``: ``[f, f]``. Padded keys (``valid`` False) take no part in the row maximum.
    """
    xf = torch.fft.rfft(values, dim=-1).abs()  # [b, n, f]
    z = xf @ A.T  # A X_i, so A (X_i − X_j) = z_i − z_j
    dist = (z[:, :, None, :] - z[:, None, :, :]).pow(2).sum(-1)  # [b, n, n]
    n = values.shape[1]
    eye = torch.eye(n, dtype=dist.dtype, device=dist.device)
    keep = (1.0 - eye).expand_as(dist)
    if valid is not None:
        keep = keep * valid[:, None, :].to(dist.dtype)
    inv = keep / (dist + eps)
    row_max = inv.amax(dim=-1, keepdim=True).detach().clamp_min(torch.finfo(dist.dtype).tiny)
    return 0.99 * (inv / row_max + eye)


def gumbel_mask(p: Tensor, tau: float = 1.0, noise: Tensor | None = None) -> Tensor:
    """Hard Bernoulli-Gumbel sample of edges, straight-through (DUET)::

        ℓ = ln(p / (1 − p));   y = softmax(([ℓ, −ℓ] + g) / τ)[0];   M = 1[argmax = 0]

    ``g [..., 2]``: standard Gumbel noise, drawn as ``−ln(Exp(1))`` when not given. Forward
    gives the 0/1 sample, backward the gradient of ``y``.
    """
    p = p.clamp(1e-12, 1 - 1e-12)
    logit = torch.log(p) - torch.log1p(-p)
    logits = torch.stack([logit, -logit], dim=-1)
    g = noise if noise is not None else -torch.empty_like(logits).exponential_().log()
    z = logits + g
    y = torch.softmax(z / tau, dim=-1)[..., 0]
    return straight_through(z[..., 0] >= z[..., 1], y)


def threshold_mask(p: Tensor, tau: float = 1.0) -> Tensor:
    """Deterministic mask ``M = 1[p > 0.5]`` (the mode of :func:`gumbel_mask`), straight-through."""
    return straight_through(p > 0.5, p)


MASKS: dict[str, Callable[..., Tensor]] = {"sample": gumbel_mask, "threshold": threshold_mask}


class ChannelMaskedOptions(Options):
    heads: int = Field(1, gt=0)
    # Dropout on the attention probabilities; None uses the model's dropout.
    dropout: float | None = Field(None, ge=0.0, lt=1.0)
    # Width w of each channel's lookback window (tokens.values [b, n, w]); sizes A as f × f.
    # None: the task's window width (BuildContext.values_width).
    lookback: int | None = Field(None, ge=2)
    # Mask at evaluation: "sample" as published DUET (stochastic inference), or "threshold"
    # (deterministic 1[p > 0.5]). Training always samples.
    eval_mask: Literal["sample", "threshold"] = "sample"
    # Gumbel-softmax temperature of the straight-through gradient.
    tau: float = Field(1.0, gt=0.0)


class ChannelMaskedAttention(SetAttention):
    """Masked channel attention (DUET, Qiu et al. 2025) over an unordered set of channels::

        p   = mahalanobis_probabilities(values, A)           [b, n, n]
        M   = gumbel_mask(p)  (training; eval: eval_mask)   0/1, diagonal kept, straight-through
        s   = q kᵀ                                           [b, h, n, n]
        P   = softmax((s ⊙ M + (1 − M)·(−ln 1e10)) / √e)     padded keys → −∞
        out = merge_heads(P v) W_o                           [b, n, d]

    ``values`` are the raw per-channel lookback windows (``tokens.values``, feature "values");
    DUET feeds the instance-normalised (RevIN) window. The mask's gradient reaches ``A`` through
    ``s ⊙ M``. Published DUET computes one mask per model; here every layer learns its own ``A``.
    Unordered only: refuses ordered builds and causal use.
    """

    Options = ChannelMaskedOptions
    requires = frozenset({"values"})

    label = "channel_masked"

    def __init__(self, options: ChannelMaskedOptions, ctx: BuildContext):
        super().__init__(options, ctx)
        d = ctx.dim
        self.lookback = default(options.lookback, ctx.values_width)
        if self.lookback < 2:
            raise ValueError(
                "channel_masked needs lookback windows of width ≥ 2: the task provides "
                f"values_width={ctx.values_width}; set attention.lookback"
            )
        f = self.lookback // 2 + 1
        self.A = nn.Parameter(torch.randn(f, f))  # learned Mahalanobis map (DUET: randn init)
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)
        self.eval_sampler = MASKS[options.eval_mask]

    @classmethod
    def describe(cls, options: ChannelMaskedOptions) -> str:
        """Always names the evaluation mask, so a report says which inference was used, e.g.
        ``channel_masked(heads=2,eval_mask=sample)``."""
        label = super().describe(options)
        if "eval_mask=" in label:
            return label
        args = label[len(cls.kind_name()) + 1 : -1]
        return f"{cls.kind_name()}({args + ',' if args else ''}eval_mask={options.eval_mask})"

    def probabilities(self, tokens: TokenContext) -> Tensor:
        """Edge probabilities ``p [b, n, n]`` from the channels' lookback windows."""
        _refuse_causal("channel_masked", tokens)
        values = tokens.values
        if values is None:
            raise ValueError(
                "channel_masked needs each channel's lookback window in tokens.values [b, n, w] "
                "(data feature 'values'); the task did not provide it"
            )
        if values.shape[-1] != self.lookback:
            raise ValueError(
                f"channel_masked was built for lookback={self.lookback} but tokens.values has "
                f"windows of width {values.shape[-1]}; set attention.lookback: {values.shape[-1]}"
            )
        with torch.autocast(values.device.type, enabled=False):  # distances in full precision
            return mahalanobis_probabilities(values.to(self.A.dtype), self.A, tokens.valid)

    def mask(self, tokens: TokenContext) -> Tensor:
        """The 0/1 channel mask ``M [b, n, n]`` (sampled in training; ``eval_mask`` otherwise)."""
        p = self.probabilities(tokens)
        sample = gumbel_mask if self.training else self.eval_sampler
        m = sample(p, self.options.tau)
        eye = torch.eye(p.shape[-1], dtype=m.dtype, device=m.device)
        return m * (1.0 - eye) + eye  # a channel always sees itself

    def _weights(self, q: Tensor, k: Tensor, tokens: TokenContext) -> Tensor:
        m = self.mask(tokens)[:, None]  # [b, 1, n, n]
        s = q @ k.transpose(-1, -2)  # [b, h, n, n]
        logits = (s * m + (1.0 - m.detach()) * MASKED_LOGIT) / math.sqrt(q.shape[-1])
        return _masked_softmax(logits, tokens)

    def _project(self, x: Tensor, tokens: TokenContext) -> tuple[Tensor, Tensor, Tensor]:
        q, k, v = (split_heads(t, self.heads) for t in self.qkv(x).chunk(3, dim=-1))  # [b, h, n, e]
        q, k = tokens.rotate(q, k)
        return q, k, v

    def weights(self, x: Tensor, tokens: TokenContext) -> Tensor:
        """Attention probabilities ``P [b, h, n, n]`` (before dropout; draws a fresh mask)."""
        q, k, _ = self._project(x, tokens)
        return self._weights(q, k, tokens)

    def forward(self, x: Tensor, tokens: TokenContext) -> Tensor:
        q, k, v = self._project(x, tokens)
        p = self.dropout(self._weights(q, k, tokens))
        return self.out(merge_heads(p @ v))

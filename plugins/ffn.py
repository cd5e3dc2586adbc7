"""Feed-forward kinds: position-wise maps ``[..., d] -> [..., d]``.

Dimensions: ``d`` model width, ``k`` hidden width, ``t`` tokens (leading dims flattened),
``E`` experts.
"""

from __future__ import annotations

from typing import ClassVar, Literal

import torch
from pydantic import Field, ValidationInfo, field_validator
from torch import Tensor, nn

from ablate.components import BuildContext, Dropout, FeedForward, Options, default

ACTIVATIONS: dict[str, type[nn.Module]] = {"relu": nn.ReLU, "gelu": nn.GELU}


class PointwiseOptions(Options):
    dropout: float | None = Field(None, ge=0.0, lt=1.0)  # None uses the model's dropout
    # Dropout on the FFN's own output (SASRec's code drops out after each of its two layers and
    # none after attention: set this with a connection dropout of 0 for that arrangement).
    output_dropout: float = Field(0.0, ge=0.0, lt=1.0)


class MLPOptions(Options):
    mult: float = Field(4.0, gt=0.0)  # hidden width k = round(mult · d)
    activation: Literal["relu", "gelu"] = "gelu"
    bias: bool = True  # biases in W₁ and W₂ (the seed's and MiniMind's ReLU FFN: none)
    dropout: float | None = Field(None, ge=0.0, lt=1.0)  # None uses the model's dropout


def dropout_rate(options: Options, ctx: BuildContext) -> float:
    return ctx.dropout if options.dropout is None else options.dropout


class TwoLayer(FeedForward):
    """``y = W₂ · dropout(σ(W₁ x + b₁)) + b₂`` with ``W₁: d → k``, ``W₂: k → d``."""

    def __init__(
        self, options: Options, ctx: BuildContext, hidden: int, activation: nn.Module, bias: bool = True
    ):
        super().__init__(options, ctx)
        self.w1 = nn.Linear(ctx.dim, hidden, bias=bias)
        self.activation = activation
        self.dropout = Dropout(dropout_rate(options, ctx))
        self.w2 = nn.Linear(hidden, ctx.dim, bias=bias)

    def forward(self, x: Tensor, valid: Tensor | None = None) -> Tensor:
        return self.w2(self.dropout(self.activation(self.w1(x))))


class PointwiseFFN(TwoLayer):
    """SASRec's point-wise feed-forward: ``k = d``, ReLU;
    ``y = dropout_out(W₂ · dropout(ReLU(W₁ x + b₁)) + b₂)``."""

    Options = PointwiseOptions

    def __init__(self, options: PointwiseOptions, ctx: BuildContext):
        super().__init__(options, ctx, hidden=ctx.dim, activation=nn.ReLU())
        self.output_dropout = Dropout(options.output_dropout)

    def forward(self, x: Tensor, valid: Tensor | None = None) -> Tensor:
        return self.output_dropout(super().forward(x, valid))


class MLPFFN(TwoLayer):
    """Transformer MLP: ``k = round(mult · d)``, ReLU or GELU."""

    Options = MLPOptions
    width_option = "mult"

    def __init__(self, options: MLPOptions, ctx: BuildContext):
        hidden = max(1, round(options.mult * ctx.dim))
        activation = ACTIVATIONS[options.activation]()
        super().__init__(options, ctx, hidden=hidden, activation=activation, bias=options.bias)


# -- gated linear units (Shazeer 2020) -----------------------------------------------------


def dropout_on_output(ffn: GatedFFN, x: Tensor) -> Tensor:
    """``dropout(W_down(σ(W_gate x) ⊙ W_up x))`` (MiniMind)."""
    return ffn.dropout(ffn.down(ffn.hidden(x)))


def dropout_on_hidden(ffn: GatedFFN, x: Tensor) -> Tensor:
    """``W_down(dropout(σ(W_gate x) ⊙ W_up x))`` (FT-Transformer / T2G-Former)."""
    return ffn.down(ffn.dropout(ffn.hidden(x)))


# The ``dropout_at`` option of the gated FFNs → where their dropout acts.
GATED_DROPOUT_SITES = {"output": dropout_on_output, "hidden": dropout_on_hidden}


class GatedOptions(Options):
    hidden: int | None = Field(None, gt=0)  # hidden width k; None: glu_hidden(d, multiple_of)
    multiple_of: int = Field(64, gt=0)  # k is rounded up to a multiple of this
    bias: bool = False  # biases in W_gate, W_up, W_down (MiniMind / LLaMA use none)
    dropout: float | None = Field(None, ge=0.0, lt=1.0)  # None uses the model's dropout
    # Where the dropout acts: on the output (MiniMind) or on the hidden σ(W_gate x) ⊙ W_up x
    # before W_down (FT-Transformer's and T2G-Former's ffn_dropout).
    dropout_at: Literal[tuple(GATED_DROPOUT_SITES)] = "output"


def glu_hidden(dim: int, multiple_of: int = 64) -> int:
    """MiniMind / LLaMA hidden width: ``k = m · ⌈⌊2/3 · 4d⌋ / m⌉`` for ``m = multiple_of``.

    ``2/3`` keeps the three matrices of a gated unit at the parameter count of a ``4d`` MLP.
    """
    k = int(2 * (4 * dim) / 3)
    return multiple_of * -(-k // multiple_of)


class GLU(FeedForward):
    """``y = W_down(σ(W_gate x) ⊙ W_up x)`` with ``W_gate, W_up: d → k``, ``W_down: k → d``;
    subclasses choose ``σ`` through the class attribute ``activation``."""

    activation: ClassVar[type[nn.Module]] = nn.SiLU

    def __init__(self, options: Options, ctx: BuildContext, hidden: int, bias: bool):
        super().__init__(options, ctx)
        self.gate = nn.Linear(ctx.dim, hidden, bias=bias)
        self.up = nn.Linear(ctx.dim, hidden, bias=bias)
        self.down = nn.Linear(hidden, ctx.dim, bias=bias)
        self.act = self.activation()

    def hidden(self, x: Tensor) -> Tensor:
        """``σ(W_gate x) ⊙ W_up x``, ``[.., k]``."""
        return self.act(self.gate(x)) * self.up(x)

    def forward(self, x: Tensor, valid: Tensor | None = None) -> Tensor:
        return self.down(self.hidden(x))


class GatedFFN(GLU):
    """MiniMind's gated feed-forward: ``y = dropout(W_down(σ(W_gate x) ⊙ W_up x))`` with
    ``k = hidden`` or ``glu_hidden(d, multiple_of)``; with ``dropout_at: hidden`` the dropout
    acts on ``σ(W_gate x) ⊙ W_up x`` instead (FT-Transformer's and T2G-Former's FFN)."""

    Options = GatedOptions
    width_option = "hidden"

    def __init__(self, options: GatedOptions, ctx: BuildContext):
        hidden = default(options.hidden, glu_hidden(ctx.dim, options.multiple_of))
        super().__init__(options, ctx, hidden=hidden, bias=options.bias)
        self.dropout = Dropout(dropout_rate(options, ctx))
        self.apply_dropout = GATED_DROPOUT_SITES[options.dropout_at]

    def forward(self, x: Tensor, valid: Tensor | None = None) -> Tensor:
        return self.apply_dropout(self, x)


class SwiGLU(GatedFFN):
    """``σ = SiLU(u) = u · sigmoid(u)`` (MiniMind, LLaMA)."""

    activation = nn.SiLU


class GEGLU(GatedFFN):
    """``σ = GELU(u) = u · Φ(u)`` (exact, erf form)."""

    activation = nn.GELU


class ReGLU(GatedFFN):
    """``σ = ReLU(u) = max(u, 0)``."""

    activation = nn.ReLU


# -- FuXi-α multi-stage FFN -----------------------------------------------------------------


class MFFNOptions(Options):
    ffn_multiply: float = Field(1.0, gt=0.0)  # hidden width k = round(ffn_multiply · d)
    bias: bool = False  # biases in lin1, lin2, lin3 (FuXi-α's default: none)
    dropout: float | None = Field(None, ge=0.0, lt=1.0)  # on the normalised input; None: model's
    # Dropout on lin2's output, inside the FFN (FuXi-α has none there; the residual connection's
    # own dropout acts at the same place, so set that to 0 to drop it).
    output_dropout: float = Field(0.0, ge=0.0, lt=1.0)


class MFFN(GLU):
    """FuXi-α's MFFN stage 2 as a block FFN: ``y = dropout_out(W₂(SiLU(W₁ x̂) ⊙ W₃ x̂))``,
    ``x̂ = dropout(x)``, ``k = round(ffn_multiply · d)``, weights Xavier-uniform, no biases
    (FuXi-α's defaults); ``dropout_out`` is ``output_dropout`` (0 by default, as in FuXi-α).

    FuXi-α's MFFN (``X0`` the block input, ``Z`` the AMS output)::

        stage 1   h = lin0(dropout(Z)) + X0
        stage 2   x = h + lin2(SiLU(lin1(ĥ)) ⊙ lin3(ĥ)),   ĥ = dropout(rms_norm(h))

    Stage 1 is the attention sub-layer's output projection plus its residual, so it belongs
    to the ``ams`` attention kind and the block's first connection. Stage 2 is "norm → FFN →
    residual", which is exactly our block's second sub-layer; this kind is therefore only
    the SwiGLU in the middle, and holds **no norm and no residual** of its own (else they
    would be applied twice). ``ffn: {kind: mffn}`` with ``norm: {kind: rmsnorm, placement:
    pre}`` and ``connection: {kind: residual}`` reproduces stage 2, with two remarks:

    * our ``rmsnorm`` has a learned gain (initialised to 1) unless ``affine: false``; FuXi's
      ``rms_norm`` has none. The two agree at initialisation and span the same functions
      (without biases the gain folds into ``lin1`` and ``lin3``), but train differently;
    * FuXi drops the *normalised input* of the SwiGLU (done here) and not its output (lin2's),
      nor lin0's (the attention's output projection); the residual connection drops both unless
      its own ``dropout: 0``, FuXi's placement. ``output_dropout`` (and the ``ams`` attention's)
      puts either dropout back on its own.

    It is a SwiGLU with FuXi's hidden-size rule, input dropout and initialisation; the
    MiniMind kind ``swiglu`` differs in its width (``glu_hidden``) and output dropout.
    """

    Options = MFFNOptions
    width_option = "ffn_multiply"
    activation = nn.SiLU

    def __init__(self, options: MFFNOptions, ctx: BuildContext):
        hidden = max(1, round(options.ffn_multiply * ctx.dim))
        super().__init__(options, ctx, hidden=hidden, bias=options.bias)
        self.dropout = Dropout(dropout_rate(options, ctx))
        for linear in (self.gate, self.up, self.down):
            nn.init.xavier_uniform_(linear.weight)
        self.output_dropout = Dropout(options.output_dropout)

    def forward(self, x: Tensor, valid: Tensor | None = None) -> Tensor:
        return self.output_dropout(super().forward(self.dropout(x)))


# -- mixture of experts -----------------------------------------------------------------------


class MoEOptions(Options):
    experts: int = Field(4, ge=1)  # routed experts E
    top_k: int = Field(2, ge=1)  # experts per token, ≤ experts
    shared_experts: int = Field(0, ge=0)  # experts applied to every token
    normalize_topk: bool = True  # rescale the k chosen router probabilities to sum to 1 (k > 1)
    alpha: float = Field(0.01, ge=0.0)  # weight of the load-balancing loss
    # Over which tokens the balance is measured: the batch's together, or each sequence's own,
    # averaged over sequences (MiniMind's seq_aux; needs the task's tokens in rows, not jagged).
    balance: Literal["batch", "sequence"] = "batch"
    hidden: int | None = Field(None, gt=0)  # each expert's hidden width; None: glu_hidden(d, multiple_of)
    multiple_of: int = Field(64, gt=0)
    bias: bool = False
    dropout: float | None = Field(None, ge=0.0, lt=1.0)  # each expert's output dropout

    @field_validator("top_k")
    @classmethod
    def _top_k_within_experts(cls, top_k: int, info: ValidationInfo) -> int:
        experts = info.data.get("experts")
        if experts is not None and top_k > experts:
            raise ValueError(
                f"top_k={top_k} routes each token to more experts than the {experts} there "
                f"are; choose top_k ≤ experts"
            )
        return top_k


class MoEFFN(FeedForward):
    """Top-k routed SwiGLU experts plus optional shared experts (MiniMind; Switch / GShard
    load balancing). Dimensions: ``t`` tokens (all leading dims flattened), ``E`` experts,
    ``k`` chosen experts per token::

        p      = softmax(W_r x)                       [t, E]   router, no bias
        w, i   = top_k(p)                             [t, k]   w ← w / Σ w when normalize_topk and k > 1
        y      = Σ_j w_j · expert_{i_j}(x) + Σ_s shared_s(x)

        aux    = alpha · E · Σ_e f_e · P_e            over the real tokens of the latest training forward
        f_e    = #{(t, j): i_tj = e} / (t · k)        share of the t·k routing slots that went to e (no grad)
        P_e    = mean_t p_te                          mean router probability of e

    With ``balance: sequence`` (MiniMind's ``seq_aux``) ``f`` and ``P`` are each row's own, over
    its real tokens, and ``aux = alpha · mean_b E · Σ_e f_be · P_be``.

    ``f`` and ``P`` each sum to 1, so ``aux = alpha`` under perfect balance; the gradient
    reaches the router through ``P``. As in MiniMind, with ``k = 1`` the chosen probability is
    kept unnormalised so the router still learns from the task loss. The loss is recomputed by
    every training forward and is 0 in eval mode; ``auxiliary_loss()`` returns the latest.

    Dispatch loops over experts, never over tokens. Pass ``valid`` (``[...]`` bool, True at
    real tokens) to keep padded positions out of the balance statistics.
    """

    Options = MoEOptions
    width_option = "hidden"

    def __init__(self, options: MoEOptions, ctx: BuildContext):
        super().__init__(options, ctx)
        expert = GatedOptions(
            hidden=options.hidden, multiple_of=options.multiple_of, bias=options.bias, dropout=options.dropout
        )
        self.top_k, self.alpha = options.top_k, options.alpha
        self.per_sequence = options.balance == "sequence"
        self.normalize = options.normalize_topk and options.top_k > 1
        self.router = nn.Linear(ctx.dim, options.experts, bias=False)
        self.experts = nn.ModuleList(SwiGLU(expert, ctx) for _ in range(options.experts))
        self.shared = nn.ModuleList(SwiGLU(expert, ctx) for _ in range(options.shared_experts))
        self._aux: Tensor | None = None

    def route(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``x [t, d]`` → router probabilities ``p [t, E]``, weights ``w [t, k]``, experts ``i [t, k]``."""
        p = self.router(x).softmax(dim=-1)
        w, i = p.topk(self.top_k, dim=-1)
        if self.normalize:
            w = w / (w.sum(-1, keepdim=True) + 1e-20)
        return p, w, i

    def balance_loss(self, p: Tensor, i: Tensor, valid: Tensor) -> Tensor:
        """``alpha · E · Σ_e f_e P_e`` over the tokens where ``valid [t]`` is True."""
        E = p.shape[-1]
        p, i = p[valid], i[valid]
        slots = max(i.numel(), 1)
        f = torch.bincount(i.flatten(), minlength=E).to(p.dtype) / slots
        P = p.sum(0) / max(p.shape[0], 1)
        return self.alpha * E * (f * P).sum()

    def sequence_balance_loss(self, p: Tensor, i: Tensor, valid: Tensor) -> Tensor:
        """``alpha · mean_b E · Σ_e f_be P_be`` over each row's real tokens (``p [b, n, E]``,
        ``i [b, n, k]``, ``valid [b, n]``); rows without a real token are left out."""
        b, _, E = p.shape
        w = valid.to(p.dtype)
        tokens = w.sum(1)  # [b]
        slots = w[..., None].expand(i.shape).reshape(b, -1)
        f = (
            p.new_zeros(b, E).scatter_add_(1, i.reshape(b, -1), slots)
            / (tokens * self.top_k).clamp(min=1)[:, None]
        )
        P = (p * w[..., None]).sum(1) / tokens.clamp(min=1)[:, None]
        per_row = E * (f * P).sum(1)
        return self.alpha * per_row[tokens > 0].mean() if bool((tokens > 0).any()) else p.new_zeros(())

    def forward(self, x: Tensor, valid: Tensor | None = None) -> Tensor:
        shape = x.shape
        if self.per_sequence and self.training and (x.dim() != 3 or (valid is not None and valid.dim() != 2)):
            raise ValueError(
                "moe: balance 'sequence' measures each sequence's balance, but this FFN receives the "
                "tokens without their rows (a jagged layout); set the task's jagged: false, or balance: batch"
            )
        x = x.reshape(-1, shape[-1])  # [t, d]
        p, w, i = self.route(x)
        y = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            token, slot = (i == e).nonzero(as_tuple=True)
            y = y.index_add(0, token, (w[token, slot, None] * expert(x[token])).to(y.dtype))
        for shared in self.shared:
            y = y + shared(x)
        valid = x.new_ones(x.shape[0], dtype=torch.bool) if valid is None else valid.reshape(-1)
        if not self.training:
            self._aux = x.new_zeros(())
        elif self.per_sequence:
            rows = shape[:-1]
            self._aux = self.sequence_balance_loss(p.view(*rows, -1), i.view(*rows, -1), valid.view(rows))
        else:
            self._aux = self.balance_loss(p, i, valid)
        return y.reshape(shape)

    def auxiliary_loss(self) -> Tensor | None:
        return self._aux


# -- no feed-forward ----------------------------------------------------------------------------


class NoFFN(FeedForward):
    """HSTU has no FFN: the sub-layer contributes nothing, ``y = 0`` (so a residual block
    passes its input through). No parameters."""

    def forward(self, x: Tensor, valid: Tensor | None = None) -> Tensor:
        return torch.zeros_like(x)

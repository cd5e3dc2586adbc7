"""Seed 004's own mHC: the ``MHCLayer`` its report writes (§3, "mHC流形约束超连接"), as a connection
kind ``mhc_layer``. It is not DeepSeek's multi-stream mHC (the ``mhc`` kind of
:mod:`ablate_plugins.connection`): one residual stream, and per token a mixing of the ``d`` features
by ``h`` Sinkhorn-normalised ``d × d`` matrices, averaged, projected and added back.

Dimensions: ``b`` batch, ``n`` tokens, ``d`` model width, ``h`` the layer's heads (mixing matrices).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
from pydantic import Field
from torch import Tensor, nn

from ablate.components import BuildContext, Connection, Dropout, Options, default

__all__ = ["SeedMHCLayer", "seed_sinkhorn"]

# The seed's ``sinkhorn_knopp``: ε added once to the matrix, 10⁻¹⁰ to every row and column sum.
EPS, SUM_EPS = 1e-6, 1e-10


def seed_sinkhorn(weights: Tensor, iterations: int = 20) -> Tensor:
    """The seed's ``sinkhorn_knopp(W, num_iterations)`` on ``weights [..., d, d]``::

        P ← W + 10⁻⁶;  repeat: P ← P / (P 1 + 10⁻¹⁰) (rows), P ← P / (1ᵀ P + 10⁻¹⁰) (columns)

    exactly as written there: no exponential or absolute value first. The seed's text (§3.1) calls
    it the projection of a non-negative matrix onto the doubly stochastic ones; its layer feeds it
    the raw ``N(0, 1)`` weights. On signed weights the iteration does not converge: rows whose sum
    comes near 0 are blown up at every step, ``P`` stays signed (columns sum to 1, rows do not;
    spectral norms of 10–1,000 at d = 50 from the N(0, 1) start), and it is chaotic: at d = 50 a
    relative change of 10⁻¹⁵ in the weights changes ``P`` by 10⁻⁶ of its largest entry after 3
    iterations, 6·10⁻⁴ after 4 and by more than its largest entry from 5 on (float64, 20 N(0, 1)
    draws, 2026-11-26), so after the seed's 20 the result depends on the rounding of every sum.
    In training it overflows: on studies/tisasrec_ml1m.yaml the first step's gradients are NaN.
    ``positive: exp`` gives it ``exp(W)`` instead, the non-negative matrix its text asks for."""
    p = weights + EPS
    for _ in range(iterations):
        p = p / (p.sum(-1, keepdim=True) + SUM_EPS)
        p = p / (p.sum(-2, keepdim=True) + SUM_EPS)
    return p


# ``positive`` → the matrix the Sinkhorn iterations start from.
POSITIVE = {"none": lambda w: w, "exp": torch.exp}


class SeedMHCOptions(Options):
    heads: int = Field(4, ge=1)  # the layer's num_heads: how many d × d matrices it averages
    iterations: int = Field(20, ge=1)  # Sinkhorn iterations (the layer calls sinkhorn_knopp with 20)
    # What the weights become before the iterations: "none", the raw N(0, 1) weights (the seed's
    # code), or "exp", positive entries (the non-negative matrix the seed's text §3.1 projects).
    positive: Literal[tuple(POSITIVE)] = "none"
    # After which sub-layers the layer runs: the attention's only (the seed's table: "MultiHead+mHC"),
    # or every sub-layer's.
    after: Literal["attention", "every"] = "attention"
    dropout: float | None = Field(None, ge=0.0, lt=1.0)  # on the sub-layer's output; None: the model's
    # The layer's own dropout on its projection (the seed's dropout_rate); None: the model's.
    layer_dropout: float | None = Field(None, ge=0.0, lt=1.0)


class SeedMHCLayer(Connection):
    """Seed 004's ``MHCLayer`` after a sub-layer's residual join. Per token ``x ∈ ℝ^d``::

        y   = x + dropout(f(x))                          the residual join (as ``residual``)
        H_k = Sinkhorn(W_k),  k = 1 … h                  W_k ∈ ℝ^{d×d}, seed_sinkhorn
                                                         (of exp(W_k) with ``positive: exp``)
        out = y + layer_dropout(W_o ((1/h) Σ_k y H_k) + b_o)

    with ``W_k ~ N(0, 1)`` (``torch.randn``), ``W_o`` Xavier-uniform and ``b_o = 0``, as the seed
    initialises them (a study's ``model.init`` may re-initialise ``W_o``, as every linear layer).
    ``after: attention`` (the default) applies it after the attention sub-layers only, ``every``
    after the FFNs too; elsewhere the kind is the plain residual. The seed zeroes ``y H_k`` at padded
    positions before the projection; padded positions' outputs are never read and, position-wise,
    reach no real token, so this kind leaves them as they are (and works on jagged tokens alike)."""

    Options = SeedMHCOptions

    def __init__(self, options: SeedMHCOptions, ctx: BuildContext):
        super().__init__(options, ctx)
        d = ctx.dim
        self.dropout = Dropout(default(options.dropout, ctx.dropout))
        self.active = options.after == "every" or ctx.layer % 2 == 0  # sub-layer 2i: block i's attention
        if self.active:
            self.hyper_weights = nn.Parameter(torch.randn(options.heads, d, d))
            self.out_proj = nn.Linear(d, d)
            nn.init.xavier_uniform_(self.out_proj.weight)
            nn.init.zeros_(self.out_proj.bias)
            self.layer_dropout = Dropout(default(options.layer_dropout, ctx.dropout))

    def mixing(self) -> Tensor:
        """``(1/h) Σ_k H_k`` ``[d, d]``: the mean of the heads' outputs is ``y`` times this."""
        weights = POSITIVE[self.options.positive](self.hyper_weights)
        return seed_sinkhorn(weights, self.options.iterations).mean(0)

    def forward(self, streams: Tensor, branch: Callable[[Tensor], Tensor]) -> Tensor:
        y = streams + self.dropout(branch(streams))
        if not self.active:
            return y
        return y + self.layer_dropout(self.out_proj(y @ self.mixing().to(y.dtype)))

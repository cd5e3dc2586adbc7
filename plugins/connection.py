"""Connection kinds: how a sub-layer's output joins the residual stream(s).

Dimensions: ``b`` batch, ``n`` tokens, ``d`` model width, ``s`` residual streams
(``t`` and ``u`` also index streams where a formula needs two).

* ``residual``: one stream, ``x ← x + f(x)``.
* ``hyper`` (Hyper-Connections, Zhu et al. 2025) and ``mhc`` (Manifold-Constrained
  Hyper-Connections, DeepSeek 2025) keep ``s`` streams, layout ``[b, n, s, d]``; per token,
  with ``x ∈ ℝ^{s×d}``::

      x ← H_res x + H_postᵀ f(H_pre x)       H_pre, H_post ∈ ℝ^{1×s},  H_res ∈ ℝ^{s×s}

  (row ``t`` of ``H_res`` says how much of each old stream enters new stream ``t``).
  Both share one stem: ``expand`` copies the embedding into every stream (as the papers do),
  ``reduce`` averages the streams. The papers sum; the mean differs only by the factor ``s``,
  which a scale-invariant final norm removes, and it makes ``hyper`` at initialisation equal
  the plain residual backbone exactly, for every final norm (``none`` included).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor, nn

from ablate import kernels
from ablate.components import BuildContext, Connection, Dropout, Options, Stem, default

__all__ = ["Residual", "HyperConnection", "ManifoldHyperConnection", "StreamStem", "sinkhorn_knopp"]


class ResidualOptions(Options):
    dropout: float | None = Field(None, ge=0.0, lt=1.0)  # None uses the model's dropout


class Residual(Connection):
    """``x ← x + dropout(f(x))`` with ``x: [b, n, d]``; expand / reduce are the identity."""

    Options = ResidualOptions

    def __init__(self, options: ResidualOptions, ctx: BuildContext):
        super().__init__(options, ctx)
        self.dropout = Dropout(ctx.dropout if options.dropout is None else options.dropout)

    def forward(self, streams: Tensor, branch: Callable[[Tensor], Tensor]) -> Tensor:
        return streams + self.dropout(branch(streams))


# ---------------------------------------------------------------------------------------------
# multi-stream connections


class StreamStem(Stem):
    """``expand``: ``[b, n, d] → [b, n, s, d]``, a copy per stream; ``reduce``: mean over ``s``."""

    def __init__(self, streams: int):
        super().__init__()
        self.streams = streams

    def expand(self, x: Tensor) -> Tensor:
        return x.unsqueeze(-2).expand(*x.shape[:-1], self.streams, x.shape[-1])

    def reduce(self, streams: Tensor) -> Tensor:
        return streams.mean(dim=-2)

    def extra_repr(self) -> str:
        return f"streams={self.streams}"


def join(
    streams: Tensor,
    branch: Callable[[Tensor], Tensor],
    dropout: nn.Module,
    pre: Tensor,
    post: Tensor,
    res: Tensor,
) -> Tensor:
    """``x ← H_res x + H_postᵀ f(H_pre x)`` per token.

    ``streams: [b, n, s, d]``, ``pre, post: [b, n, s]``, ``res: [b, n, t, s]`` (t: new stream);
    any leading dims work, e.g. jagged ``[tokens, s, d]``. The mixing runs as one pass per token
    where :mod:`ablate.kernels` has a kernel for it."""
    y = dropout(branch(kernels.mix_in(streams, pre)))
    return kernels.mix_out(streams, res, post, y)


class HyperOptions(Options):
    streams: int = Field(4, ge=1)  # s, the expansion rate
    dynamic: bool = True  # tanh-dynamic coefficients (the paper's DHC); False gives static SHC
    dropout: float | None = Field(None, ge=0.0, lt=1.0)  # on the branch output; None: the model's


class HyperConnection(Connection):
    """Hyper-Connections (Zhu et al. 2025), static + dynamic coefficients.

    Per token, with ``x ∈ ℝ^{s×d}`` and ``x̄ = RMSNorm(x)`` row by row (one row per stream)::

        A_m = a_m + s_α · tanh(x̄ W_m)          ∈ ℝ^{s}      (W_m ∈ ℝ^{d×1})
        A_r = A_r⁰ + s_α · tanh(x̄ W_r)         ∈ ℝ^{s×s}    (W_r ∈ ℝ^{d×s})
        B   = b + s_β · tanh(x̄ W_β)ᵀ           ∈ ℝ^{s}      (W_β ∈ ℝ^{d×1})
        x ← A_rᵀ x + Bᵀ f(A_mᵀ x)              i.e. H_pre = A_mᵀ, H_res = A_rᵀ, H_post = B

    (``[W_m | W_r]`` is the paper's ``W_α``.) The scales ``s_α, s_β`` start at 0 and the
    projections ``W`` at small random values, so the dynamic part is 0 at initialisation; the
    scales receive gradients from the first step, the projections once the scales leave 0.

    Initialisation (reproduces the pre-norm residual). Let the stem copy ``x_0`` into every
    stream and take the mean at the end, and start with

        a_m = e_k (one-hot: read stream k),   A_r⁰ = I,   b = 1.

    Induction: if every stream holds the residual state ``x_l``, then ``H_pre x = x_k = x_l``
    is the plain residual's branch input, ``H_res x = x`` keeps each stream, and ``H_post``
    adds ``f(x_l)`` once to each stream, so every stream holds ``x_l + f(x_l) = x_{l+1}``.
    The mean of ``s`` copies of ``x_L`` is ``x_L``: the backbone equals the residual one. (Post-
    norm placement normalises each stream alike, so the same argument holds there.)

    As in the paper, sub-layer ``l`` reads stream ``k = l mod s`` (``BuildContext.layer``). Any
    one-hot works for the identity above; what matters is that sub-layers read different
    streams, which makes the gradients differ between streams and lets them separate.
    (Averaging, ``a_m = 1/s``, would also reproduce the residual, but every coefficient would
    then be symmetric in the streams and static hyper-connections would keep ``s`` equal
    copies for ever.)
    """

    Options = HyperOptions
    single_stream = False

    def __init__(self, options: HyperOptions, ctx: BuildContext):
        super().__init__(options, ctx)
        s, d = options.streams, ctx.dim
        self.dropout = Dropout(default(options.dropout, ctx.dropout))
        k = ctx.layer % s  # the stream this sub-layer reads at initialisation (paper: l mod s)
        self.pre = nn.Parameter(torch.eye(s)[k])  # a_m = e_k
        self.res = nn.Parameter(torch.eye(s))  # A_r⁰ (rows: old stream, columns: new stream)
        self.post = nn.Parameter(torch.ones(s))  # b
        if options.dynamic:
            self.w_alpha = nn.Parameter(0.02 * torch.randn(d, 1 + s))  # [W_m | W_r]
            self.w_beta = nn.Parameter(0.02 * torch.randn(d, 1))  # W_β
            self.scale_alpha = nn.Parameter(torch.zeros(()))  # s_α
            self.scale_beta = nn.Parameter(torch.zeros(()))  # s_β

    def coefficients(self, streams: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``H_pre, H_post: [b, n, s]`` and ``H_res: [b, n, t, s]`` for ``streams: [b, n, s, d]``."""
        s = self.options.streams
        a_m, a_r, b = self.pre, self.res, self.post
        if self.options.dynamic:
            x_bar = F.rms_norm(streams, (streams.shape[-1],))
            alpha = self.scale_alpha * torch.tanh(x_bar @ self.w_alpha)  # [b, n, s, 1 + s]
            a_m = a_m + alpha[..., 0]
            a_r = a_r + alpha[..., 1:]
            b = b + self.scale_beta * torch.tanh(x_bar @ self.w_beta)[..., 0]
        else:
            shape = (*streams.shape[:-2], s)
            a_m, b, a_r = a_m.expand(shape), b.expand(shape), a_r.expand(*shape, s)
        return a_m, b, a_r.transpose(-1, -2)

    def forward(self, streams: Tensor, branch: Callable[[Tensor], Tensor]) -> Tensor:
        pre, post, res = self.coefficients(streams)
        return join(streams, branch, self.dropout, pre, post, res)

    @classmethod
    def stem(cls, options: HyperOptions, ctx: BuildContext) -> Stem:
        return StreamStem(options.streams)


def sinkhorn_knopp(logits: Tensor, iters: int = 20) -> Tensor:
    """Doubly stochastic matrices from ``logits [..., s, s]``: ``M = exp(logits)``, then
    ``iters`` rounds of column normalisation followed by row normalisation, ``M ← T_r(T_c(M))``
    (rows sum to 1 exactly, columns to within the convergence of the iteration). On CPU in
    float32/float64 one fused kernel computes it (:func:`ablate.kernels.sinkhorn`)."""
    return kernels.sinkhorn(logits, iters)


class ManifoldOptions(Options):
    streams: int = Field(4, ge=2)  # s (n in the paper); H_pre = 1/s at init needs s ≥ 2
    alpha: float = 0.01  # initial gating factors α_pre, α_post, α_res
    res_logit: float = 2.0  # initial diagonal of H̃_res (off-diagonal 0): H_res leans to identity
    sinkhorn_iters: int = Field(20, ge=1)  # t_max
    dropout: float | None = Field(None, ge=0.0, lt=1.0)  # on the branch output; None: the model's


class ManifoldHyperConnection(Connection):
    """mHC (DeepSeek 2025): hyper-connections whose ``H_res`` lies on the Birkhoff polytope.

    Per token, with all streams flattened, ``x̃ = RMSNorm(vec x) ∈ ℝ^{1×sd}``::

        H̃_pre  = α_pre  · x̃ φ_pre       + b_pre      ∈ ℝ^{1×s}
        H̃_post = α_post · x̃ φ_post      + b_post     ∈ ℝ^{1×s}
        H̃_res  = α_res  · mat(x̃ φ_res)  + b_res      ∈ ℝ^{s×s}
        H_pre = σ(H̃_pre),   H_post = 2σ(H̃_post),   H_res = SinkhornKnopp(H̃_res)
        x ← H_res x + H_postᵀ f(H_pre x)

    ``H_res`` is doubly stochastic, so each new stream is a convex combination of the old
    ones and the mean over streams is preserved by the residual path.

    Initialisation, with the same copy / mean stem as ``hyper``: ``b_pre = logit(1/s)``
    (``H_pre`` averages the streams), ``b_post = 0`` (``H_post = 1``), ``b_res = c·I`` with
    ``c = res_logit`` (for ``s = 4``, ``c = 2`` puts 0.71 on the diagonal of ``H_res``),
    ``α = alpha`` and ``φ ~ N(0, 1/(sd))`` (so ``x̃φ`` has unit scale). While the streams are
    equal, a row-stochastic ``H_res`` maps them to themselves, so at initialisation the block
    departs from the plain residual only through the ``α``-scaled dynamic terms (exactly the
    residual block for ``alpha = 0``). Averaging reads are symmetric in the streams, but the
    dynamic terms are not (``φ`` has a different random column per stream, and ``α ≠ 0``),
    so the streams separate from the first step.

    Why not a sharper, identity-like ``b_res`` (0 on the diagonal, −8 off it): Sinkhorn-Knopp
    converges slowly on near-permutation matrices, and after a perturbation of 0.3 in the logits
    20 iterations leave column sums off by ~3·10⁻³ (by ~2·10⁻⁵ from ``c = 2``). Rows always sum
    to 1 exactly (the last step normalises rows).
    """

    Options = ManifoldOptions
    single_stream = False

    def __init__(self, options: ManifoldOptions, ctx: BuildContext):
        super().__init__(options, ctx)
        s, d = options.streams, ctx.dim
        self.dropout = Dropout(default(options.dropout, ctx.dropout))
        # [φ_pre | φ_post | φ_res], one matrix as in the paper
        self.phi = nn.Parameter(torch.randn(s * d, 2 * s + s * s) / math.sqrt(s * d))
        self.alpha = nn.Parameter(torch.full((3,), options.alpha))  # α_pre, α_post, α_res
        self.b_pre = nn.Parameter(torch.full((s,), -math.log(s - 1)))  # σ(b) = 1/s
        self.b_post = nn.Parameter(torch.zeros(s))
        self.b_res = nn.Parameter(options.res_logit * torch.eye(s))

    def coefficients(self, streams: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``H_pre, H_post: [b, n, s]`` and ``H_res: [b, n, t, s]`` for ``streams: [b, n, s, d]``."""
        s = self.options.streams
        x = F.rms_norm(streams.flatten(-2), (streams.shape[-1] * s,))  # [b, n, s·d]
        pre, post, res = (x @ self.phi).split([s, s, s * s], dim=-1)
        pre = torch.sigmoid(self.alpha[0] * pre + self.b_pre)
        post = 2 * torch.sigmoid(self.alpha[1] * post + self.b_post)
        res = self.alpha[2] * res.unflatten(-1, (s, s)) + self.b_res
        res = sinkhorn_knopp(res, self.options.sinkhorn_iters)
        return pre, post, res

    def forward(self, streams: Tensor, branch: Callable[[Tensor], Tensor]) -> Tensor:
        pre, post, res = self.coefficients(streams)
        return join(streams, branch, self.dropout, pre, post, res)

    @classmethod
    def stem(cls, options: ManifoldOptions, ctx: BuildContext) -> Stem:
        return StreamStem(options.streams)

"""Normalisation kinds over the last dimension: ``[..., d] -> [..., d]``.

Dimensions: ``d`` model width.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor, nn

from ablate.components import BuildContext, Norm, Options


class LayerNormOptions(Options):
    eps: float = Field(1e-5, gt=0.0)
    affine: bool = True  # learned gain and bias


class RMSNormOptions(Options):
    eps: float = Field(1e-6, gt=0.0)
    affine: bool = True  # learned gain (FuXi-α's rms_norm has none)


def rms_norm_reference(x: Tensor, shape: tuple[int, ...], weight: Tensor | None, eps: float) -> Tensor:
    """``y = x / √(mean(x²) + eps) · w``, for torch builds without ``F.rms_norm``."""
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y if weight is None else y * weight


rms_norm = getattr(F, "rms_norm", rms_norm_reference)


class LayerNorm(Norm):
    """``y = (x − mean(x)) / √(var(x) + eps) · γ + β`` (Ba et al. 2016)."""

    Options = LayerNormOptions

    def __init__(self, options: LayerNormOptions, ctx: BuildContext):
        super().__init__(options, ctx)
        self.norm = nn.LayerNorm(ctx.dim, eps=options.eps, elementwise_affine=options.affine)

    def forward(self, x: Tensor) -> Tensor:
        return self.norm(x)


class RMSNorm(Norm):
    """``y = x / √(mean(x²) + eps) · w`` (Zhang & Sennrich 2019), ``w`` initialised to ones;
    without ``affine`` there is no ``w``."""

    Options = RMSNormOptions

    def __init__(self, options: RMSNormOptions, ctx: BuildContext):
        super().__init__(options, ctx)
        self.eps, self.shape = options.eps, (ctx.dim,)
        self.weight = nn.Parameter(torch.ones(ctx.dim)) if options.affine else None

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.shape, self.weight, self.eps)


class NoNorm(Norm):
    """``y = x``: no normalisation (an ablation baseline). No parameters."""

    def forward(self, x: Tensor) -> Tensor:
        return x

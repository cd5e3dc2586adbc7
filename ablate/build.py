"""Model assembly: a resolved variant's backbone of blocks, laid out by
:func:`ablate.blocks.assemble` (which :mod:`ablate.sizes` counts from too)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

from .blocks import Backbone, assemble
from .components import BuildContext

if TYPE_CHECKING:  # pragma: no cover
    from .study import Variant


def build_backbone(variant: Variant, ctx: BuildContext) -> Backbone:
    return assemble(variant, ctx)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)

"""Model assembly: a resolved variant's backbone of blocks, laid out by
:func:`ablate.model.blocks.assemble` (which :mod:`ablate.study.sizes` counts from too)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

from ablate.components import BuildContext
from ablate.model.blocks import Backbone, assemble

if TYPE_CHECKING:  # pragma: no cover
    from ablate.study.load import Variant


def build_backbone(variant: Variant, ctx: BuildContext) -> Backbone:
    return assemble(variant, ctx)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)

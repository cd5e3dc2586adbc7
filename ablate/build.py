"""Model assembly: turn a resolved variant into a backbone of blocks (:mod:`ablate.blocks`).

Every kind is built as ``Kind(options, ctx)``; sub-layer ``l`` (block ``i``'s attention is
``2i``, its FFN ``2i + 1``) gets ``ctx.layer = l``.
"""

from __future__ import annotations

from dataclasses import replace

from torch import nn

from .blocks import INITIALISERS, PLACEMENTS, Backbone, Block
from .components import BuildContext
from .study import Part, Variant


def make(part: Part, ctx: BuildContext) -> nn.Module:
    return part.cls(part.options, ctx)


def build_backbone(variant: Variant, ctx: BuildContext) -> Backbone:
    placement = PLACEMENTS[variant.spec.norm.placement]  # the study loader checked the kinds fit
    initialise = INITIALISERS[variant.spec.init]

    def placed(placed_cls: type[nn.Module], layer: int) -> nn.Module:
        here = replace(ctx, layer=layer)
        return placed_cls(make(variant.norm, here), make(variant.connection, here))

    own = [b for b in variant.bias if b.cls.one_per_block(b.options)]  # one instance per block
    blocks = [
        Block(
            make(variant.attention, replace(ctx, layer=2 * i)),
            make(variant.ffn, replace(ctx, layer=2 * i + 1)),
            placed(placement.mix, 2 * i),
            placed(placement.feed, 2 * i + 1),
            bias=[make(b, replace(ctx, layer=2 * i)) for b in own],
        )
        for i in range(variant.spec.blocks)
    ]
    for block in blocks:
        initialise(block)
    return Backbone(
        bias=[make(b, ctx) for b in variant.bias if not b.cls.one_per_block(b.options)],
        stem=variant.connection.cls.stem(variant.connection.options, ctx),
        blocks=blocks,
        final_norm=make(variant.norm, ctx) if variant.spec.final_norm else nn.Identity(),
        dropout=variant.spec.dropout,
    )


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)

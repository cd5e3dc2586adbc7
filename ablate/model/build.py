"""Model assembly: a resolved variant's backbone of blocks, each kind built as ``Kind(options, ctx)``
and handed to the block that places it (:mod:`ablate.study.sizes` counts from the same layout, on
the meta device)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from torch import nn

from ablate.components import BuildContext
from ablate.model.blocks import INITIALISERS, PLACEMENTS, Backbone, Block, Placed

if TYPE_CHECKING:  # pragma: no cover
    from ablate.model.variant import Variant


# How one module of a variant's component (a :class:`~ablate.model.variant.Part`) is made, given the call that
# constructs it: as it is (a model), or on the meta device with the component blamed when it
# refuses its settings (a size estimate).
Maker = Callable[[Any, Callable[[], nn.Module]], nn.Module]


def construct(part: Any, constructor: Callable[[], nn.Module]) -> nn.Module:
    return constructor()


def assemble(variant: Variant, ctx: BuildContext, made: Maker = construct) -> Backbone:
    """The backbone of a resolved variant: its shared bias channels, its connection's stem,
    ``spec.blocks`` blocks (attention, FFN, each placed with a norm and a connection, and the bias
    channels of the block's own), the final norm. Every kind is built as ``Kind(options, ctx)``;
    sub-layer ``l`` (block ``i``'s attention is ``2i``, its FFN ``2i + 1``) gets ``ctx.layer = l``."""
    spec = variant.spec
    ctx = replace(ctx, shared={})  # what this backbone's blocks share, and no other build's
    placement = PLACEMENTS[spec.norm.placement]  # the study loader checked the kinds fit
    initialise = INITIALISERS[spec.init]

    def make(part: Any, here: BuildContext) -> nn.Module:
        return made(part, lambda: part.cls(part.options, here))

    def placed(placed_cls: type[Placed], layer: int) -> nn.Module:
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
        for i in range(spec.blocks)
    ]
    for block in blocks:
        initialise(block)
    connection = variant.connection
    return Backbone(
        bias=[make(b, ctx) for b in variant.bias if not b.cls.one_per_block(b.options)],
        stem=made(connection, lambda: connection.cls.stem(connection.options, ctx)),
        blocks=blocks,
        final_norm=make(variant.norm, ctx) if spec.final_norm else nn.Identity(),
        dropout=spec.dropout,
    )


def build_backbone(variant: Variant, ctx: BuildContext) -> Backbone:
    return assemble(variant, ctx)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)

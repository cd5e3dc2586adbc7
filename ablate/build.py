"""Model assembly: turn a resolved variant into a backbone of blocks.

A block is ``connection(norm → attention)`` then ``connection(norm → ffn)`` with the norm
placed before the branch (``pre``) or after the join (``post``). Each block receives its
modules ready-made; nothing inside a block branches on configuration.

Dimensions: ``b`` batch, ``n`` tokens, ``d`` width, ``s`` residual streams.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

import torch
from torch import Tensor, nn

from .components import BuildContext, Dropout, TokenContext
from .jagged import last_of_rows
from .study import Part, Variant


def make(part: Part, ctx: BuildContext) -> nn.Module:
    return part.cls(part.options, ctx)


class PreNorm(nn.Module):
    """``streams ← connection(streams, branch ∘ norm)``."""

    def __init__(self, norm: nn.Module, connection: nn.Module):
        super().__init__()
        self.norm, self.connection = norm, connection

    def forward(self, streams: Tensor, branch: Callable[[Tensor], Tensor]) -> Tensor:
        return self.connection(streams, lambda h: branch(self.norm(h)))


class PostNorm(nn.Module):
    """``streams ← norm(connection(streams, branch))`` (original Transformer / SASRec paper)."""

    def __init__(self, norm: nn.Module, connection: nn.Module):
        super().__init__()
        self.norm, self.connection = norm, connection

    def forward(self, streams: Tensor, branch: Callable[[Tensor], Tensor]) -> Tensor:
        return self.norm(self.connection(streams, branch))


class PreNormSkip(nn.Module):
    """``streams ← connection(norm(streams), branch)``: the skip path carries the normalised
    stream too, ``x ← LN(x) + f(LN(x))`` — what SASRec's released code does (its paper writes
    ``x + f(LN(x))``). Up to the first norm this is post-norm: ``LN`` closes each join."""

    def __init__(self, norm: nn.Module, connection: nn.Module):
        super().__init__()
        self.norm, self.connection = norm, connection

    def forward(self, streams: Tensor, branch: Callable[[Tensor], Tensor]) -> Tensor:
        return self.connection(self.norm(streams), branch)


class PreNormSkipSource(nn.Module):
    """As :class:`PreNormSkip`, and the branch also receives the un-normalised stream as the
    attention's key / value source: ``x ← LN(x) + Attn(q = LN(x), k = v = x)`` — SASRec's
    released code (``Q = LN(seqs); mha(Q, seqs, seqs)``). Single-stream connections only: the
    branch input must be the connection's own input for ``x`` to be its un-normalised form."""

    def __init__(self, norm: nn.Module, connection: nn.Module):
        super().__init__()
        self.norm, self.connection = norm, connection

    def forward(self, streams: Tensor, branch: Callable[..., Tensor]) -> Tensor:
        return self.connection(self.norm(streams), lambda h: branch(h, source=streams))


# ``model.norm.placement`` → (attention sub-layer, FFN sub-layer) placements.
PLACEMENTS: dict[str, tuple[type[nn.Module], type[nn.Module]]] = {
    "pre": (PreNorm, PreNorm),
    "post": (PostNorm, PostNorm),
    "pre_skip": (PreNormSkip, PreNormSkip),
    "pre_skip_kv": (PreNormSkipSource, PreNormSkip),
}


class Block(nn.Module):
    def __init__(self, attention: nn.Module, ffn: nn.Module, mix: nn.Module, feed: nn.Module):
        super().__init__()
        self.attention, self.ffn = attention, ffn
        self.mix, self.feed = mix, feed  # the two placed sub-layers

    def forward(self, streams: Tensor, tokens: TokenContext) -> Tensor:
        """``streams`` in ``tokens.layout`` (``[b, n, (s,) d]`` or jagged ``[t, (s,) d]``); the
        attention sees padded blocks, the FFN whatever the layout holds."""
        layout = tokens.layout

        def attend(h: Tensor, source: Tensor | None = None) -> Tensor:
            if source is None:
                return layout.values(self.attention(layout.padded(h), tokens))
            return layout.values(self.attention(layout.padded(h), tokens, source=layout.padded(source)))

        streams = self.mix(streams, attend)
        return self.feed(streams, lambda h: self.ffn(h, layout.values(tokens.valid)))

    def last(self, streams: Tensor, tokens: TokenContext) -> Tensor:
        """The block's output at each row's last real token only, ``[b, 1, (s,) d]``.

        The attention needs every token's branch input (its keys and values) but computes one
        query per row; the join and the FFN only run on the last tokens. Placements and
        connections are position-wise up to the branch, so the branch input at every token comes
        from one run of the placed sub-layer stopped at its branch (:class:`_BranchInput`), and the
        join from a second run on the last tokens alone, whose branch hands back the attention."""
        layout, lengths = tokens.layout, tokens.lengths

        def stop(h: Tensor, source: Tensor | None = None) -> Tensor:
            raise _BranchInput(h, source)

        try:
            self.mix(streams, stop)
        except _BranchInput as given:
            every, source = given.h, given.source
        else:  # pragma: no cover - every placement calls its branch
            raise RuntimeError("the placed attention sub-layer never called its branch")
        padded = layout.padded(every)
        if source is None:
            attended = self.attention.last_query(padded, tokens)
        else:
            attended = self.attention.last_query(padded, tokens, source=layout.padded(source))
        attended = attended.unsqueeze(1)  # [b, 1, d]: the last tokens, in a padded layout of length 1

        last_streams = layout.last(streams, lengths).unsqueeze(1)
        joined = self.mix(last_streams, lambda h, source=None: attended)
        return self.feed(joined, lambda h: self.ffn(h, tokens.valid.new_ones(len(lengths), 1)))


class _BranchInput(Exception):
    """Carries a placed sub-layer's branch input out of it, before the join (:meth:`Block.last`)."""

    def __init__(self, h: Tensor, source: Tensor | None):
        super().__init__()
        self.h, self.source = h, source


class Backbone(nn.Module):
    """Embedded tokens ``[b, n, d]`` → bias channels → blocks → final norm ``[b, n, d]``.

    Between the bias channels and the output the stream is held in ``tokens.layout``: with a
    jagged layout, FFNs, norms and joins only touch the real tokens."""

    def __init__(self, bias: list[nn.Module], stem: nn.Module, blocks: list[Block], final_norm: nn.Module,
                 dropout: float):
        super().__init__()
        self.bias = nn.ModuleList(bias)
        self.stem = stem  # the connection kind's expand / reduce
        self.blocks = nn.ModuleList(blocks)
        self.final_norm = final_norm
        self.dropout = Dropout(dropout)

    def forward(self, x: Tensor, tokens: TokenContext, last_only: bool = False) -> Tensor:
        """``[b, n, d]``, or with ``last_only`` ``[b, d]`` at each row's last real token (causal
        right-padded rows: next-item ranking), the final block computing only those."""
        # The caller's context stays untouched: bias channels fill in a per-forward copy.
        tokens = replace(tokens, rotations=list(tokens.rotations))
        logit_biases = []
        for channel in self.bias:
            x = channel.embed(x, tokens)
            bias = channel.logits(tokens)
            if bias is not None:
                logit_biases.append(bias)
            if channel.rotates:
                tokens.rotations.append(channel.rotate)
        if logit_biases:
            summed = torch.stack(torch.broadcast_tensors(*logit_biases)).sum(0)
            tokens.logit_bias = summed if tokens.logit_bias is None else tokens.logit_bias + summed
        x = x * tokens.valid.unsqueeze(-1).to(x.dtype)
        # Position-wise work from here on runs on the layout's tokens (all real ones if jagged).
        streams = self.stem.expand(self.dropout(tokens.layout.values(x)))
        if last_only and self.blocks:
            for block in self.blocks[:-1]:
                streams = block(streams, tokens)
            return self.final_norm(self.stem.reduce(self.blocks[-1].last(streams, tokens)))[:, 0]
        for block in self.blocks:
            streams = block(streams, tokens)
        out = tokens.layout.padded(self.final_norm(self.stem.reduce(streams)))
        return last_of_rows(out, tokens.lengths) if last_only else out

    def auxiliary_loss(self) -> Tensor | None:
        """Sum of every sub-module's auxiliary loss (e.g. MoE load balancing), or None."""
        terms = [t for m in self.modules() if m is not self and hasattr(m, "auxiliary_loss")
                 for t in [m.auxiliary_loss()] if t is not None]
        return torch.stack(terms).sum() if terms else None


def build_backbone(variant: Variant, ctx: BuildContext) -> Backbone:
    placements = PLACEMENTS[variant.spec.norm.placement]  # the study loader checked the kinds fit

    def sublayer(layer: int) -> nn.Module:
        here = replace(ctx, layer=layer)
        return placements[layer % 2](make(variant.norm, here), make(variant.connection, here))

    blocks = [
        Block(make(variant.attention, replace(ctx, layer=2 * i)), make(variant.ffn, replace(ctx, layer=2 * i + 1)),
              sublayer(2 * i), sublayer(2 * i + 1))
        for i in range(variant.spec.blocks)
    ]
    for block in blocks:
        INITIALISERS[variant.spec.init](block)
    return Backbone(
        bias=[make(b, ctx) for b in variant.bias],
        stem=variant.connection.cls.stem(variant.connection.options, ctx),
        blocks=blocks,
        final_norm=make(variant.norm, ctx),
        dropout=variant.spec.dropout,
    )


def xavier_normal_linears(module: nn.Module) -> None:
    """Xavier-normal weights ``N(0, 2 / (fan_in + fan_out))`` for every ``nn.Linear`` inside
    ``module``; biases and other parameters keep their kind's initialisation."""
    for layer in module.modules():
        if isinstance(layer, nn.Linear):
            nn.init.xavier_normal_(layer.weight)


# ``model.init`` → how the blocks' linear weights are (re-)initialised after the kinds built them.
INITIALISERS: dict[str, Callable[[nn.Module], None]] = {
    "default": lambda module: None,
    "xavier_normal": xavier_normal_linears,
}


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)

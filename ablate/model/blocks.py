"""The transformer's parts, ready-made modules in, no configuration inside: norm placements,
:class:`Block`, :class:`Backbone`, and the weight initialisers. :mod:`ablate.model.build` assembles them
from a resolved variant.

A block is ``connection(norm → attention)`` then ``connection(norm → ffn)`` with the norm
placed before the branch (``pre``) or after the join (``post``). Each block receives its
modules ready-made; nothing inside a block branches on configuration.

The closed vocabularies of ``model.norm.placement`` (:data:`PLACEMENTS`) and ``model.init``
(:data:`INITIALISERS`) are defined here, where they are used; the study-file schema validates
against their keys.

:func:`assemble` is the one description of which modules a backbone holds and how often: the
model is built from it (:mod:`ablate.model.build`) and its size counted from it (:mod:`ablate.study.sizes`).

Dimensions: ``b`` batch, ``n`` tokens, ``d`` width, ``s`` residual streams.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import ClassVar, NamedTuple

import torch
from torch import Tensor, nn

from ablate.components import Dropout, TokenContext, total_auxiliary_loss
from ablate.jagged import last_of_rows
from ablate.schema import Vocabulary


class Placed(nn.Module):
    """A sub-layer placed in the residual stream: ``forward(streams, branch) -> streams`` joins
    ``branch`` (attention or FFN, ``[.., d] → [.., d]``) through ``connection``, with ``norm``
    where the placement puts it.

    ``gives_source``: the branch is also called with ``source=`` the un-normalised stream, for
    the attention's keys and values (the attention kind must take one, ``Attention.takes_source``)."""

    gives_source: ClassVar[bool] = False

    def __init__(self, norm: nn.Module, connection: nn.Module):
        super().__init__()
        self.norm, self.connection = norm, connection


class PreNorm(Placed):
    """``streams ← connection(streams, branch ∘ norm)``."""

    def forward(self, streams: Tensor, branch: Callable[[Tensor], Tensor]) -> Tensor:
        return self.connection(streams, lambda h: branch(self.norm(h)))


class PostNorm(Placed):
    """``streams ← norm(connection(streams, branch))`` (original Transformer / SASRec paper)."""

    def forward(self, streams: Tensor, branch: Callable[[Tensor], Tensor]) -> Tensor:
        return self.norm(self.connection(streams, branch))


class PreNormSkip(Placed):
    """``streams ← connection(norm(streams), branch)``: the skip path carries the normalised
    stream too, ``x ← LN(x) + f(LN(x))`` — what SASRec's released code does (its paper writes
    ``x + f(LN(x))``). Up to the first norm this is post-norm: ``LN`` closes each join."""

    def forward(self, streams: Tensor, branch: Callable[[Tensor], Tensor]) -> Tensor:
        return self.connection(self.norm(streams), branch)


class PreNormSkipSource(Placed):
    """As :class:`PreNormSkip`, and the branch also receives the un-normalised stream as the
    attention's key / value source: ``x ← LN(x) + Attn(q = LN(x), k = v = x)`` — SASRec's
    released code (``Q = LN(seqs); mha(Q, seqs, seqs)``). Single-stream connections only: the
    branch input must be the connection's own input for ``x`` to be its un-normalised form."""

    gives_source = True

    def forward(self, streams: Tensor, branch: Callable[..., Tensor]) -> Tensor:
        return self.connection(self.norm(streams), lambda h: branch(h, source=streams))


class Placement(NamedTuple):
    """What one ``model.norm.placement`` places: the attention sub-layer and the FFN sub-layer."""

    mix: type[Placed]
    feed: type[Placed]


# ``model.norm.placement`` → how each block's two sub-layers are placed.
PLACEMENTS: Vocabulary[Placement] = Vocabulary(
    "norm placement",
    {
        "pre": Placement(PreNorm, PreNorm),
        "post": Placement(PostNorm, PostNorm),
        "pre_skip": Placement(PreNormSkip, PreNormSkip),
        "pre_skip_kv": Placement(PreNormSkipSource, PreNormSkip),
    },
)


def with_bias(tokens: TokenContext, channels: nn.ModuleList) -> TokenContext:
    """A copy of ``tokens`` with the bias channels' logit biases added to its ``logit_bias`` and
    their rotations after its own (``tokens`` itself is left as it is)."""
    tokens = replace(tokens, rotations=list(tokens.rotations))
    logit_biases = []
    for channel in channels:
        bias = channel.logits(tokens)
        if bias is not None:
            logit_biases.append(bias)
        if channel.rotates:
            tokens.rotations.append(channel.rotate)
    if logit_biases:
        summed = torch.stack(torch.broadcast_tensors(*logit_biases)).sum(0)
        tokens.logit_bias = summed if tokens.logit_bias is None else tokens.logit_bias + summed
    return tokens


class Block(nn.Module):
    """One transformer block, ``streams ← feed(mix(streams, attention), ffn)``, from four sub-modules:

    * ``attention``: the token mixer (an ``Attention`` kind), padded ``[b, n, d] → [b, n, d]``;
    * ``ffn``: the position-wise map (a ``FeedForward`` kind), ``[.., d] → [.., d]``;
    * ``mix``: the placed attention sub-layer (norm + connection, a :class:`Placed`), which
      takes the streams ``[b, n, (s,) d]`` (or jagged ``[t, (s,) d]``) and the attention as
      its branch and returns the streams in the same shape;
    * ``feed``: the placed FFN sub-layer, the same for the FFN;
    * ``bias``: bias channels of this block's own (``BiasChannel.one_per_block``, e.g. HSTU's
      relative position / time tables, one per layer), whose logit biases and rotations its
      attention sees on top of the backbone's shared ones.
    """

    def __init__(
        self,
        attention: nn.Module,
        ffn: nn.Module,
        mix: nn.Module,
        feed: nn.Module,
        bias: list[nn.Module] | None = None,
    ):
        super().__init__()
        self.attention, self.ffn = attention, ffn
        self.mix, self.feed = mix, feed
        self.bias = nn.ModuleList(bias or [])

    def forward(self, streams: Tensor, tokens: TokenContext) -> Tensor:
        """``streams`` in ``tokens.layout`` (``[b, n, (s,) d]`` or jagged ``[t, (s,) d]``); the
        attention sees padded blocks, the FFN whatever the layout holds."""
        tokens = with_bias(tokens, self.bias) if self.bias else tokens
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
        tokens = with_bias(tokens, self.bias) if self.bias else tokens
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
    """Embedded tokens ``[b, n, d]`` → bias channels → blocks → final norm ``[b, n, d]`` (an
    ``nn.Identity`` where the model has none: HSTU and FuXi-α only L2-normalise the output).

    Between the bias channels and the output the stream is held in ``tokens.layout``: with a
    jagged layout, FFNs, norms and joins only touch the real tokens."""

    def __init__(
        self,
        bias: list[nn.Module],
        stem: nn.Module,
        blocks: list[Block],
        final_norm: nn.Module,
        dropout: float,
    ):
        super().__init__()
        self.bias = nn.ModuleList(bias)
        self.stem = stem  # the connection kind's expand / reduce
        self.blocks = nn.ModuleList(blocks)
        self.final_norm = final_norm
        self.dropout = Dropout(dropout)

    def forward(self, x: Tensor, tokens: TokenContext, last_only: bool = False) -> Tensor:
        """``[b, n, d]``, or with ``last_only`` ``[b, d]`` at each row's last real token (right-
        padded rows: next-item ranking, a readout token placed last), the final block computing
        only those."""
        for channel in self.bias:
            x = channel.embed(x, tokens)
        # The caller's context stays untouched: bias channels fill in a per-forward copy, whose
        # memo starts empty (what the blocks share within this forward only).
        tokens = replace(with_bias(tokens, self.bias), memo={})
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
        """Sum of every component's auxiliary loss (e.g. MoE load balancing), or None."""
        return total_auxiliary_loss(self)


def keep_initialisation(module: nn.Module) -> None:
    """Each kind's own initialisation (PyTorch's for ``nn.Linear``): nothing to redo."""


def xavier_normal_linears(module: nn.Module) -> None:
    """Xavier-normal weights ``N(0, 2 / (fan_in + fan_out))`` for every ``nn.Linear`` inside
    ``module``; biases and other parameters keep their kind's initialisation."""
    for layer in module.modules():
        if isinstance(layer, nn.Linear):
            nn.init.xavier_normal_(layer.weight)


def xavier_uniform_zero_biases(module: nn.Module) -> None:
    """TensorFlow's defaults, which TiSASRec's code keeps: Xavier-uniform for every ``nn.Linear``
    weight and every other parameter of two or more dimensions inside ``module`` (the tables a kind
    holds, e.g. ``time_interval``'s), zero ``nn.Linear`` biases; norms keep theirs."""
    for layer in module.modules():
        if isinstance(layer, nn.Linear):
            nn.init.xavier_uniform_(layer.weight)
            if layer.bias is not None:
                nn.init.zeros_(layer.bias)
    linear = {id(p) for layer in module.modules() if isinstance(layer, nn.Linear) for p in layer.parameters()}
    for parameter in module.parameters():
        if parameter.dim() >= 2 and id(parameter) not in linear:
            nn.init.xavier_uniform_(parameter)


# ``model.init`` → how the blocks' linear weights are (re-)initialised after the kinds built them.
INITIALISERS: Vocabulary[Callable[[nn.Module], None]] = Vocabulary(
    "initialiser",
    {
        "default": keep_initialisation,
        "xavier_normal": xavier_normal_linears,
        "xavier_uniform": xavier_uniform_zero_biases,
    },
)

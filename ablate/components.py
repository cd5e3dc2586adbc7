"""The small interface the core exposes to component plugins.

Dimensions used throughout: ``b`` batch, ``n`` tokens, ``h`` heads, ``d`` model width,
``e`` head width, ``s`` residual streams.

A plugin kind is a ``torch.nn.Module`` subclass of one of the slot bases below, with a
pydantic ``Options`` model (every field defaulted where a default makes sense). The
builder constructs it as ``Kind(options, ctx)`` where ``ctx`` is a :class:`BuildContext`.
Kinds never look at each other's configuration: the block hands them what they need.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from pydantic import ConfigDict
from torch import Tensor, nn

from ablate.jagged import Jagged, Padded, last_of_rows

# Dropout and its draws live with the kernels that apply them; re-exported: the components' vocabulary.
from ablate.kernels.draws import (  # noqa: F401
    Dropout,
    dropout,
    dropout_generator,
    dropout_key,
    dropout_keys,
    keep_lanes,
    keep_mask,
    key_source,
    lanes_dropout,
    thread_dropout_generator,
)
from ablate.kernels.lanes import keep_threshold  # noqa: F401 - re-exported, as above
from ablate.schema import Strict

__all__ = [
    "default",
    "dropout",
    "Dropout",
    "Options",
    "BuildContext",
    "TokenContext",
    "Component",
    "Attention",
    "FeedForward",
    "Norm",
    "Connection",
    "Stem",
    "BiasChannel",
    "total_auxiliary_loss",
    "values_readable",
]


def default(value, fallback):
    """``value`` unless it is None (e.g. a kind's own dropout, else the model's)."""
    return fallback if value is None else value


# Whether a tensor is one of a functorch transform's (vmap, grad): no public form in torch 2.13; a
# torch without it never stacks members (ablate.training.stacked), so "no" is right there.
_is_wrapped = getattr(torch._C._functorch, "is_functorch_wrapped_tensor", lambda t: False)


def values_readable(x: Tensor) -> bool:
    """Whether a component may read ``x``'s values in Python (a range check, a shortcut taken when
    every row is alike): not under ``vmap``, where a pack's members are stacked
    (:mod:`ablate.training.stacked`), nor while ``torch.compile`` traces the forward
    (``train.compile``: a read would split its graph); there the general path must run."""
    return not (torch.compiler.is_compiling() or _is_wrapped(x))


def padded() -> Padded:
    """A fresh :class:`~ablate.jagged.Padded` layout, :class:`TokenContext`'s default: a function,
    as dynamo does not trace a class called as a dataclass's default factory (``train.compile``)."""
    return Padded()


class Options(Strict):
    """Base for every kind's options: unknown keys are errors, values are validated (no bool for a number)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass(frozen=True)
class BuildContext:
    """What a component may know about the model it is built into."""

    dim: int
    dropout: float = 0.0
    max_len: int = 512
    # Tokens have an order and are used causally (sequences), or form an unordered set
    # (channels, tabular features).
    ordered: bool = True
    # Side information the task's data provides, e.g. {"timestamps"}.
    features: frozenset[str] = frozenset()
    # Width w of the raw per-token values (TokenContext.values [b, n, w]); 0 when there are none.
    values_width: int = 0
    # Index of the sub-layer being built (attention of block i is 2i, its FFN 2i+1), for kinds
    # whose initialisation depends on depth (hyper-connections read stream l mod s).
    layer: int = 0
    # One dict per backbone built (:func:`ablate.model.blocks.assemble`): parameters that the blocks'
    # modules of one kind share (TiSASRec's interval tables, one set for every block).
    shared: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)


@dataclass
class TokenContext:
    """Per-forward information shared by every block: masks, positions, bias channels.

    ``valid`` is ``[b, n]`` bool, True at real tokens. Sequences are right-padded, so under
    causal use a real query never sees a padded key.

    ``timestamps`` are float64 seconds relative to the first token of each row (float32 would
    round gaps between epoch-second times; the time kinds' buckets need them exact); only
    differences are meaningful.
    Padded positions repeat the last real time.

    ``layout`` says how the blocks hold the residual stream between attentions: padded
    ``[b, n, d]`` (:class:`~ablate.jagged.Padded`) or the real tokens only ``[t, d]``
    (:class:`~ablate.jagged.Jagged`, for right-padded causal rows). Attention kinds always
    receive and return padded ``[b, n, d]``; everything else here stays ``[b, n]``-shaped.
    """

    valid: Tensor
    causal: bool
    positions: Tensor  # [b, n] long: index within the sequence; in a set, the column (readout: 0)
    timestamps: Tensor | None = None  # [b, n] float64 seconds (see above), where the data has them
    # [b, n] float64 seconds, same origin: the time of the interaction each query's prediction is
    # for (its next token's; HSTU's and FuXi-α's request time), where the task provides it.
    request_times: Tensor | None = None
    # [b, n, w] raw per-token inputs before embedding (e.g. a channel's lookback window), for
    # kinds that build data-dependent masks (feature "values").
    values: Tensor | None = None
    # [b, n] bool, True at readout/[CLS] tokens (feature "readout"): graph kinds add no edges into them.
    readout: Tensor | None = None
    logit_bias: Tensor | None = None  # [b|1, h|1, n, n] additive attention-logit bias
    rotations: list[Callable[[Tensor, Tensor, TokenContext], tuple[Tensor, Tensor]]] = field(
        default_factory=list
    )
    layout: Padded | Jagged = field(default_factory=padded)
    # Values computed once per forward and read by every block (a shared table's dropped lookups);
    # each backbone forward starts it empty.
    memo: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.valid.shape)  # type: ignore[return-value]

    @property
    def lengths(self) -> Tensor:
        """``[b]`` real tokens per row, at least 1."""
        return self.valid.sum(1).clamp(min=1)

    def rotate(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """Apply rotary-style bias channels to ``q, k`` of shape ``[b, h, n, e]``."""
        for rotation in self.rotations:
            q, k = rotation(q, k, self)
        return q, k

    def key_mask(self) -> Tensor:
        """``[b, 1, n, n]`` bool: may query i attend to key j.

        A query may always attend to itself, so padded rows never become all-masked
        (their outputs are ignored, but NaNs would poison gradients).
        """
        b, n = self.valid.shape
        allowed = self.valid[:, None, None, :].expand(b, 1, n, n)
        if self.causal:
            allowed = allowed & torch.ones(n, n, dtype=torch.bool, device=self.valid.device).tril()
        return allowed | torch.eye(n, dtype=torch.bool, device=self.valid.device)

    def attention_mask(self, dtype: torch.dtype) -> tuple[Tensor | None, bool]:
        """Arguments ``(attn_mask, is_causal)`` for ``scaled_dot_product_attention``.

        Causal right-padded batches with no logit bias take the fused causal path with no
        explicit mask: every real query's keys are real.
        """
        if self.logit_bias is None and self.causal:
            return None, True
        allowed = self.key_mask()
        mask = torch.zeros(allowed.shape, dtype=dtype, device=self.valid.device).masked_fill(
            ~allowed, float("-inf")
        )
        if self.logit_bias is not None:
            mask = mask + self.logit_bias.to(dtype)
        return mask, False


class Component(nn.Module):
    """Base of every kind. Subclasses set ``Options`` and may declare requirements.

    Hooks a kind may override; the core calls them on every ``Component`` inside a model (nested
    ones too) and on no other module:

    * ``auxiliary_loss()``: a term the latest training forward adds to the loss (e.g. MoE load
      balancing), or None. Training adds the sum over the model (:func:`total_auxiliary_loss`)
      to each loss part once; a task's loss leaves it out.
    * ``epoch_end(epoch)``: called after each training epoch (1-based), before validation, by
      :meth:`ablate.tasks.Task.on_epoch_end` (e.g. ``fr_graph`` freezing its topology).
    * ``stage_end(stage)``: called when training stage ``stage`` (1-based) has early-stopped and
      the next begins (``train.second_stage``), after the weights it starts from are loaded
      (e.g. ``fr_graph`` freezing its topology: T2G-Former's second stage).

    ``version`` is part of every trial's fingerprint (:func:`ablate.drive.ledger.fingerprint`).
    Bump it when the same options start to train differently (a changed computation,
    initialisation or order of random draws), so that stores and trial files made before stop
    counting as this kind's results. A new option or a changed default needs no bump (a
    fingerprint holds every option's value, defaults filled in), except a kind's first changed
    default while it is at version 1: stores made before fingerprints were resolved, accepted
    until then (:func:`ablate.drive.ledger.fingerprints`), hold only the options written.
    """

    Options: ClassVar[type[Options]] = Options
    # Data features the kind needs (checked before training, with a message naming both sides).
    requires: ClassVar[frozenset[str]] = frozenset()
    # True for kinds that only make sense on ordered tokens (positions, time).
    ordered_only: ClassVar[bool] = False
    # True for kinds defined on unordered token sets (no causal use: graphs over features/channels).
    unordered_only: ClassVar[bool] = False
    # The option that sets this kind's width (e.g. an FFN's hidden size), which
    # ``match_params`` scales to equalise parameter counts; None: the kind has none.
    width_option: ClassVar[str | None] = None
    # The version of this kind's numbers: bumped when they change (see above).
    version: ClassVar[int] = 1

    def __init__(self, options: Options, ctx: BuildContext):
        super().__init__()
        self.options = options
        self.ctx = ctx

    @classmethod
    def requirements(cls, options: Options) -> frozenset[str]:
        """Data features these options need; override when they depend on the options
        (e.g. an attention whose temporal channel can be switched off)."""
        return cls.requires

    def auxiliary_loss(self) -> Tensor | None:
        """A loss term this module adds to training (e.g. MoE load balancing); None if none."""
        return None

    def epoch_end(self, epoch: int) -> None:
        """Called after training epoch ``epoch`` (1-based), before validation."""

    def stage_end(self, stage: int) -> None:
        """Called when training stage ``stage`` (1-based) has ended and the next begins."""

    @classmethod
    def describe(cls, options: Options) -> str:
        """Short human label, e.g. ``softmax(heads=2)``: the options that differ from defaults."""
        fields = cls.Options.model_fields
        changed = {
            k: v
            for k, v in options.model_dump().items()
            if fields[k].is_required() or fields[k].get_default(call_default_factory=True) != v
        }
        args = ",".join(f"{k}={v}" for k, v in changed.items())
        return f"{cls.kind_name()}({args})" if args else cls.kind_name()

    @classmethod
    def kind_name(cls) -> str:
        """The entry-point name the registry found this class under."""
        return getattr(cls, "_kind", cls.__name__)


class Attention(Component):
    """Token mixer: ``forward(x [b, n, d], tokens: TokenContext) -> [b, n, d]``.

    A kind with ``takes_source`` also accepts ``forward(x, tokens, source=s)`` and
    ``last_query(x, tokens, source=s)``: queries from ``x``, keys and values from ``s``
    (``[b, n, d]``, same tokens) — for placements that attend over the un-normalised stream."""

    takes_source: ClassVar[bool] = False
    # False for a kind whose output at a token never depends on the other tokens (no mixing).
    mixes_tokens: ClassVar[bool] = True

    def forward(self, x: Tensor, tokens: TokenContext) -> Tensor:  # pragma: no cover - interface
        raise NotImplementedError

    def last_query(self, x: Tensor, tokens: TokenContext) -> Tensor:
        """``[b, d]``: the output at each row's last real token only (right-padded rows; what
        next-item ranking needs from the final block, or a tabular readout token placed last).
        A kind may compute just that query; this default computes every query and keeps the last."""
        return last_of_rows(self.forward(x, tokens), tokens.lengths)


class FeedForward(Component):
    """Position-wise map: ``forward(x [b, n, d], valid [b, n] | None) -> [b, n, d]``.

    ``valid`` marks real tokens; outputs must not depend on it, but statistics a kind keeps
    (e.g. MoE expert load) should count real tokens only."""

    def forward(self, x: Tensor, valid: Tensor | None = None) -> Tensor:  # pragma: no cover - interface
        raise NotImplementedError


class Norm(Component):
    """Normalisation over the last dimension: ``forward(x [..., d]) -> [..., d]``."""

    def forward(self, x: Tensor) -> Tensor:  # pragma: no cover - interface
        raise NotImplementedError


class Connection(Component):
    """How a sub-layer's output joins the residual stream(s).

    ``expand`` turns the embedding ``[b, n, d]`` into the stream layout the kind keeps
    (identity for a plain residual, ``[b, n, s, d]`` for hyper-connections) and ``reduce``
    turns it back before the final norm. ``forward(streams, branch)`` applies one sub-layer:
    ``branch`` maps a ``[b, n, d]`` input to a ``[b, n, d]`` output. One instance is built
    per sub-layer; the backbone's expand/reduce come from ``Kind.stem(options, ctx)``, so
    a sub-layer instance never carries unused stem parameters (and vice versa).

    A kind that keeps several streams declares ``single_stream = False``: placements that need
    the branch input to be the stream itself (``pre_skip_kv``) refuse it.
    """

    single_stream: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # Kinds written before the flag existed said "several streams" by having a stem of their
        # own; read that once, when the class is made, so they keep being refused where they were.
        if "stem" in cls.__dict__ and "single_stream" not in cls.__dict__:
            cls.single_stream = False

    @classmethod
    def stem(cls, options: Options, ctx: BuildContext) -> Stem:
        return Stem()

    def forward(self, streams: Tensor, branch: Callable[[Tensor], Tensor]) -> Tensor:  # pragma: no cover
        raise NotImplementedError


class Stem(nn.Module):
    """Turns the embedding ``[b, n, d]`` into a connection kind's stream layout and back."""

    def expand(self, x: Tensor) -> Tensor:
        return x

    def reduce(self, streams: Tensor) -> Tensor:
        return streams


class BiasChannel(Component):
    """Position / time information. A kind overrides any of three hooks:

    * ``embed(x, tokens)``: act on the token embeddings (absolute positions);
    * ``logits(tokens)``: an additive attention-logit bias ``[b|1, h|1, n, n]``;
    * ``rotate(q, k, tokens)``: rotate queries and keys (rotary embeddings); a kind that does
      declares ``rotates = True``, and only those are handed to the attention.
    """

    rotates: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # Kinds written before the flag existed only override ``rotate``: read that once, when the
        # class is made, so their rotation is still applied.
        if "rotate" in cls.__dict__ and "rotates" not in cls.__dict__:
            cls.rotates = True

    def embed(self, x: Tensor, tokens: TokenContext) -> Tensor:
        return x

    def logits(self, tokens: TokenContext) -> Tensor | None:
        return None

    def rotate(self, q: Tensor, k: Tensor, tokens: TokenContext) -> tuple[Tensor, Tensor]:
        return q, k

    @classmethod
    def one_per_block(cls, options: Options) -> bool:
        """True: each block gets an instance of its own (built with that block's ``ctx.layer``),
        whose ``logits`` and ``rotate`` act on that block's attention only and whose ``embed`` is
        never called; False (the default): one instance, acting on the embeddings and every block."""
        return False


def has_auxiliary_losses(model: nn.Module) -> bool:
    """Whether a :class:`Component` inside ``model`` has its own ``auxiliary_loss`` (which holds
    the latest forward's term in the module between that forward and its backward)."""
    return any(
        isinstance(m, Component) and type(m).auxiliary_loss is not Component.auxiliary_loss
        for m in model.modules()
    )


def end_stage(model: nn.Module, stage: int) -> None:
    """Every :class:`Component` inside ``model`` gets its ``stage_end(stage)``, in module order."""
    for module in model.modules():
        if isinstance(module, Component):
            module.stage_end(stage)


def total_auxiliary_loss(model: nn.Module) -> Tensor | None:
    """The sum of the auxiliary losses of the :class:`Component` modules inside ``model`` (in
    module order), or None when none has one. Other modules are not asked."""
    terms = [
        t for m in model.modules() if isinstance(m, Component) for t in [m.auxiliary_loss()] if t is not None
    ]
    return torch.stack(terms).sum() if terms else None

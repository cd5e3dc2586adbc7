"""Conformance checks for a component kind, for its author's own tests (and ours, over every kind
installed: tests/test_testkit.py).

    from ablate import testkit

    @pytest.mark.parametrize("check", testkit.CHECKS)
    def test_my_kind(check):
        testkit.check(MyAttention, check)          # AssertionError naming the kind and the check

Each check builds the kind as the builder does, ``Kind(options, BuildContext(...))`` at tiny sizes
(``b`` = 2 rows of ``n`` = 6 tokens of width ``d`` = 8, the second row right-padded by 2), and
calls it as its slot's caller does (:func:`outputs`):

* ``shapes`` — the output has the input's shape and dtype (an attention's ``last_query`` is its
  ``forward`` at each row's last real token).
* ``gradients`` — a loss on the valid outputs (plus the kind's auxiliary loss) gives every
  parameter a finite gradient, not None.
* ``determinism`` — built and run twice under the same seed: the same weights, the same outputs
  (in training mode, dropout included).
* ``causality`` — where the slot claims it (position-wise slots always; attention and bias kinds
  unless ``unordered_only``): changing the tokens after position ``t`` (inputs and timestamps)
  changes no output at or before ``t``.
* ``padding`` — changing padded tokens' inputs (and raw values) changes no valid output, and a
  row computed alone, unpadded, gives the outputs it gets in the padded batch.

A slot's caller: an attention is ``kind(x, tokens)``, an FFN ``kind(x, tokens.valid)``, a norm
``kind(x)``, a connection ``stem.reduce(kind(stem.expand(x), branch))`` with a fixed position-wise
branch, a bias channel its ``embed`` plus a probe softmax attention that sees its logit bias and
rotations (:func:`ablate.model.blocks.with_bias`, as a block applies them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ablate.components import (
    Attention,
    BiasChannel,
    BuildContext,
    Component,
    Connection,
    FeedForward,
    Norm,
    Options,
    TokenContext,
    total_auxiliary_loss,
)
from ablate.model.blocks import with_bias

B, N, D, W = 2, 6, 8, 6  # rows, tokens, width, raw values per token
PADDED = 2  # padded tokens at the end of the second row
SEED = 0
ATOL = 1e-5
POSITION_WISE = frozenset({"ffn", "norm", "connection"})  # slots whose output at a token is its own
# Defaults too large for d = 8 and n = 6 tokens, where a kind has the option.
SMALL = {"heads": 2, "streams": 2, "experts": 3, "top_k": 2, "hidden": 8, "buckets": 16}


def slot_of(cls: type) -> str:
    for slot, filled in SLOTS.items():
        if isinstance(cls, type) and issubclass(cls, filled.base):
            return slot
    raise TypeError(f"{cls!r} subclasses none of {', '.join(f.base.__name__ for f in SLOTS.values())}")


def small_options(cls: type[Component], given: Options | dict | None = None) -> Options:
    """``given`` (options or a mapping), else the kind's defaults with :data:`SMALL` sizes where
    the kind has such an option."""
    if isinstance(given, Options):
        return given
    fields = cls.Options.model_fields
    return cls.Options(**{**{k: v for k, v in SMALL.items() if k in fields}, **(given or {})})


def ordered_for(cls: type[Component]) -> bool:
    return not cls.unordered_only


def context(cls: type[Component], options: Options) -> BuildContext:
    """What the builder would hand the kind: ordered tokens with timestamps (or an unordered set
    with raw values and a readout token), and whatever data features it requires."""
    ordered = ordered_for(cls)
    features = frozenset({"timestamps"} if ordered else {"values", "readout"})
    return BuildContext(
        dim=D,
        dropout=0.0,
        max_len=N,
        ordered=ordered,
        features=features | cls.requirements(options),
        values_width=W,
    )


def tokens_for(ordered: bool, lengths: list[int], generator: torch.Generator) -> TokenContext:
    """Right-padded rows of ``lengths`` real tokens; timestamps rising (padded ones repeat the last
    real time), raw values, and in a set a readout token at position 0."""
    n = max(lengths)
    valid = torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]
    times = torch.cumsum(torch.rand(len(lengths), n, generator=generator, dtype=torch.float64) * 1e5, 1)
    times = times - times[:, :1]
    last = (torch.tensor(lengths) - 1)[:, None]
    times = torch.where(valid, times, times.gather(1, last))
    readout = torch.zeros(len(lengths), n, dtype=torch.bool)
    readout[:, 0] = True
    return TokenContext(
        valid=valid,
        causal=ordered,
        positions=torch.arange(n).expand(len(lengths), n),
        timestamps=times,
        values=torch.randn(len(lengths), n, W, generator=generator),
        readout=None if ordered else readout,
    )


class _Probe(nn.Module):
    """A fixed softmax attention (no parameters) that takes a bias channel's logit bias and rotations."""

    def __init__(self, heads: int, generator: torch.Generator):
        super().__init__()
        self.heads = heads
        self.register_buffer("qkv", torch.randn(D, 3 * D, generator=generator) / D**0.5)

    def forward(self, x: Tensor, tokens: TokenContext) -> Tensor:
        b, n, _ = x.shape
        q, k, v = (x @ self.qkv).view(b, n, 3, self.heads, D // self.heads).permute(2, 0, 3, 1, 4)
        q, k = tokens.rotate(q, k)
        mask, causal = tokens.attention_mask(q.dtype)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
        return out.transpose(1, 2).reshape(b, n, D)


class Harness(nn.Module):
    """A kind, built, with what its slot's caller gives it: ``harness(x, tokens) -> [b, n, d]``."""

    def __init__(self, cls: type[Component], options: Options | dict | None = None):
        super().__init__()
        self.cls, self.slot = cls, slot_of(cls)
        self.options = small_options(cls, options)
        self.ctx = context(cls, self.options)
        self.kind = cls(self.options, self.ctx)
        self.caller = SLOTS[self.slot].caller(self)

    def forward(self, x: Tensor, tokens: TokenContext) -> Tensor:
        return self.caller(self.kind, x, tokens)


class _Attend(nn.Module):
    def __init__(self, harness: Harness):
        super().__init__()

    def forward(self, kind: Attention, x: Tensor, tokens: TokenContext) -> Tensor:
        return kind(x, tokens)


class _Feed(_Attend):
    def forward(self, kind: FeedForward, x: Tensor, tokens: TokenContext) -> Tensor:
        return kind(x, tokens.valid)


class _Normalise(_Attend):
    def forward(self, kind: Norm, x: Tensor, tokens: TokenContext) -> Tensor:
        return kind(x)


class _Join(nn.Module):
    """The connection's stem around it, and a fixed position-wise branch (no parameters)."""

    def __init__(self, harness: Harness):
        super().__init__()
        self.stem = harness.cls.stem(harness.options, harness.ctx)
        fixed = torch.Generator().manual_seed(SEED + 1)
        self.register_buffer("branch", torch.randn(D, D, generator=fixed) / D**0.5)

    def forward(self, kind: Connection, x: Tensor, tokens: TokenContext) -> Tensor:
        return self.stem.reduce(kind(self.stem.expand(x), lambda h: torch.tanh(h @ self.branch)))


class _Bias(nn.Module):
    """The channel's ``embed``, plus the probe attention under its logit bias and rotations."""

    def __init__(self, harness: Harness):
        super().__init__()
        fixed = torch.Generator().manual_seed(SEED + 1)
        self.probe = _Probe(getattr(harness.options, "heads", 2), fixed)

    def forward(self, kind: BiasChannel, x: Tensor, tokens: TokenContext) -> Tensor:
        return kind.embed(x, tokens) + self.probe(x, with_bias(tokens, nn.ModuleList([kind])))


@dataclass(frozen=True)
class Slot:
    base: type[Component]  # the class a kind of the slot subclasses
    caller: type[nn.Module]  # calls the kind as the block does: (kind, x, tokens) -> [b, n, d]


SLOTS = {
    "attention": Slot(Attention, _Attend),
    "ffn": Slot(FeedForward, _Feed),
    "norm": Slot(Norm, _Normalise),
    "connection": Slot(Connection, _Join),
    "bias": Slot(BiasChannel, _Bias),
}


def build(cls: type[Component], options: Options | dict | None = None, seed: int = SEED) -> Harness:
    torch.manual_seed(seed)
    return Harness(cls, options)


def outputs(harness: Harness, x: Tensor, tokens: TokenContext, seed: int = SEED) -> Tensor:
    """The harness's output, the random draws inside it (dropout, sampling) seeded with ``seed``."""
    torch.manual_seed(seed)
    return harness(x, tokens)


def _inputs(ordered: bool, lengths: list[int] | None = None) -> tuple[Tensor, TokenContext, torch.Generator]:
    generator = torch.Generator().manual_seed(SEED + 2)
    lengths = lengths or [N, N - PADDED]
    tokens = tokens_for(ordered, lengths, generator)
    return torch.randn(len(lengths), max(lengths), D, generator=generator), tokens, generator


def _fail(harness: Harness, check: str, what: str) -> AssertionError:
    return AssertionError(f"{harness.slot} kind {harness.cls.kind_name()} fails '{check}': {what}")


def _close(a: Tensor, b: Tensor) -> bool:
    return a.shape == b.shape and torch.allclose(a, b, atol=ATOL, rtol=ATOL)


def check_shapes(cls: type[Component], options: Options | dict | None = None) -> None:
    harness = build(cls, options).eval()
    x, tokens, _ = _inputs(harness.ctx.ordered)
    with torch.no_grad():
        out = outputs(harness, x, tokens)
        if out.shape != x.shape or out.dtype != x.dtype:
            raise _fail(
                harness,
                "shapes",
                f"output {tuple(out.shape)} {out.dtype}, input {tuple(x.shape)} {x.dtype}",
            )
        if harness.slot == "attention":
            torch.manual_seed(SEED)
            last = harness.kind.last_query(x, tokens)
            expected = out[torch.arange(B), tokens.lengths - 1]
            if not _close(last, expected):
                raise _fail(harness, "shapes", "last_query is not forward at each row's last real token")


def check_gradients(cls: type[Component], options: Options | dict | None = None) -> None:
    harness = build(cls, options).train()
    x, tokens, generator = _inputs(harness.ctx.ordered)
    out = outputs(harness, x.requires_grad_(), tokens)
    weights = torch.randn(out.shape, generator=generator)
    loss = (out * weights)[tokens.valid].sum()
    auxiliary = total_auxiliary_loss(harness)
    loss = loss if auxiliary is None else loss + auxiliary
    if loss.requires_grad:  # else nothing to train (a kind that outputs zeros): no parameter to reach
        loss.backward()
    for name, p in harness.named_parameters():
        if not p.requires_grad:
            continue
        if p.grad is None:
            raise _fail(harness, "gradients", f"no gradient reaches parameter {name}")
        if not torch.isfinite(p.grad).all():
            raise _fail(harness, "gradients", f"parameter {name} has a gradient that is not finite")


def check_determinism(cls: type[Component], options: Options | dict | None = None) -> None:
    first, second = build(cls, options).train(), build(cls, options).train()
    for (name, a), b in zip(first.state_dict().items(), second.state_dict().values(), strict=True):
        if not torch.equal(a, b):
            raise _fail(first, "determinism", f"built twice under seed {SEED}, {name} differs")
    x, tokens, _ = _inputs(first.ctx.ordered)
    if not torch.equal(outputs(first, x, tokens), outputs(second, x, tokens)):
        raise _fail(first, "determinism", f"run twice under seed {SEED}, the outputs differ")


def claims_causal(cls: type[Component]) -> bool:
    """Whether a kind's output at a token may depend only on that token and the ones before it."""
    return slot_of(cls) in POSITION_WISE or ordered_for(cls)


def check_causality(cls: type[Component], options: Options | dict | None = None) -> None:
    if not claims_causal(cls):
        return
    harness = build(cls, options).eval()
    x, tokens, generator = _inputs(True)
    tokens = replace(tokens, valid=torch.ones_like(tokens.valid))  # every token real
    with torch.no_grad():
        base = outputs(harness, x, tokens)
        for t in range(N - 1):
            later = torch.arange(N) > t
            changed = torch.where(later[None, :, None], torch.randn(x.shape, generator=generator), x)
            gaps = torch.rand(B, N, generator=generator, dtype=torch.float64) * 1e5 * later
            times = tokens.timestamps + torch.cumsum(gaps, 1)
            out = outputs(harness, changed, replace(tokens, timestamps=times))
            if not _close(out[:, : t + 1], base[:, : t + 1]):
                raise _fail(harness, "causality", f"tokens after position {t} changed outputs up to it")


def check_padding(cls: type[Component], options: Options | dict | None = None) -> None:
    harness = build(cls, options).eval()
    ordered = harness.ctx.ordered
    x, tokens, generator = _inputs(ordered)
    valid = tokens.valid
    with torch.no_grad():
        base = outputs(harness, x, tokens)
        padded = ~valid[..., None]
        changed = torch.where(padded, torch.randn(x.shape, generator=generator) * 10, x)
        values = torch.where(padded, torch.randn(tokens.values.shape, generator=generator), tokens.values)
        out = outputs(harness, changed, replace(tokens, values=values))
        if not _close(out[valid], base[valid]):
            raise _fail(harness, "padding", "changing padded tokens changed valid outputs")
        length = N - PADDED
        alone = _row(tokens, 1, length)
        out = outputs(harness, x[1:, :length], alone)
        if not _close(out[0], base[1, :length]):
            raise _fail(harness, "padding", "a padded row's valid outputs differ from the row computed alone")


def _row(tokens: TokenContext, row: int, length: int) -> TokenContext:
    """Row ``row`` of ``tokens``, its first ``length`` tokens only."""

    def cut(t: Tensor | None) -> Tensor | None:
        return None if t is None else t[row : row + 1, :length]

    return replace(
        tokens,
        valid=cut(tokens.valid),
        positions=cut(tokens.positions),
        timestamps=cut(tokens.timestamps),
        values=cut(tokens.values),
        readout=cut(tokens.readout),
    )


CHECKS: dict[str, Callable[[type[Component], Options | dict | None], None]] = {
    "shapes": check_shapes,
    "gradients": check_gradients,
    "determinism": check_determinism,
    "causality": check_causality,
    "padding": check_padding,
}


def check(cls: type[Component], name: str, options: Options | dict | None = None) -> None:
    """Run one of :data:`CHECKS` on a kind (built with ``options``: a mapping or the kind's
    ``Options``; default its defaults at small sizes); an ``AssertionError`` names what failed."""
    if name not in CHECKS:
        raise ValueError(f"unknown check {name!r} (checks: {', '.join(CHECKS)})")
    CHECKS[name](cls, options)


def check_all(cls: type[Component], options: Options | dict | None = None) -> None:
    for name in CHECKS:
        check(cls, name, options)

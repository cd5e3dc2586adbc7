"""Shapes and sizes of a study's models, checked before any training.

Each variant's backbone is built on torch's ``meta`` device (shapes, no memory) by the same
:func:`ablate.model.blocks.assemble` that builds the model, with one block standing for all of them: a
constructor that refuses its settings (``dim`` not divisible by ``heads``) fails while the study
is loaded, naming the key, for the base, every variant, grid point and search value. The same
build counts parameters; with the training batch that gives a rough memory estimate, and a model
past any one machine (``dim: 1e9``, ``blocks: 1e9``) is refused with the estimate in the message.
Once the data are loaded the task's embedding and head and the real sequence length count too.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from ablate.components import BuildContext
from ablate.model.build import assemble
from ablate.registry import COMPONENT_SLOTS

if TYPE_CHECKING:  # pragma: no cover
    from ablate.model.variant import Part, Variant
    from ablate.schema import Locator

BYTES_PER_PARAMETER = 16  # training one fp32 parameter with Adam: weight, gradient, two moments
FLOATS_PER_TOKEN = 16  # values per token and unit of width a block keeps for backward (q, k, v, FFN, norms)
FLOATS_PER_PAIR = 2  # attention scores and weights per pair of tokens in a block
MEMORY_LIMIT = 10**12  # 1 TB: past the memory of any one machine this toolkit trains on
NOMINAL_TOKENS = 64  # tokens per row assumed before the data tell (the real count is checked then)
SMALL_DIM = 64  # the width parameter counts are extrapolated from when the given one cannot be laid out

# Slot → its components and their keys under the model (``("bias", 0)``).
Parts = dict[str, tuple[tuple[tuple, "Part"], ...]]


class _MetaFills(TorchFunctionMode):
    """In-place fills of meta tensors (weight initialisers) do nothing: some have no meta kernel,
    and torch's reference implementations they fall back to import its compiler (1–2 s)."""

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: dict | None = None):
        kwargs = kwargs or {}
        target = args[0] if args else next(iter(kwargs.values()), None)  # nn.init passes tensor=
        name = getattr(func, "__name__", "")
        if name.endswith("_") and not name.endswith("__") and getattr(target, "is_meta", False):
            return target
        return func(*args, **kwargs)


@contextmanager
def on_meta() -> Iterator[None]:
    """Modules built inside have shapes but no storage."""
    with torch.device("meta"), _MetaFills():
        yield


MODEL_KEY = ("model",)  # where a setting a variant leaves to the base model is reported
TASK_KEY = ("task",)


class ShapeProblem(Exception):
    """A component refused its settings: ``key`` is its place under the model (``("attention",)``),
    or in the study file when ``absolute`` (the task's embedding and head: ``("task",)``)."""

    def __init__(self, key: tuple, message: str, absolute: bool = False):
        super().__init__(message)
        self.key, self.message, self.absolute = key, message, absolute


class TooLarge(Exception):
    """A component too large for torch to lay out at all (its element count overflows)."""

    def __init__(self, key: tuple):
        super().__init__(key)
        self.key = key


def built(make: Callable[[], nn.Module], key: tuple) -> nn.Module:
    """``make()`` on the meta device; a constructor's ValueError / AssertionError (or torch's on a
    negative shape) is a :class:`ShapeProblem` at ``key``. A constructor that needs real values
    (``.item()`` of a tensor) cannot be sized here: an empty module stands for it (the forward
    pass before training, :mod:`ablate.training.preflight`, still builds it for real)."""
    try:
        with on_meta():
            return make()
    except (ValueError, AssertionError) as exc:
        raise ShapeProblem(key, str(exc) or f"{type(exc).__name__} while building it") from None
    except (RuntimeError, TypeError, OverflowError) as exc:
        text = str(exc).lower()
        if "overflow" in text:
            raise TooLarge(key) from None
        if "meta" in text:
            return nn.Module()
        raise ShapeProblem(key, f"cannot be built with these settings: {str(exc).splitlines()[0]}") from None


def parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@dataclass(frozen=True)
class Size:
    """A model's parameters and the memory training it takes (weights, gradients, Adam's
    moments, one batch's activations; rough: within a small factor)."""

    parameters: int
    activations: int  # bytes

    @property
    def memory(self) -> int:
        return BYTES_PER_PARAMETER * self.parameters + self.activations

    def fits(self) -> bool:
        return self.memory <= MEMORY_LIMIT

    def describe(self) -> str:
        return f"{amount(self.parameters)} parameters, ≈ {in_bytes(self.memory)}"

    def over(self) -> str:
        return (
            f"≈ {amount(self.parameters)} parameters and ≈ {in_bytes(self.memory)} to train, "
            f"over the limit of {in_bytes(MEMORY_LIMIT)}"
        )


def amount(n: float) -> str:
    """``23,904``, ``1.2e7``, ``4.0e18``."""
    return f"{n:,.0f}" if n < 1e6 else _scientific(n)


def in_bytes(n: float) -> str:
    """``12.5 MB``, ``1.97 TB``, ``1.2e3 EB``."""
    for unit in ("B", "KB", "MB", "GB", "TB", "PB", "EB"):
        if n < 1000 or unit == "EB":
            return f"{n:.3g} {unit}" if n < 1000 else f"{_scientific(n)} {unit}"
        n /= 1000
    raise AssertionError  # pragma: no cover


def _scientific(n: float) -> str:
    mantissa, exponent = f"{n:.1e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def machine_memory() -> int:
    """This machine's memory in bytes (unbounded where the system does not tell)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 2**63


def activations(variant: Variant, tokens: int, batch_size: int) -> int:
    """Bytes one training batch keeps for its backward pass, roughly: per block, a few values per
    token and unit of width, and the attention's scores per pair of tokens (fp32)."""
    spec = variant.spec
    per_row = tokens * (spec.dim * FLOATS_PER_TOKEN + tokens * FLOATS_PER_PAIR)
    return 4 * max(spec.blocks, 1) * batch_size * per_row


def with_spec(variant: Variant, **changes: Any) -> Variant:
    return replace(variant, spec=variant.spec.model_copy(update=changes))


def backbone_parameters(variant: Variant, ctx: BuildContext) -> int:
    """The backbone's parameters: built as the model is (:func:`ablate.model.blocks.assemble`) but
    with at most two blocks, the second's own parameters (not those the blocks share, e.g.
    TiSASRec's tables) standing for every further block (so ``blocks: 1e9`` costs two)."""
    keys = {id(part): key for held in variant_parts(variant).values() for key, part in held}
    with on_meta():
        backbone = assemble(
            with_spec(variant, blocks=min(variant.spec.blocks, 2)),
            ctx,
            lambda part, constructor: built(constructor, keys[id(part)]),
        )
    blocks = list(backbone.blocks)
    first = {id(p) for p in blocks[0].parameters()} if len(blocks) > 1 else set()
    per_block = sum(p.numel() for p in blocks[-1].parameters() if id(p) not in first) if blocks else 0
    return parameters(backbone) + (variant.spec.blocks - len(blocks)) * per_block


def model_size(
    variant: Variant,
    ctx: BuildContext,
    batch_size: int,
    task_parameters: Callable[[BuildContext], int] = lambda ctx: 0,
) -> Size:
    """The size of a model with these settings; raises :class:`ShapeProblem` or :class:`TooLarge`."""
    count = backbone_parameters(variant, ctx) + task_parameters(ctx)
    return Size(count, activations(variant, ctx.max_len, batch_size))


@dataclass(frozen=True)
class Oversized:
    """Why a model is refused: the setting to blame (a key under the model, or an absolute one
    with ``absolute``) and the message."""

    key: tuple
    message: str
    absolute: bool = False


def oversized(
    variant: Variant,
    ctx: BuildContext,
    batch_size: int,
    task_parameters: Callable[[BuildContext], int] = lambda ctx: 0,
    tokens_key: tuple = TASK_KEY,
) -> tuple[Size | None, Oversized | None]:
    """The model's size, and what to blame when it is over :data:`MEMORY_LIMIT` (None: it fits):
    the width, the depth, the tokens per row (``tokens_key``: the task option that sets them),
    the batch, the task's embedding and head, else the largest component. Raises :class:`ShapeProblem`."""
    spec = variant.spec

    def size(variant_: Variant = variant, ctx_: BuildContext = ctx, batch: int = batch_size) -> Size | None:
        try:
            return model_size(variant_, ctx_, batch, task_parameters)
        except TooLarge:
            return None

    found = size()
    if found is not None and found.fits():
        return found, None
    shown = found.over() if found else _extrapolated(variant, ctx, batch_size)
    small = with_spec(variant, dim=SMALL_DIM)
    if spec.dim > SMALL_DIM and _fits(size(small, replace(ctx, dim=SMALL_DIM))):
        return found, Oversized(("dim",), f"{spec.dim} gives {shown}")
    if spec.blocks > 1 and _fits(size(with_spec(variant, blocks=1))):
        return found, Oversized(("blocks",), f"{spec.blocks} gives {shown}")
    if ctx.max_len > NOMINAL_TOKENS and _fits(size(ctx_=replace(ctx, max_len=NOMINAL_TOKENS))):
        return found, Oversized(tokens_key, f"{ctx.max_len} tokens per row give {shown}", absolute=True)
    if found is not None and BYTES_PER_PARAMETER * found.parameters <= MEMORY_LIMIT:
        return found, Oversized(("train", "batch_size"), f"{batch_size} gives {shown}", absolute=True)
    try:
        task_heavy = found is not None and 2 * task_parameters(ctx) > found.parameters
    except TooLarge:
        task_heavy = True
    if task_heavy:
        return found, Oversized(TASK_KEY, f"the task's embedding and head: {shown}", absolute=True)
    return found, Oversized(_largest(variant_parts(variant), ctx), shown)


def _fits(size: Size | None) -> bool:
    return size is not None and size.fits()


def _largest(parts: Parts, ctx: BuildContext) -> tuple:
    """The key of the component with the most parameters (one too large to lay out, first)."""
    best, most = ("dim",), -1
    for held in parts.values():
        for key, part in held:
            try:
                count = parameters(built(lambda part=part: part.cls(part.options, ctx), key))
            except TooLarge:
                return key
            if count > most:
                best, most = key, count
    return best


def _extrapolated(variant: Variant, ctx: BuildContext, batch_size: int) -> str:
    """:meth:`Size.over` for components too large for torch to lay out: parameters extrapolated
    from two small widths (a quadratic in the width)."""
    d = SMALL_DIM
    try:
        p1, p2 = (backbone_parameters(variant, replace(ctx, dim=w)) for w in (d, 2 * d))
    except TooLarge:
        return "a model too large for torch to lay out"
    a = (p2 - 2 * p1) / (2 * d * d)
    dim = variant.spec.dim
    count = a * dim**2 + (p1 - a * d * d) / d * dim
    if not math.isfinite(count) or count <= 0:
        return "a model too large for torch to lay out"
    return Size(round(count), activations(variant, ctx.max_len, batch_size)).over()


def variant_parts(variant: Variant) -> Parts:
    """The variant's components by slot, each with its key under the model."""
    parts = {}
    for slot in COMPONENT_SLOTS:
        held = variant.parts(slot)
        listed = isinstance(getattr(variant.spec, slot), list)
        parts[slot] = tuple(((slot, i) if listed else (slot,), part) for i, part in enumerate(held))
    return parts


def check(
    where: Locator,
    key: tuple,
    variant: Variant,
    ctx: BuildContext,
    batch_size: int,
    task_parameters: Callable[[BuildContext], int] = lambda ctx: 0,
    tokens_key: tuple = TASK_KEY,
) -> Size:
    """The variant's size; a shape a component refuses, or a model over :data:`MEMORY_LIMIT`,
    raises :class:`StudyError` at the key to blame (under ``key``, the variant's place in the
    study file; a key the variant leaves to the base model at its line there)."""
    try:
        size, problem = oversized(variant, ctx, batch_size, task_parameters, tokens_key)
    except ShapeProblem as exc:
        if exc.absolute:
            raise where.error(exc.key, f"variant '{variant.name}': {exc.message}") from None
        raise where.error(key + exc.key, exc.message, MODEL_KEY + exc.key) from None
    if problem is not None:
        if problem.absolute:
            raise where.error(problem.key, f"variant '{variant.name}': {problem.message}")
        raise where.error(key + problem.key, problem.message, MODEL_KEY + problem.key)
    assert size is not None
    return size

"""Training losses (``train.loss``), a union keyed by ``kind``.

Each kind is an options model plus a function of the hidden states at target positions
``h [t, d]``, the target items ``[t]`` and the item table ``[m, d]`` (``m = num_items + 1``,
row 0 padding). Adding a loss is adding a model to ``LossKind`` and its function to ``LOSSES``.

* ``bce`` — SASRec: binary cross-entropy, positive against ``negatives`` sampled items
  (with ``exclude_seen``, only items the user has not rated in training, as SASRec's code).
* ``sampled_softmax`` — softmax over the positive and ``negatives`` uniform items (HSTU /
  FuXi-α), negatives equal to the positive masked out (accidental hits), logits ÷ temperature.
* ``softmax`` — full cross-entropy over every item (Klenitskiy & Vasilev 2023).

With the task's ``normalize`` option, ``h`` and the table arrive L2-normalised (cosine
similarity); ``temperature`` then sets the logits' scale (HSTU / FuXi-α use 0.05).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import torch
import torch.nn.functional as F
from pydantic import ConfigDict, Field, RootModel, ValidationError, model_validator
from torch import Tensor

from ablate import fastpaths, kernels
from ablate.components import Options
from ablate.tasks import untagged

DEFAULT_KIND = "bce"


class BCE(Options):
    """SASRec: per target position, ``-log σ(s⁺) - Σ_j log(1 - σ(s⁻_j))`` over ``negatives``
    items drawn uniformly from the items other than the target."""

    kind: Literal["bce"] = "bce"
    negatives: int = Field(1, gt=0)
    # Draw negatives only among items the user has not rated in training (SASRec's released
    # code); False: any item but the target (the paper's wording).
    exclude_seen: bool = False


class SampledSoftmax(Options):
    """``-log softmax([s⁺, s⁻_1 … s⁻_N] / τ)[0]`` with ``N = negatives`` items drawn uniformly
    from ``1..num_items``; a draw equal to the position's positive is masked (``-inf``).
    ``shared``: one draw of ``N`` for the whole batch (cheap: a ``[t, N]`` matmul); else ``N``
    per target position, as HSTU's research code (see :func:`per_position_logits`)."""

    kind: Literal["sampled_softmax"]
    negatives: int = Field(128, gt=0)
    temperature: float = Field(1.0, gt=0)
    shared: bool = True


class Softmax(Options):
    """Cross-entropy of ``softmax(h Eᵀ / τ)`` over every item (padding excluded)."""

    kind: Literal["softmax"]
    temperature: float = Field(1.0, gt=0)


LossKind = Annotated[BCE | SampledSoftmax | Softmax, Field(discriminator="kind")]


class LossOptions(RootModel[LossKind]):
    """``{kind: bce, negatives: 1}``; ``kind`` defaults to ``bce``. ``.root`` is the kind's options."""

    model_config = ConfigDict(frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _default_kind(cls, data: Any) -> Any:
        if isinstance(data, dict) and "kind" not in data:
            return {**data, "kind": DEFAULT_KIND}
        return data

    @classmethod
    def model_validate(cls, obj: Any, **kwargs: Any) -> LossOptions:
        """As pydantic's, but error locations leave out the union tag (``negatives``, not
        ``bce.negatives``), so they match the keys in the study file."""
        try:
            return super().model_validate(obj, **kwargs)
        except ValidationError as exc:
            tag = obj.get("kind", DEFAULT_KIND) if isinstance(obj, dict) else None
            raise untagged(exc, (), tag) from None


@dataclass
class SeenItems:
    """Which items each target position's user has rated in training: ``keys`` holds
    ``row · width + item`` sorted (see :func:`.batches.seen_keys`), ``rows [t]`` the batch row
    of each target position. A flat sorted set answers membership by binary search in
    ``O(t·k·log)`` without a ``[b, m]`` bitmap (large catalogues)."""

    keys: Tensor
    width: int
    rows: Tensor

    def contains(self, items: Tensor) -> Tensor:
        """``[t, k]`` items → ``[t, k]`` bool: rated in training by that position's user."""
        if not len(self.keys):
            return torch.zeros_like(items, dtype=torch.bool)
        query = self.rows[:, None] * self.width + items
        at = torch.searchsorted(self.keys, query).clamp(max=len(self.keys) - 1)
        return self.keys[at] == query


# A user who rated nearly every item would make rejection sampling loop for long; after this
# many redraws the remaining hits stand (they are still never the target).
MAX_REDRAWS = 64


def sample_negatives(
    positives: Tensor, num_items: int, count: int, generator: torch.Generator, seen: SeenItems | None = None
) -> Tensor:
    """``[t, count]`` items uniform over ``1..num_items`` minus each row's positive: draw from
    ``num_items - 1`` values and shift those at or above the positive up by one. With ``seen``,
    uniform over the items that user has not rated (draws that hit one are redrawn)."""

    def draw() -> Tensor:
        shape = (len(positives), count)
        values = torch.randint(1, num_items, shape, generator=generator, device=generator.device)
        values = values.to(positives.device)
        return values + (values >= positives[:, None]).long()

    negatives = draw()
    for _ in range(MAX_REDRAWS if seen is not None else 0):
        hit = seen.contains(negatives)
        if not hit.any():
            break
        negatives = torch.where(hit, draw(), negatives)
    return negatives


def lookup(table: Tensor, index: Tensor) -> Tensor:
    """``table[index]`` through ``F.embedding``, whose CPU backward sums an item's repeated rows in
    a fixed order. Advanced indexing's backward (``index_put_`` with accumulation) adds them with
    atomics across threads: at 2 threads the same seed gave different weights from run to run."""
    return F.embedding(index, table)


def bce(
    options: BCE,
    h: Tensor,
    positives: Tensor,
    table: Tensor,
    generator: torch.Generator,
    seen: SeenItems | None = None,
) -> Tensor:
    negatives = sample_negatives(
        positives, table.shape[0] - 1, options.negatives, generator, seen if options.exclude_seen else None
    )  # [t, k]
    pos = (h * lookup(table, positives)).sum(-1)  # [t]
    neg = torch.einsum("td,tkd->tk", h, lookup(table, negatives))  # [t, k]
    # -log σ(x) = softplus(-x); -log(1 - σ(x)) = softplus(x)
    return (F.softplus(-pos) + F.softplus(neg).sum(-1)).mean()


# Above this many [t, m] logits the dense route's memory is not worth it (4 bytes each, twice
# with the gradient).
DENSE_LOGITS_LIMIT = 1 << 27


def gathered_logits(h: Tensor, table: Tensor, negatives: Tensor) -> Tensor:
    """``[t, k]``: ``h_t · E[negatives_tk]`` from the ``[t, k, d]`` gathered vectors."""
    return torch.einsum("td,tkd->tk", h, lookup(table, negatives))


def dense_logits(h: Tensor, table: Tensor, negatives: Tensor) -> Tensor:
    """The same ``[t, k]`` picked out of every item's logit ``h Eᵀ [t, m]``."""
    return (h @ table.T).gather(1, negatives)


def per_position_logits(h: Tensor, table: Tensor, negatives: Tensor) -> Tensor:
    """``[t, k]`` logits of each position's own negatives. On the CPU in float32/float64 one
    kernel reads the table rows in place (:func:`ablate.kernels.gathered_dot`: ``t·k·d``
    multiply-adds, nothing moved). Otherwise: gathering moves ``t·k·d`` values (and scatters as
    many back in the backward pass) — memory-bound; one ``[t, d] × [d, m]`` matmul does ``t·m·d``
    multiply-adds at full speed. With small catalogues (``m ≤ k·d``; ML-1M's 3,416 items against
    128 negatives × d = 50) the matmul is the faster of those two (benchmarks/RESULTS.md): the
    ``dense`` fast path (:mod:`ablate.fastpaths`)."""
    if kernels.takes_all(h, table):
        return kernels.gathered_dot(h, table, negatives)
    t, (m, d), k = len(h), table.shape, negatives.shape[1]
    if m <= k * d and t * m <= DENSE_LOGITS_LIMIT and fastpaths.enabled("dense"):
        return dense_logits(h, table, negatives)
    return gathered_logits(h, table, negatives)


def sampled_softmax(
    options: SampledSoftmax,
    h: Tensor,
    positives: Tensor,
    table: Tensor,
    generator: torch.Generator,
    seen: SeenItems | None = None,
) -> Tensor:
    num_items = table.shape[0] - 1
    shape = (1, options.negatives) if options.shared else (len(positives), options.negatives)
    negatives = torch.randint(1, num_items + 1, shape, generator=generator, device=generator.device)
    negatives = negatives.to(positives.device)  # [1|t, k]
    pos = (h * lookup(table, positives)).sum(-1, keepdim=True)  # [t, 1]
    shared = options.shared
    neg = h @ lookup(table, negatives[0]).T if shared else per_position_logits(h, table, negatives)  # [t, k]
    neg = neg.masked_fill(negatives == positives[:, None], float("-inf"))  # accidental hits
    logits = torch.cat([pos, neg], dim=1) / options.temperature  # [t, 1 + k]
    return -torch.log_softmax(logits.float(), dim=1)[:, 0].mean()


def softmax(
    options: Softmax,
    h: Tensor,
    positives: Tensor,
    table: Tensor,
    generator: torch.Generator,
    seen: SeenItems | None = None,
) -> Tensor:
    logits = (h @ table[1:].T) / options.temperature  # [t, m - 1]: item i is column i - 1
    return F.cross_entropy(logits.float(), positives - 1)


LOSSES: dict[type, Callable[..., Tensor]] = {BCE: bce, SampledSoftmax: sampled_softmax, Softmax: softmax}


def compute(
    options: Any,
    h: Tensor,
    positives: Tensor,
    table: Tensor,
    generator: torch.Generator,
    seen: SeenItems | None = None,
) -> Tensor:
    """Mean loss over target positions; ``options`` is a :class:`LossOptions` or a kind's options;
    ``seen`` the users' rated items, for kinds that sample negatives among the unseen."""
    kind = options.root if isinstance(options, LossOptions) else options
    return LOSSES[type(kind)](kind, h, positives, table, generator, seen)

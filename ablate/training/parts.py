"""One batch's loss, part by part (micro-batches), forward and backward; on a CPU with several
torch threads the parts run in parallel streams.

At d = 50 most ops of a step are a few hundred microseconds, so a two-threaded op spends much of
its time in fork / join; two single-threaded streams, each taking whole micro-batches, keep both
cores busy (benchmarks/RESULTS.md, session 11). So that the result does not depend on the
number of streams, each part draws from generators of its own, seeded from the step's: its
dropout masks from one seeded by the global RNG (``train.vary.dropout``), its other draws
(sampled negatives) from one seeded by the task's generator (``train.vary.order``). Each part's
gradients are computed apart and added in part order, the same sums in one stream or several.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from pydantic import BaseModel
from torch import Tensor, nn

from ablate.components import (
    dropout_generator,
    has_auxiliary_losses,
    thread_dropout_generator,
    total_auxiliary_loss,
)
from ablate.tasks import LossPart, Task, cpu_streams


def with_auxiliary(part: Tensor | LossPart, model: nn.Module) -> Tensor:
    """A loss part plus the auxiliary loss its forward left in the model's components
    (:func:`~ablate.components.total_auxiliary_loss`): ``part + auxiliary``, or for a
    :class:`LossPart` ``(value + auxiliary) · share``."""
    value, share = (part.value, part.share) if isinstance(part, LossPart) else (part, None)
    auxiliary = total_auxiliary_loss(model)
    if auxiliary is not None:
        value = value + auxiliary
    return value if share is None else value * share


def loss_work(
    task: Task, model: nn.Module, batch: Any, loss: BaseModel, micro_batches: int
) -> list[Callable[[torch.Generator], Tensor | LossPart]]:
    """The batch's loss as pieces of work, each computing its part from a generator: the whole
    batch's :meth:`~ablate.tasks.Task.loss` with ``micro_batches`` 1, else one
    :class:`~ablate.tasks.LossPart` per sub-batch :meth:`~ablate.tasks.Task.split_batch` cuts,
    weighted by its share (``train.micro_batches``: a property of the step, the task only says
    how to cut)."""
    if micro_batches == 1:
        return [lambda generator: task.loss(model, batch, loss, generator)]
    pieces = task.split_batch(model, batch, micro_batches)
    # Refused before training (ablate.training.preflight); a direct caller gets a clear error.
    if pieces is None:
        raise ValueError(f"the {task.kind_name()} task cannot cut a batch into micro-batches")

    def part(piece: Any, share: float) -> Callable[[torch.Generator], LossPart]:
        return lambda generator: LossPart(task.loss(model, piece, loss, generator), share)

    return [part(piece, share) for piece, share in pieces]


def backward_parts(
    task: Task,
    model: nn.Module,
    batch: Any,
    loss: BaseModel,
    generator: torch.Generator,
    autocast: torch.autocast,
    micro_batches: int = 1,
) -> Tensor:
    """Backpropagate the batch's loss part by part (:func:`loss_work`) and return the loss,
    detached; a part that is not finite is returned before its backward. Several parts on a
    model without auxiliary losses (whose terms live in the modules between a forward and its
    backward) go through :func:`parallel_parts`; otherwise one at a time, each part's graph freed
    by its backward before the next part's forward."""
    work = loss_work(task, model, batch, loss, micro_batches)
    if len(work) > 1 and not has_auxiliary_losses(model):
        return parallel_parts(model, work, generator, autocast)
    total = None
    for piece in work:
        with autocast:  # each part's forward runs under autocast, its backward outside
            # Read right after the part's forward: the components hold that forward's terms.
            part = with_auxiliary(piece(generator), model)
        if not torch.isfinite(part):
            return part.detach()
        part.backward()
        total = part.detach() if total is None else total + part.detach()
    return total


def parallel_parts(
    model: nn.Module,
    work: list[Callable[[torch.Generator], Tensor | LossPart]],
    generator: torch.Generator,
    autocast: torch.autocast,
) -> Tensor:
    """Each ``work[i](generator_i)`` forward (under ``autocast``) and backward, in
    :func:`~ablate.tasks.cpu_streams` (one single-threaded stream per torch thread on a CPU);
    gradients added in part order."""
    # Seeds drawn in the caller, in part order: the same whatever the number of streams.
    order_seeds = torch.randint(2**62, (len(work),), generator=generator).tolist()
    # From this thread's dropout generator: a packed trial's own in its stream (ablate.training.packed).
    dropout_seeds = torch.randint(2**62, (len(work),), generator=thread_dropout_generator()).tolist()
    params = [p for p in model.parameters() if p.requires_grad]
    device = params[0].device

    def run(i: int) -> tuple[Tensor, tuple[Tensor | None, ...] | None]:
        with dropout_generator(torch.Generator().manual_seed(dropout_seeds[i])):
            part = work[i](torch.Generator().manual_seed(order_seeds[i]))
            value = part.value * part.share if isinstance(part, LossPart) else part
        if not torch.isfinite(value):
            return value.detach(), None
        with torch.autocast(device.type, enabled=False):  # the backward outside autocast, as serially
            return value.detach(), torch.autograd.grad(value, params, allow_unused=True)

    # cpu_streams carries the caller's grad mode and autocast into its threads.
    with torch.enable_grad(), autocast:
        results = list(cpu_streams(run, range(len(work)), device))
    total = None
    for value, grads in results:
        if grads is None:
            return value
        total = value if total is None else total + value
        for p, g in zip(params, grads, strict=True):
            if g is not None:
                p.grad = g if p.grad is None else p.grad.add_(g)
    return total

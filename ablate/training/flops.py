"""Training FLOPs: a trial's cost in a unit that machine load cannot move. CPU seconds grow when
other work shares the machine's caches (README, *Costs under load*); the floating-point operations
a trial's training steps ask for are the same at idle and under load, on any machine.

Counted with torch's :class:`~torch.utils.flop_counter.FlopCounterMode` over one training step
(forward and backward) of a fresh build of the trial's model on its first batch, divided by the
batch's real tokens; the trial's figure is that count per token × the tokens it trained on. What
is counted is matrix products and convolutions, softmax attention included (torch has no formula
for its fused CPU form: registered here with torch's own SDPA counts); elementwise work, the
optimiser and evaluation are not. The step runs with ablate's fused kernels in their torch forms
(:func:`~ablate.fastpaths.fast_paths` off: the counter sees torch operators only), eager (a
trial under ``train.compile`` counts what its eager self would) and on one
thread (a dispatch mode sees only its own thread's operators; micro-batches run in threads),
on the CPU whatever device the trial trains on: on an H100 the same tiny study counted 3.3–3.9 %
more on CUDA (2026-11-26), where attention runs through SDPA's fused kernels and their formulas
count flash attention's recomputed product; on the CPU a figure is the same on every machine.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Any, Protocol

import torch
from torch.utils.flop_counter import (
    FlopCounterMode,
    flop_registry,
    register_flop_formula,
    sdpa_backward_flop_count,
    sdpa_flop_count,
)

from ablate.fastpaths import fast_paths


class Stepping(Protocol):
    """A trainer as :func:`flops_per_token` uses one (:class:`ablate.training.trainer.Trainer`)."""

    tokens: int  # real tokens the last step trained on
    compiled: Any  # the context its step's forward runs in (train.compile)

    def step(self, batch: Any) -> Any: ...


aten = torch.ops.aten


def _sdpa_cpu_flop(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(query_shape, key_shape, value_shape)


def _sdpa_cpu_backward_flop(
    grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs
) -> int:
    return sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)


# A later torch may count these itself (registering twice raises): ours only where it does not.
for _op, _formula in (
    (aten._scaled_dot_product_flash_attention_for_cpu, _sdpa_cpu_flop),
    (aten._scaled_dot_product_flash_attention_for_cpu_backward, _sdpa_cpu_backward_flop),
):
    if _op not in flop_registry:
        register_flop_formula(_op)(_formula)


def counted_flops(step: Any) -> int:
    """The FLOPs ``step()`` asks torch for, as this module counts them."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with fast_paths(False), FlopCounterMode(display=False) as counter:
            step()
    finally:
        torch.set_num_threads(threads)
    return counter.get_total_flops()


def flops_per_token(probe: Stepping, batches: Iterable[Any]) -> float:
    """One training step's FLOPs per real token, on ``probe`` (a trainer built for this only: the
    step moves its weights) and the first of ``batches``."""
    batch = next(iter(batches))
    # Counted eager: compiled (train.compile), dropout is drawn as lanes, with other ops around it.
    probe.compiled = contextlib.nullcontext()
    flops = counted_flops(lambda: probe.step(batch))
    return flops / probe.tokens if probe.tokens else 0.0

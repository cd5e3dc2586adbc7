"""What ``train:`` says about the optimiser beyond its kind: parameter groups with their own
learning rate or weight decay (``train.param_groups``) and the per-epoch learning-rate schedule
(``train.lr_schedule``, :data:`LR_SCHEDULES`).

Both are torch's own machinery — optimiser parameter groups and ``torch.optim.lr_scheduler`` —
so a schedule's state goes into a checkpoint with ``state_dict()`` and a resumed trial continues
on the same learning rates.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch
from torch import nn
from torch.optim.lr_scheduler import CosineAnnealingLR, LambdaLR, LRScheduler

from ablate.optim.optimizers import OPTIMIZERS
from ablate.schema import Vocabulary


class GroupOptions(Protocol):
    """One ``train.param_groups`` entry (:class:`ablate.study.spec.ParamGroupSpec`)."""

    params: str
    lr: float | None
    weight_decay: float | None


def parameter_groups(
    model: nn.Module, groups: Sequence[GroupOptions], lr: float, weight_decay: float
) -> list[dict[str, Any]]:
    """Optimiser parameter groups: each parameter joins the first group whose ``params``
    pattern it matches (``re.search`` on its dotted name, e.g. ``backbone.blocks.0.attention.
    topology.col_head``), with that group's ``lr`` / ``weight_decay`` where given; the rest form
    the first group, at ``lr`` and ``weight_decay``. Groups that match nothing in this model are
    left out (a variant without the matched component trains as if the entry were absent); one
    that matches nothing in any variant is refused before training (:mod:`ablate.training.preflight`)."""
    patterns = [re.compile(g.params) for g in groups]
    members: list[list[nn.Parameter]] = [[] for _ in groups]
    rest: list[nn.Parameter] = []
    for name, parameter in model.named_parameters():
        index = next((i for i, p in enumerate(patterns) if p.search(name)), None)
        (rest if index is None else members[index]).append(parameter)
    built = [{"params": rest, "lr": lr, "weight_decay": weight_decay}]
    for group, params in zip(groups, members, strict=True):
        if params:
            built.append(
                {
                    "params": params,
                    "lr": lr if group.lr is None else group.lr,
                    "weight_decay": weight_decay if group.weight_decay is None else group.weight_decay,
                }
            )
    return [g for g in built if g["params"]]


def build_optimizer(model: nn.Module, train: Any) -> torch.optim.Optimizer:
    """``train.optimizer`` over the model's parameters (``train``: :class:`ablate.study.spec.TrainSpec`).
    Without ``param_groups``: one group, exactly as ``OPTIMIZER(model.parameters(), …)``."""
    kind = OPTIMIZERS[train.optimizer]
    params: Any = model.parameters()
    if train.param_groups:
        params = parameter_groups(model, train.param_groups, train.lr, train.weight_decay)
    return kind(params, lr=train.lr, betas=train.betas, weight_decay=train.weight_decay)


def halving_after_two(epochs_done: int) -> float:
    """Time-Series-Library's ``lradj: type1`` as its training loop applies it: after epoch e
    (1-based) the rate becomes lr · 0.5^(e−1), so epochs 1 and 2 train at lr, epoch e ≥ 2 at
    lr · 0.5^(e−2). (``adjust_learning_rate(optimizer, epoch + 1, args)`` runs after each
    0-based epoch; DUET's trainer calls it the same way.)"""
    return 0.5 ** max(0, epochs_done - 1)


def _constant(optimizer: torch.optim.Optimizer, epochs: int) -> LRScheduler | None:
    return None  # no scheduler at all: training and checkpoints exactly as before schedules existed


def _type1(optimizer: torch.optim.Optimizer, epochs: int) -> LRScheduler:
    return LambdaLR(optimizer, halving_after_two)


def _cosine(optimizer: torch.optim.Optimizer, epochs: int) -> LRScheduler:
    # epoch e (1-based) at lr · (1 + cos(π (e−1) / epochs)) / 2: Time-Series-Library's `cosine`
    return CosineAnnealingLR(optimizer, T_max=epochs)


# ``train.lr_schedule`` → (optimizer, train.epochs) → a scheduler stepped once after every epoch,
# or None for a constant rate. Every group's rate is scaled by the same factor.
LR_SCHEDULES: Vocabulary[Callable[[torch.optim.Optimizer, int], LRScheduler | None]] = Vocabulary(
    "learning-rate schedule",
    {"constant": _constant, "type1": _type1, "cosine": _cosine},
)

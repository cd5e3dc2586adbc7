"""A stacked pack's evaluations batched: while its members evaluate one after another (each its
task's own ``evaluate``, on the same split), their models' forward calls are answered from one
forward under ``torch.vmap`` over the members' stacked weights per input, so that on a GPU one
launch serves every member, as in their training steps (:mod:`ablate.training.stacked`).

The inputs are not stacked: every member evaluates the same batches, so the first member to
call on an input runs the stacked forward for all (the input shared, the weights batched) and
each later member's call on an equal input (checked element for element) takes its slice. A call
on an input no earlier call made — a member that evaluates other batches, or none at this epoch
— and any forward ``vmap`` cannot run are answered by the member's own model: numbers never
depend on the sharing, only launches do. What a member's evaluation does around its forward (its
scores over the items, its metrics) stays its own.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call
from torch.utils._pytree import tree_leaves, tree_map

from ablate import fastpaths
from ablate.training.stacked import quiet_fallbacks, same_value, stack_weights


@dataclasses.dataclass(eq=False)  # found by identity: its outputs are tensors
class _Answer:
    """One input's stacked forward: the call it answers, every member's output, who has not
    taken theirs yet."""

    args: tuple
    kwargs: dict
    outputs: Any
    waiting: set[int]


# The outputs kept for members yet to take them: the first member evaluates the whole split
# before the next begins, so the others' slices wait (a seqrec evaluation's last positions are
# ~1 MiB a member on ML-1M; an lm's hidden states of every token could be GiBs). Past this, calls
# are each member's own.
KEPT_BYTES = 512 * 2**20


class SharedForwards:
    """Within ``with``: ``models``' forward calls answered from one stacked forward per input
    (``skeleton``: the pack's model on the meta device). ``models`` in the order they evaluate:
    an input's stacked forward is kept for the members after the one that ran it (the last member
    runs its own), so one that calls out of that order runs its own too. ``counts``: calls
    answered stacked, from a stacked forward another member ran, and by the member's own model."""

    def __init__(self, skeleton: nn.Module, models: Sequence[nn.Module]):
        self.skeleton, self.models = skeleton, list(models)
        self.counts = {"stacked": 0, "shared": 0, "own": 0}
        self._answers: list[_Answer] = []
        self._lock = threading.Lock()  # evaluation batches may run in CPU streams (ablate.tasks)
        self._broken = False

    def __enter__(self) -> SharedForwards:
        self._aliases, self._params, self._buffers = stack_weights(self.models, grad=False)
        for j, model in enumerate(self.models):
            model.forward = _Member(self, j)  # an instance attribute: nn.Module.__call__ reads it first
        return self

    def __exit__(self, *exc: Any) -> None:
        for model in self.models:
            model.__dict__.pop("forward", None)
        self._answers.clear()

    def answer(self, j: int, args: tuple, kwargs: dict) -> Any:
        with self._lock:
            found = self._find(j, args, kwargs)
            later = j < len(self.models) - 1  # members evaluate in order: the last one shares with no one
            if found is None and later and not self._broken and self._kept() < KEPT_BYTES:
                found = self._stack(j, args, kwargs)
                if found is not None:
                    self._answers.append(found)
                    self.counts["stacked"] += 1
            elif found is not None:
                self.counts["shared"] += 1
            if found is not None:
                found.waiting.discard(j)
                if not found.waiting:
                    self._answers.remove(found)
                return tree_map(lambda t: t[j], found.outputs)
            self.counts["own"] += 1
        model = self.models[j]
        return type(model).forward(model, *args, **kwargs)

    def _find(self, j: int, args: tuple, kwargs: dict) -> _Answer | None:
        """The oldest answer member ``j`` has not taken on an equal input (members call in the
        same order: the first one compared is the one, as a rule)."""
        for waiting in self._answers:
            if j in waiting.waiting and same_value(waiting.args, args) and same_value(waiting.kwargs, kwargs):
                return waiting
        return None

    def _kept(self) -> int:
        return sum(t.nbytes for a in self._answers for t in tree_leaves(a.outputs) if isinstance(t, Tensor))

    def _stack(self, j: int, args: tuple, kwargs: dict) -> _Answer | None:
        aliases = self._aliases

        def forward(params: dict[str, Tensor], buffers: dict[str, Tensor]) -> Any:
            named = {alias: params[name] for alias, name in aliases.items()}
            return functional_call(self.skeleton, (named, buffers), args, kwargs)

        self.skeleton.train(self.models[0].training)
        try:
            with fastpaths.fast_paths(kernels=False), quiet_fallbacks():
                outputs = torch.vmap(forward)(self._params, self._buffers)
        except Exception:  # noqa: BLE001 - whatever vmap cannot run, each member answers alone
            self._broken = True
            return None
        return _Answer(args, kwargs, outputs, set(range(j, len(self.models))))  # ``j`` and those after


class _Member:
    """Member ``j``'s forward while its pack's forwards are shared."""

    def __init__(self, shared: SharedForwards, j: int):
        self.shared, self.j = shared, j

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.shared.answer(self.j, args, kwargs)

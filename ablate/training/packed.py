"""Packed trials: several seeds of one variant trained in one process, epoch by epoch in lockstep,
each member exactly the trial it would have been alone.

Each member is a :class:`~ablate.training.trainer.TrialRun` — the code a trial alone runs — with
its own initialisation, data order, optimiser, schedule, early stopping (a stopped member stops
training and keeps its best epoch while the others go on), checkpoint and callbacks. Its random
draws are its own: the task's (data order, sampled negatives) come from its trainer's generator,
and whatever it draws from the process's global generators (initialisation, dropout) from its
own :class:`~ablate.training.randomness.GlobalStates`, swapped in around each of its phases.

On the CPU with several torch threads the members' training epochs run at once, one member per
single-threaded stream (:func:`~ablate.tasks.cpu_streams`), their dropout drawn from the member's
own generator in its thread. That holds only where a training step draws from the global
generators through CPU dropout alone, which a probe step checks before the first epoch (torch's
own dropout, on a GPU or with the ``lanes`` fast path off, draws from the global generator);
elsewhere the members take turns: exact, but no faster than one trial after another.

On a GPU (or where asked: ``stacked=True``) the members' steps are stacked instead
(:mod:`ablate.training.stacked`): their parameters stacked along a leading axis and the model's
forward run once for all of them under ``vmap``, each member's loss, dropout keys, gradients and
update its own, and their evaluations' forwards shared (:mod:`ablate.training.shared_eval`). A
model that cannot be stacked (what :func:`~ablate.training.stacked.stacker`
says, in one warning line) takes turns.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ablate.components import dropout_generator
from ablate.errors import warn
from ablate.model.variant import Variant
from ablate.study.load import Study
from ablate.tasks import cpu_streams
from ablate.training.checkpoints import Checkpoint
from ablate.training.memory import PeakMemory
from ablate.training.randomness import GlobalStates
from ablate.training.shared_eval import SharedForwards
from ablate.training.stacked import Stacker, stacker, train_stacked
from ablate.training.trainer import EpochCallback, Trainer, TrialResult, TrialRun


@dataclass
class Member:
    """One seed of the pack: its run, its global random states, and how it ended (a result, or
    the exception that ended it alone)."""

    seed: int
    run: TrialRun | None = None
    states: GlobalStates | None = None
    failure: Exception | None = None

    @property
    def training(self) -> bool:
        return self.failure is None and self.run is not None and self.run.training

    def phase(self, work: Callable[[TrialRun], None]) -> None:
        """``work(run)`` with this member's global random states in; an exception ends this member."""
        if self.failure is not None or self.run is None or self.states is None:
            return
        try:
            with self.states.active():
                work(self.run)
        except Exception as exc:  # noqa: BLE001 - one member fails alone, as a trial alone would
            self.failure = exc


def _same_states(a: GlobalStates, b: GlobalStates) -> bool:
    numpy_same = (
        a.numpy[0] == b.numpy[0] and np.array_equal(a.numpy[1], b.numpy[1]) and a.numpy[2:] == b.numpy[2:]
    )
    return a.python == b.python and numpy_same and torch.equal(a.torch_cpu, b.torch_cpu)


def steps_in_threads(run: TrialRun) -> bool:
    """Whether ``run``'s training step draws from the process's global generators only through
    CPU dropout's thread generator (so members can step in parallel threads): one step of a copy
    of its model on a batch of a throwaway order, the global states compared before and after."""
    if run.device.type != "cpu":
        return False
    before = GlobalStates.capture()
    try:
        trainer = Trainer(run.study, copy.deepcopy(run.model), torch.Generator().manual_seed(0), run.device)
        with dropout_generator(torch.Generator().manual_seed(0)):
            trainer.step(next(iter(trainer.batches(run.data))))
        return _same_states(before, GlobalStates.capture())
    except Exception:  # noqa: BLE001 - a model that cannot be copied or stepped so takes turns
        return False
    finally:
        before.restore()


def _train_in_streams(members: list[Member], device: torch.device) -> None:
    """The members' next training epoch at once, one single-threaded stream each."""
    generators = [m.states.cpu_generator() for m in members]

    def epoch(index: int) -> Exception | None:
        try:
            with dropout_generator(generators[index]):
                members[index].run.train_epoch()
        except Exception as exc:  # noqa: BLE001 - one member fails alone
            return exc
        return None

    for member, generator, failure in zip(
        members, generators, cpu_streams(epoch, range(len(members)), device), strict=True
    ):
        member.states.take_cpu(generator)
        member.failure = failure


def _locked(callback: Callable[[], None] | None) -> Callable[[], None] | None:
    """``callback`` called from one thread at a time (members' steps call it from their streams)."""
    if callback is None:
        return None
    lock = threading.Lock()

    def call() -> None:
        with lock:
            callback()

    return call


def _stacking(built: list[Member], device: torch.device, stacked: bool | None) -> Stacker | None:
    """The pack's :class:`Stacker` where its steps are stacked, else None (with one warning line
    when stacking was asked for or chosen and the model cannot be stacked)."""
    if len(built) < 2 or stacked is False or (stacked is None and device.type == "cpu"):
        return None
    found, reason = stacker(built[0].run)
    if found is None:
        warn(f"the pack's {len(built)} members take turns, not stacked: {reason}")
    return found


def _evaluating(stacking: Stacker | None, members: list[Member]) -> AbstractContextManager:
    """Where the pack's steps are stacked, its members' evaluations share their forwards
    (:class:`~ablate.training.shared_eval.SharedForwards`)."""
    models = [m.run.model for m in members if m.failure is None and m.run is not None]
    if stacking is None or len(models) < 2:
        return nullcontext()
    return SharedForwards(stacking.skeleton, models)


def train_packed(
    study: Study,
    variant: Variant,
    seeds: Sequence[int],
    data: Any,
    device: torch.device,
    on_epoch: Sequence[EpochCallback | None] | None = None,
    on_step: Callable[[], None] | None = None,
    checkpoints: Sequence[Checkpoint | None] | None = None,
    threads: bool = True,
    stacked: bool | None = None,
) -> list[TrialResult | Exception]:
    """Train ``variant`` with each of ``seeds`` as one pack; each member's result, or the
    exception that ended it (a :class:`~ablate.training.trainer.TrialFailed`, a component's
    error), in seed order. ``on_epoch[i]`` and ``checkpoints[i]`` are member ``i``'s, as
    :func:`~ablate.training.trainer.train_trial` takes them; ``threads=False`` makes the members
    take turns even where they could step in parallel threads; ``stacked`` stacks their steps
    (None: on a GPU only; True: anywhere, a CPU too; False: never). A stop (Ctrl-C, SIGTERM) or
    any other ``BaseException`` ends the whole pack."""
    count = len(seeds)
    on_epoch = list(on_epoch) if on_epoch is not None else [None] * count
    checkpoints = list(checkpoints) if checkpoints is not None else [None] * count
    step = _locked(on_step)
    caller = GlobalStates.capture()
    members = [Member(seed) for seed in seeds]
    for member, callback, checkpoint in zip(members, on_epoch, checkpoints, strict=True):
        try:  # each member seeds the global generators as it builds, as a trial alone does
            member.run = TrialRun(study, variant, member.seed, data, device, callback, step, checkpoint)
        except Exception as exc:  # noqa: BLE001 - one member fails alone
            member.failure = exc
        member.states = GlobalStates.capture()
    caller.restore()
    built = [m for m in members if m.run is not None]
    in_threads = (
        threads
        and device.type == "cpu"
        and torch.get_num_threads() > 1
        and len(built) > 1
        and steps_in_threads(built[0].run)
    )
    stacking = _stacking(built, device, stacked)
    with PeakMemory(device) as memory:
        while active := [m for m in members if m.training]:
            if stacking is not None and len(active) > 1:
                train_stacked(active, stacking)
            elif in_threads and len(active) > 1:
                _train_in_streams(active, device)
            else:
                for member in active:
                    member.phase(TrialRun.train_epoch)
            with _evaluating(stacking, active):
                for member in active:
                    member.phase(lambda run: run.end_epoch(memory))
        for member in members:
            member.phase(TrialRun.restore_best)
        with _evaluating(stacking, members):
            for member in members:
                member.phase(TrialRun.evaluate_final)
    caller.restore()
    return [m.failure if m.failure is not None else m.run.result(memory) for m in members]

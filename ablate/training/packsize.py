"""How many seeds of a variant a GPU trains as one stacked pack under ``train.pack: auto``,
measured: stacked steps of 1, 2, 4, … copies of the variant's model on the worker's device, each
size timed over a few steps of real batches, doubling while the member-steps per second grow by
at least :data:`MIN_GAIN` and the next size's memory fits (:data:`HEADROOM` of what other
processes leave free: several workers may share the GPU, ``--per-gpu``); the last size that gained is kept.
A size's peak is measured, the next one's predicted at twice it, and an out-of-memory step ends
the search at the size before (a pack that meets it later trains its members again alone). The
copies train throwaway generators and the process's global random states are restored, so no
trial's draws move.

A model that does not stack (:func:`~ablate.training.stacked.stacker` says why) gets 1: its
members would take turns, no faster than trials alone.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ablate.model.variant import Variant
from ablate.study.load import Study
from ablate.training.randomness import GlobalStates
from ablate.training.stacked import stacker
from ablate.training.trainer import Trainer

MIN_GAIN = 1.10  # a doubling must give 10 % more member-steps per second to be worth a bigger pack
HEADROOM = 0.85  # share of the device's memory a pack may use (evaluation peaks, fragmentation)
STEPS = 3  # timed steps per size, after one untimed (kernel selection, allocator warm-up)


@dataclass(frozen=True)
class Timing:
    """One pack size as measured: seconds per step of all its members, and the step's peak MiB
    (0 where the device has no allocator statistics)."""

    members: int
    seconds: float
    peak_mb: float

    @property
    def rate(self) -> float:
        """Member-steps per second."""
        return self.members / self.seconds


def measure_pack_size(
    study: Study,
    variant: Variant,
    data: Any,
    device: torch.device,
    most: int,
    memory_mb: float | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[int, list[Timing]]:
    """The pack size for ``variant`` on ``device`` (at most ``most``) and the timings it read.
    ``memory_mb``: what a pack may use (default on CUDA: :data:`HEADROOM` of the memory free of
    other processes, as workers sharing the GPU leave it; unbounded elsewhere)."""
    before = GlobalStates.capture()
    try:
        run = _Run(study, Trainer.start(study, variant, 0, data, device), data, device)
        found, _ = stacker(run)
        if found is None or most < 2:
            return 1, []
        if memory_mb is None and device.type == "cuda":  # what other processes on the GPU leave free
            free, _ = torch.cuda.mem_get_info(device)
            memory_mb = HEADROOM * (free + torch.cuda.memory_reserved(device)) / 2**20
        timings: list[Timing] = []
        size = members = 1
        while members <= most:
            try:
                timing = _time(run, found, members, device, clock)
            except torch.OutOfMemoryError:
                break
            timings.append(timing)
            if len(timings) > 1 and timing.rate < MIN_GAIN * timings[-2].rate:
                break  # not worth a bigger pack: the size before stays
            size = members
            if memory_mb is not None and 2 * timing.peak_mb > memory_mb:
                break
            members *= 2
        return size, timings
    finally:
        if device.type == "cuda":
            torch.cuda.empty_cache()
        before.restore()


@dataclass
class _Run:
    """What the stacked step and its probe read of a trial's run (a :class:`TrialRun` without its
    records): its study, trainer, data and device."""

    study: Study
    trainer: Trainer
    data: Any
    device: torch.device


def _copy(run: _Run, seed: int) -> _Run:
    """A member of the measuring pack: a trainer of a copy of the model, its own generator."""
    model = copy.deepcopy(run.trainer.model)
    return _Run(
        run.study,
        Trainer(run.study, model, torch.Generator().manual_seed(seed), run.device),
        run.data,
        run.device,
    )


def _time(run: _Run, found: Any, members: int, device: torch.device, clock) -> Timing:
    copies = [_copy(run, seed) for seed in range(members)]
    batches = iter(copies[0].trainer.batches(run.data))
    states = [GlobalStates.capture() for _ in copies]
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    seconds = []
    for step in range(STEPS + 1):
        batch = next(batches, None)
        if batch is None:  # a data set of fewer batches: start it again
            batches = iter(copies[0].trainer.batches(run.data))
            batch = next(batches)
        batch = batch.to(device)
        start = clock()
        if members == 1:  # a trial alone's step: what a pack of one is
            copies[0].trainer.step(batch)
        else:
            found.step(copies, states, [batch] * members)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if step:
            seconds.append(clock() - start)
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else 0.0
    return Timing(members, sorted(seconds)[len(seconds) // 2], peak)

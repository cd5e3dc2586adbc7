"""A trial's random states: the seeding, the states a checkpoint keeps, and :class:`GlobalStates`,
a trial's own copy of the process's global generators so that several trials can take turns in
one process (:mod:`ablate.training.packed`) each drawing exactly what it would draw alone."""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def random_states(generator: torch.Generator) -> dict[str, Any]:
    """Every random state the rest of a trial draws from, as tensors and plain values only, so a
    checkpoint loads with ``torch.load(weights_only=True)`` (no pickled objects, no code run)."""
    name, key, position, has_gauss, cached = np.random.get_state()
    states = {
        "python": random.getstate(),
        "numpy": (name, torch.from_numpy(key.astype(np.int64)), int(position), int(has_gauss), float(cached)),
        "torch": torch.get_rng_state(),
        "generator": generator.get_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def restore_random_states(states: dict[str, Any], generator: torch.Generator) -> None:
    random.setstate(states["python"])
    name, key, *rest = states["numpy"]
    np.random.set_state((name, key.numpy().astype(np.uint32), *rest))
    torch.set_rng_state(states["torch"])
    generator.set_state(states["generator"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def _cuda_ready() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_initialized()


@dataclass
class GlobalStates:
    """The process's global random states (Python's, NumPy's, torch's CPU and CUDA ones) as one
    trial left them. A trial sharing the process with others runs each of its phases inside
    :meth:`active`: its states in, the others' out, so its draws are those of the trial alone."""

    python: Any
    numpy: Any
    torch_cpu: torch.Tensor
    cuda: list[torch.Tensor] | None

    @classmethod
    def capture(cls) -> GlobalStates:
        cuda = torch.cuda.get_rng_state_all() if _cuda_ready() else None
        return cls(random.getstate(), np.random.get_state(), torch.get_rng_state(), cuda)

    def restore(self) -> None:
        random.setstate(self.python)
        np.random.set_state(self.numpy)
        torch.set_rng_state(self.torch_cpu)
        if self.cuda is not None and _cuda_ready():
            torch.cuda.set_rng_state_all(self.cuda)

    @contextmanager
    def active(self) -> Iterator[None]:
        """These states are the process's while the block runs, and keep what it drew."""
        self.restore()
        try:
            yield
        finally:
            self.__dict__.update(vars(GlobalStates.capture()))

    def cpu_generator(self) -> torch.Generator:
        """A generator at this trial's torch CPU state: its draws in a thread of its own
        (:func:`~ablate.components.dropout_generator`), handed back by :meth:`take_cpu`."""
        return torch.Generator().set_state(self.torch_cpu)

    def take_cpu(self, generator: torch.Generator) -> None:
        self.torch_cpu = generator.get_state()

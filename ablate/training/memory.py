"""Peak memory of one trial (or one measured block): what the cost columns, the GPU probe and the
benchmarks report."""

from __future__ import annotations

import ctypes
import gc
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch


@contextmanager
def frozen_before_trials(trains_here: bool = True) -> Iterator[None]:
    """While a study's trials run in this process, what was alive when they started (modules,
    the data, the stores) is left out of the collection each trial starts with (``gc.freeze``):
    a full collection walks the ~410,000 objects of torch, MLflow, Optuna and pandas, 0.23 s a
    trial (0.4-0.75 s in a test process, measured), where the earlier trials' garbage is all it is
    there for. The frozen objects go back to the collector when the trials end (``gc.unfreeze``).
    Where the trials train in this process (``trains_here``; not a task's own code, which runs in
    a child) torch._dynamo is imported first: torch's optimizers import it at their first use, and
    its ~116,000 objects (with what it imports) left outside the freeze cost each trial's
    collection 0.1 s. Only the young generations are collected before the freeze: a full
    collection there took 0.2 s in `ablate run` and 0.5 s in each run a long-lived process (a test
    process, a notebook) starts; older garbage frozen with the rest is collected after the trials."""
    if trains_here:
        import torch._dynamo  # noqa: F401 - imported here to be frozen
    gc.collect(1)
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


class PeakMemory:
    """Peak memory of one trial in MB: CUDA's allocator peak on GPU; on CPU the growth of
    the process's resident set over its level at the start, sampled every 20 ms (the
    kernel's own high-water mark is process-wide and never resets between trials)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.peak = 0
        self._stop = threading.Event()

    @staticmethod
    def _rss() -> int:
        try:
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except OSError:  # not Linux: no sampling
            return 0

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            return self
        # Hand memory freed by earlier trials back to the OS, so this trial's growth is its own.
        gc.collect()
        _malloc_trim()
        self._base = self._rss()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self._rss() - self._base)

    def __exit__(self, *exc: Any) -> None:
        if self.device.type == "cuda":
            self.peak = torch.cuda.max_memory_allocated(self.device)
        else:
            self._stop.set()
            self._thread.join()
            self.peak = max(self.peak, self._rss() - self._base)

    @property
    def mb(self) -> float:
        """The peak so far (inside the ``with``) or of the whole block (after it)."""
        if self.device.type == "cuda":
            return max(self.peak, torch.cuda.max_memory_allocated(self.device)) / 2**20
        return self.peak / 2**20


def _malloc_trim() -> None:
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass

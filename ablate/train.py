"""Train and evaluate one (variant, seed): the task-agnostic optimiser loop.

The task supplies batches, the loss and evaluation; this module owns seeding, the
optimiser and its per-epoch learning-rate schedule, early stopping on the primary validation
metric (and the second stage after it, ``train.second_stage``), divergence detection and the
cost measurements (parameters, training tokens/s, peak memory, wall and CPU time).
"""

from __future__ import annotations

import copy
import ctypes
import gc
import json
import math
import os
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn

from . import stopping
from .build import build_backbone, count_parameters
from .components import end_stage
from .errors import AblateError
from .faults import fault_point
from .parts import backward_parts
from .schedules import LR_SCHEDULES, build_optimizer
from .study import Study, Variant


class TrialFailed(Exception):
    """A trial that cannot finish (diverged loss, a component error); the study goes on."""


@dataclass
class TrialResult:
    summary: dict[str, float]  # "valid.<metric>" and "test.<metric>" at the best epoch
    per_unit: pd.DataFrame  # test split, one row per unit
    curves: list[tuple[int, str, float]] = field(default_factory=list)  # (epoch, key, value)
    params: int = 0
    tokens_per_s: float = 0.0
    peak_memory_mb: float = 0.0
    wall_s: float = 0.0
    cpu_s: float = 0.0  # the process's CPU seconds (all threads): comparable across machine loads
    epochs: int = 0
    best_epoch: int = 0
    resumed_from: int = 0  # the epoch a checkpoint brought this trial to (0: trained from scratch)

    def costs(self) -> dict[str, float]:
        return {
            "params": float(self.params),
            "tokens_per_s": self.tokens_per_s,
            "peak_memory_mb": self.peak_memory_mb,
            "wall_s": self.wall_s,
            "cpu_s": self.cpu_s,
            "epochs": float(self.epochs),
            "best_epoch": float(self.best_epoch),
        }


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


# The seed of every source of randomness that ``train.vary`` holds still.
FIXED_SEED = 0


def seeded_model(
    study: Study, variant: Variant, seed: int, data: Any, device: torch.device
) -> tuple[nn.Module, torch.Generator]:
    """The trial's model at its initial weights and the generator of its data order, with the
    global RNGs left where its training draws from (``train.vary``).

    By default one seed drives all three, as one stream: the global RNGs initialise the weights and
    go on to draw the dropout masks. When initialisation or dropout is held still, the global RNGs
    are seeded again after the build with the dropout's seed, so each source gets its own stream."""
    vary = study.spec.train.vary
    seed_everything(seed if vary.init else FIXED_SEED)
    generator = torch.Generator().manual_seed(seed if vary.order else FIXED_SEED)
    ctx = study.build_context(variant, study.task.max_len(data))
    model = study.task.build_model(build_backbone(variant, ctx), ctx, data).to(device)
    if not (vary.init and vary.dropout):
        seed_everything(seed if vary.dropout else FIXED_SEED)
    return model, generator


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


EpochCallback = Callable[[int, dict[str, float]], None]


@dataclass
class Checkpoint:
    """Where one trial keeps its mid-training state, so a worker that dies (a killed session,
    a lost machine) costs at most ``every_s`` seconds of training, not the whole trial.

    The state is written at the end of an epoch once ``every_s`` seconds have passed since the
    last write (atomically: a temporary file renamed over the old one) and holds everything the
    rest of the training depends on — model, optimiser, learning-rate schedule, the batch
    generator's and the global random states, early-stopping state and stage, curves — so a
    resumed trial continues exactly as the uninterrupted one would have. ``signature`` names what
    the trial trains (the study's fingerprint, seed, batch size): a checkpoint with another
    signature is ignored."""

    path: Path
    signature: str
    every_s: float = 120.0

    def load(self) -> dict[str, Any] | None:
        try:
            state = torch.load(self.path, map_location="cpu", weights_only=False)
        except Exception:  # noqa: BLE001 - missing, torn or foreign: train from scratch
            return None
        return state if isinstance(state, dict) and state.get("signature") == self.signature else None

    @property
    def summary_path(self) -> Path:
        """A few bytes beside the state for ``ablate status``: epoch reached, epochs planned."""
        return self.path.with_suffix(".json")

    def save(self, state: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_name(f".{self.path.name}.{os.getpid()}.partial")
        torch.save({**state, "signature": self.signature}, partial)
        os.replace(partial, self.path)
        summary = {"epoch": state["epoch"], "epochs": state["epochs"], "saved": time.time()}
        partial.write_text(json.dumps(summary))
        os.replace(partial, self.summary_path)

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)
        self.summary_path.unlink(missing_ok=True)


def checkpoint_summaries(folder: Path) -> dict[str, dict[str, float]]:
    """``{file stem: {"epoch", "epochs", "saved"}}`` of the checkpoints in ``folder``."""
    found = {}
    for path in sorted(folder.glob("*.json")):
        try:
            found[path.stem] = json.loads(path.read_text())
        except (OSError, ValueError):  # being replaced, or torn: skip it this time
            continue
    return found


CHECKPOINT_ENV = "ABLATE_CHECKPOINT_S"


def checkpoint_interval() -> float:
    """Seconds between checkpoints: ``$ABLATE_CHECKPOINT_S`` (0: after every epoch), else 120."""
    text = os.environ.get(CHECKPOINT_ENV, "").strip()
    if not text:
        return 120.0
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not math.isfinite(value) or value < 0:
        raise AblateError(f"{CHECKPOINT_ENV}={text!r}: expected a number of seconds ≥ 0")
    return value


def _random_states(generator: torch.Generator) -> dict[str, Any]:
    states = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "generator": generator.get_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def _restore_random_states(states: dict[str, Any], generator: torch.Generator) -> None:
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])
    generator.set_state(states["generator"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def trains_in_bf16(precision: str, device: torch.device) -> bool:
    """``train.precision``: ``auto`` is bf16 on CUDA (tensor cores) and fp32 elsewhere; ``bf16``
    asks for it on any device."""
    return precision == "bf16" or (precision == "auto" and device.type == "cuda")


def training_autocast(precision: str, device: torch.device) -> torch.autocast:
    """The autocast context training steps run in."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=trains_in_bf16(precision, device))


def _patience(train: Any, stage: int) -> int:
    """Evaluations without improvement that end training stage ``stage``."""
    second = train.second_stage
    return second.patience if stage > 1 and second.patience is not None else train.patience


def train_trial(
    study: Study,
    variant: Variant,
    seed: int,
    data: Any,
    device: torch.device,
    on_epoch: EpochCallback | None = None,
    on_step: Callable[[], None] | None = None,
    checkpoint: Checkpoint | None = None,
) -> TrialResult:
    """Train ``variant`` with ``seed`` and evaluate it; raises :class:`TrialFailed`.

    With ``checkpoint``, a trial a dead worker left half-trained continues from its last saved
    epoch; ``on_epoch`` is called again for the epochs before it (so a new tracking run gets the
    whole curve), and the checkpoint is removed once the trial has a result."""
    task, train = study.task, study.spec.train
    primary = study.metrics[0]
    sign = 1.0 if task.metric_higher_is_better(primary) else -1.0
    start, cpu_start = time.perf_counter(), time.process_time()
    try:
        model, generator = seeded_model(study, variant, seed, data, device)
    except torch.OutOfMemoryError:
        raise  # the driver retries at half batch size
    except (ValueError, RuntimeError) as exc:
        raise TrialFailed(f"could not build variant '{variant.name}': {exc}") from exc
    optimizer = build_optimizer(model, train)
    scheduler = LR_SCHEDULES[train.lr_schedule](optimizer, train.epochs)
    autocast = training_autocast(train.precision, device)

    result = TrialResult(summary={}, per_unit=pd.DataFrame(), params=count_parameters(model))
    best_score, best_state, stale = -math.inf, None, 0
    stage_ends: list[int] = []  # the epochs after which a training stage early-stopped
    train_time, tokens, earlier_wall, earlier_peak, first_epoch = 0.0, 0, 0.0, 0.0, 1
    earlier_cpu = 0.0
    saved = checkpoint.load() if checkpoint else None
    if saved is not None:
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        if scheduler is not None:
            scheduler.load_state_dict(saved["scheduler"])
        stage_ends = saved.get("stage_ends", [])
        _restore_random_states(saved["random"], generator)
        best_score, best_state, stale = saved["best_score"], saved["best_state"], saved["stale"]
        train_time, tokens, result.curves = saved["train_time"], saved["tokens"], saved["curves"]
        earlier_wall, earlier_peak = saved["wall_s"], saved["peak_memory_mb"]
        earlier_cpu = saved.get("cpu_s", 0.0)  # checkpoints written before CPU time was measured
        result.best_epoch = saved["best_epoch"]
        result.epochs = result.resumed_from = saved["epoch"]
        first_epoch = saved["epoch"] + 1
        for epoch in range(1, first_epoch):
            task.on_epoch_end(model, epoch)  # replay the epoch schedule (e.g. frozen topologies)
            if epoch in stage_ends:
                end_stage(model, stage_ends.index(epoch) + 1)
            if on_epoch:
                on_epoch(epoch, {k: v for e, k, v in result.curves if e == epoch})
    last_save = time.perf_counter()
    with PeakMemory(device) as memory:
        for epoch in range(first_epoch, train.epochs + 1):
            model.train()
            t0, losses, lr = time.perf_counter(), [], optimizer.param_groups[0]["lr"]
            for batch in task.train_batches(data, train.batch_size, generator):
                batch = batch.to(device)
                optimizer.zero_grad(set_to_none=True)
                loss = backward_parts(task, model, batch, study.loss, generator, autocast)
                if not torch.isfinite(loss):
                    raise TrialFailed(f"loss became {loss.item()} at epoch {epoch}")
                if train.grad_clip:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), train.grad_clip)
                optimizer.step()
                losses.append(loss.detach())
                tokens += task.batch_tokens(batch)
                stopping.check()  # SIGTERM / Ctrl-C stop here, between steps
                if on_step:
                    on_step()
            train_time += time.perf_counter() - t0
            result.epochs = epoch
            task.on_epoch_end(model, epoch)
            logged = {"train.loss": float(torch.stack(losses).mean())} if losses else {}
            if scheduler is not None:
                logged["train.lr"] = lr
            if train.second_stage is not None:
                logged["train.stage"] = float(1 + len(stage_ends))
            if epoch % train.eval_every == 0 or epoch == train.epochs:
                valid = task.evaluate(model, data, "valid", study.metrics, device, train.eval_rows(device))
                logged.update({f"valid.{k}": v for k, v in valid.summary.items()})
                score = sign * valid.summary[primary]
                if score > best_score:
                    best_score, stale, result.best_epoch = score, 0, epoch
                    best_state = copy.deepcopy(model.state_dict())
                else:
                    stale += 1
            if scheduler is not None:
                scheduler.step()
            result.curves += [(epoch, k, v) for k, v in logged.items()]
            if on_epoch:
                on_epoch(epoch, logged)
            if train.patience and stale >= _patience(train, len(stage_ends) + 1):
                if train.second_stage is None or stage_ends:
                    break
                if train.second_stage.start == "best" and best_state is not None:
                    model.load_state_dict(best_state)
                end_stage(model, 1)  # e.g. fr_graph freezes its topology
                stage_ends.append(epoch)
                stale = 0
            if checkpoint and epoch < train.epochs and time.perf_counter() - last_save >= checkpoint.every_s:
                checkpoint.save(
                    {
                        "epoch": epoch,
                        "epochs": train.epochs,
                        "model": model.state_dict(),
                        "optimizer": optimizer.state_dict(),
                        "scheduler": scheduler.state_dict() if scheduler is not None else None,
                        "stage_ends": stage_ends,
                        "random": _random_states(generator),
                        "best_score": best_score,
                        "best_state": best_state,
                        "stale": stale,
                        "best_epoch": result.best_epoch,
                        "curves": result.curves,
                        "train_time": train_time,
                        "tokens": tokens,
                        "peak_memory_mb": max(earlier_peak, memory.mb),
                        "wall_s": earlier_wall + time.perf_counter() - start,
                        "cpu_s": earlier_cpu + time.process_time() - cpu_start,
                    }
                )
                last_save = time.perf_counter()

        if best_state is not None:
            model.load_state_dict(best_state)
        fault_point("evaluate")
        valid = task.evaluate(model, data, "valid", study.metrics, device, train.eval_rows(device))
        test = task.evaluate(model, data, "test", study.metrics, device, train.eval_rows(device))
    result.summary = {
        **{f"valid.{k}": v for k, v in valid.summary.items()},
        **{f"test.{k}": v for k, v in test.summary.items()},
    }
    result.per_unit = test.per_unit
    result.tokens_per_s = tokens / train_time if train_time > 0 else 0.0
    result.peak_memory_mb = max(earlier_peak, memory.mb)
    result.wall_s = earlier_wall + time.perf_counter() - start
    result.cpu_s = earlier_cpu + time.process_time() - cpu_start
    if checkpoint:
        checkpoint.remove()
    return result

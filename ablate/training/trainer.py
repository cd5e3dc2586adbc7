"""Train and evaluate one (variant, seed): the task-agnostic optimiser loop.

The task supplies batches, the loss (and how to cut a batch into micro-batches) and evaluation;
this module owns seeding, :class:`Trainer` — ablate's one training step (the optimiser and its
per-epoch learning-rate schedule, autocast, clipping, micro-batches), which the GPU probe and the
benchmarks step through too — early stopping on the primary validation metric (and the second
stage after it, ``train.second_stage``), divergence detection, checkpoints and the cost
measurements (parameters, training tokens/s, peak memory, wall and CPU time).
"""

from __future__ import annotations

import contextlib
import copy
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from typing import Any

import pandas as pd
import torch
from torch import Tensor, nn

from ablate import stopping
from ablate.components import end_stage
from ablate.faults import fault_point
from ablate.model.build import build_backbone, count_parameters
from ablate.model.variant import Variant
from ablate.optim.schedules import LR_SCHEDULES, build_optimizer
from ablate.study.load import Study
from ablate.training.checkpoints import CHECKPOINT_ENV, Checkpoint, checkpoint_interval, checkpoint_summaries  # noqa: F401 - their home was here
from ablate.training.compiled import CompiledForward, torch_mode
from ablate.training.flops import flops_per_token
from ablate.training.memory import PeakMemory
from ablate.training.parts import backward_parts
from ablate.training.randomness import random_states, restore_random_states, seed_everything


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
    train_gflop: float | None = None  # training steps' FLOPs (ablate.training.flops): the same at any load
    epochs: int = 0
    best_epoch: int = 0
    resumed_from: int = 0  # the epoch a checkpoint brought this trial to (0: trained from scratch)

    def costs(self) -> dict[str, float]:
        flops = {} if self.train_gflop is None else {"train_gflop": self.train_gflop}
        return {
            "params": float(self.params),
            "tokens_per_s": self.tokens_per_s,
            "peak_memory_mb": self.peak_memory_mb,
            "wall_s": self.wall_s,
            "cpu_s": self.cpu_s,
            **flops,
            "epochs": float(self.epochs),
            "best_epoch": float(self.best_epoch),
        }


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


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


EpochCallback = Callable[[int, dict[str, float]], None]


def trains_in_bf16(precision: str, device: torch.device) -> bool:
    """``train.precision``: ``auto`` is bf16 on CUDA (tensor cores) and fp32 elsewhere; ``bf16``
    asks for it on any device."""
    return precision == "bf16" or (precision == "auto" and device.type == "cuda")


# The run tag of the precision a trial trained in (fp32 / bf16): `train.precision: auto` resolves by
# the device and an auto study counts trials of either, so this tells a CPU trial from a GPU one.
PRECISION_TAG = "ablate.precision"


def precision_name(precision: str, device: torch.device) -> str:
    """What ``train.precision`` trains in on ``device``: 'bf16' or 'fp32'."""
    return "bf16" if trains_in_bf16(precision, device) else "fp32"


def training_autocast(precision: str, device: torch.device) -> torch.autocast:
    """The autocast context training steps run in."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=trains_in_bf16(precision, device))


class Trainer:
    """ablate's one training step and the state it carries from step to step: the model, the
    optimiser ``train:`` describes (kind, betas, weight decay, parameter groups), its per-epoch
    learning-rate schedule, bf16 autocast, gradient clipping, micro-batches, its forward compiled
    (``train.compile``: :mod:`ablate.training.compiled`), the batch generator and the random
    states. :func:`train_trial`, the GPU memory probe (:mod:`ablate.commands.gpus`) and the
    benchmarks all step through it, so what they measure is what a trial runs."""

    def __init__(self, study: Study, model: nn.Module, generator: torch.Generator, device: torch.device):
        self.study, self.model, self.generator, self.device = study, model, generator, device
        self.train = study.spec.train
        self.optimizer = build_optimizer(model, self.train)
        self.scheduler = LR_SCHEDULES[self.train.lr_schedule](self.optimizer, self.train.epochs)
        self.autocast = training_autocast(self.train.precision, device)
        self.tokens = 0  # real tokens stepped on, for the tokens/s cost column
        self.grad_norm: Tensor | None = None  # the last step's gradient norm before clipping
        mode = torch_mode(self.train.compile, device)  # train.compile: the step's forward compiled
        self.compiled = CompiledForward(model, mode) if mode else contextlib.nullcontext()

    @classmethod
    def start(cls, study: Study, variant: Variant, seed: int, data: Any, device: torch.device) -> Trainer:
        """A trial's trainer at its initial weights (:func:`seeded_model`)."""
        return cls(study, *seeded_model(study, variant, seed, data, device), device)

    def batches(self, data: Any) -> Iterable[Any]:
        """One epoch of the task's shuffled training batches, drawn from this trial's generator."""
        return self.study.task.train_batches(data, self.train.batch_size, self.generator)

    def step(self, batch: Any) -> Tensor:
        """One optimiser step on ``batch``; returns its loss, detached. A loss that is not finite
        is returned before any parameter moves (the caller decides what a diverged trial is)."""
        batch = batch.to(self.device)
        self.optimizer.zero_grad(set_to_none=True)
        parts = (self.study.loss, self.generator, self.autocast, self.train.micro_batches)
        with self.compiled:
            loss = backward_parts(self.study.task, self.model, batch, *parts)
        if not torch.isfinite(loss):
            return loss
        self.update(batch)
        return loss

    def update(self, batch: Any) -> None:
        """The step once the gradients are in: clipping (and the norm before it), the optimiser's
        step, the tokens counted (members stacked compute their gradients together and update
        apart: :mod:`ablate.training.stacked`)."""
        # The gradients' total L2 norm before clipping (clipping computes it; else one reduction).
        if self.train.grad_clip:
            self.grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.train.grad_clip)
        else:
            grads = [p.grad for p in self.model.parameters() if p.grad is not None]
            self.grad_norm = torch.nn.utils.get_total_norm(grads) if grads else None
        self.optimizer.step()
        self.tokens += self.study.task.batch_tokens(batch)

    @property
    def lr(self) -> float:
        """The first parameter group's learning rate now (a schedule scales every group alike)."""
        return self.optimizer.param_groups[0]["lr"]

    def end_epoch(self) -> None:
        """The learning-rate schedule's per-epoch step."""
        if self.scheduler is not None:
            self.scheduler.step()

    def state_dict(self) -> dict[str, Any]:
        """Everything the following steps depend on, in tensors and plain values."""
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "random": random_states(self.generator),
            "tokens": self.tokens,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        restore_random_states(state["random"], self.generator)
        self.tokens = state["tokens"]


@dataclass
class Progress:
    """Where a trial's epochs stand: what a checkpoint keeps beside :meth:`Trainer.state_dict`
    (one list of names for saving and restoring)."""

    epochs: int  # planned
    epoch: int = 0  # done
    stage_ends: list[int] = field(default_factory=list)  # the epochs after which a stage early-stopped
    best_score: float = -math.inf  # the primary validation metric, signed so that higher is better
    best_state: dict[str, Tensor] | None = None
    stale: int = 0  # evaluations since the best
    best_epoch: int = 0
    curves: list[tuple[int, str, float]] = field(default_factory=list)
    train_time: float = 0.0  # seconds in training steps (tokens/s)
    peak_memory_mb: float = 0.0
    wall_s: float = 0.0
    cpu_s: float = 0.0

    def state_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}  # not asdict: no deep copy

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Progress:
        return cls(**{f.name: state[f.name] for f in fields(cls) if f.name in state})


def grad_norm_curves(norms: list[Tensor]) -> dict[str, float]:
    """An epoch's gradient norms before clipping as curve points: their mean and their maximum."""
    if not norms:
        return {}
    stacked = torch.stack(norms)
    return {"train.grad_norm": float(stacked.mean()), "train.grad_norm_max": float(stacked.max())}


def _patience(train: Any, stage: int) -> int:
    """Evaluations without improvement that end training stage ``stage``."""
    second = train.second_stage
    return second.patience if stage > 1 and second.patience is not None else train.patience


class TrialRun:
    """One trial's epochs as phases a caller drives — :meth:`train_epoch`, :meth:`end_epoch` while
    :attr:`training`, then :meth:`evaluate_best` and :meth:`result` — so that :func:`train_trial`
    runs one trial alone and :mod:`ablate.training.packed` several in lockstep through the very
    same code. Raises :class:`TrialFailed` from any phase.

    With ``checkpoint``, a trial a dead worker left half-trained continues from its last saved
    epoch; ``on_epoch`` is called again for the epochs before it (so a new tracking run gets the
    whole curve), and the checkpoint is removed once the trial has a result."""

    def __init__(
        self,
        study: Study,
        variant: Variant,
        seed: int,
        data: Any,
        device: torch.device,
        on_epoch: EpochCallback | None = None,
        on_step: Callable[[], None] | None = None,
        checkpoint: Checkpoint | None = None,
    ):
        self.study, self.data, self.device = study, data, device
        self.on_epoch, self.on_step, self.checkpoint = on_epoch, on_step, checkpoint
        task, train = study.task, study.spec.train
        self.sign = 1.0 if task.metric_higher_is_better(study.metrics[0]) else -1.0
        try:
            # A probe trainer's counted step, before the trial seeds its own build and draws; on the CPU
            # whatever the trial's device, so that the figure is the same on every machine (flops.py).
            probe = Trainer.start(study, variant, seed, data, torch.device("cpu"))
            self.per_token = flops_per_token(probe, probe.batches(data))
            del probe
            self.start, self.cpu_start = time.perf_counter(), time.process_time()
            self.trainer = Trainer.start(study, variant, seed, data, device)
        except torch.OutOfMemoryError:
            raise  # the driver retries at half batch size
        except (ValueError, RuntimeError) as exc:
            raise TrialFailed(f"could not build variant '{variant.name}': {exc}") from exc
        model = self.model = self.trainer.model
        self.outcome = TrialResult(summary={}, per_unit=pd.DataFrame(), params=count_parameters(model))
        progress = self.progress = Progress(epochs=train.epochs)
        saved = checkpoint.load() if checkpoint else None
        if saved is not None:
            self.trainer.load_state_dict(saved)
            progress = self.progress = Progress.from_state(saved)
            self.outcome.resumed_from = progress.epoch
            for epoch in range(1, progress.epoch + 1):
                task.on_epoch_end(model, epoch)  # replay the epoch schedule (e.g. frozen topologies)
                if epoch in progress.stage_ends:
                    end_stage(model, progress.stage_ends.index(epoch) + 1)
                if on_epoch:
                    on_epoch(epoch, {k: v for e, k, v in progress.curves if e == epoch})
        self.earlier = (progress.wall_s, progress.cpu_s, progress.peak_memory_mb)
        self.last_save = time.perf_counter()
        self.stopped = False  # early stopping ended training
        self.losses: list[Tensor] = []
        self.norms: list[Tensor] = []
        self.lr = self.trainer.lr

    @property
    def training(self) -> bool:
        return not self.stopped and self.progress.epoch < self.progress.epochs

    def train_epoch(self) -> None:
        """The next epoch's training steps."""
        for batch in self.begin_epoch():
            self.stepped(self.trainer.step(batch))
        self.finish_epoch()

    def begin_epoch(self) -> Iterable[Any]:
        """The next epoch's batches (drawn as they are taken), its curves' lists emptied."""
        self.model.train()
        self.epoch_start, self.losses, self.norms, self.lr = time.perf_counter(), [], [], self.trainer.lr
        return self.trainer.batches(self.data)

    def stepped(self, loss: Tensor, finite: bool | None = None) -> None:
        """After one step of the epoch: a loss that is not finite ends the trial; else its loss
        and gradient norm kept, a stop request honoured, the step callback called. ``finite``:
        already read by the caller (None: read here)."""
        if not (torch.isfinite(loss) if finite is None else finite):
            raise TrialFailed(f"loss became {loss.item()} at epoch {self.progress.epoch + 1}")
        self.losses.append(loss)
        if self.trainer.grad_norm is not None:
            self.norms.append(self.trainer.grad_norm.detach().float())
        stopping.check()  # SIGTERM / Ctrl-C stop here, between steps
        if self.on_step:
            self.on_step()

    def finish_epoch(self) -> None:
        self.progress.train_time += time.perf_counter() - self.epoch_start
        self.progress.epoch += 1

    def end_epoch(self, memory: PeakMemory) -> None:
        """The epoch's evaluation, early stopping, schedule step, callback and checkpoint."""
        study, task, train, model = self.study, self.study.task, self.study.spec.train, self.model
        progress, trainer, epoch = self.progress, self.trainer, self.progress.epoch
        task.on_epoch_end(model, epoch)
        logged = {"train.loss": float(torch.stack(self.losses).mean())} if self.losses else {}
        logged.update(grad_norm_curves(self.norms))
        if trainer.scheduler is not None:
            logged["train.lr"] = self.lr
        if train.second_stage is not None:
            logged["train.stage"] = float(1 + len(progress.stage_ends))
        if epoch % train.eval_every == 0 or epoch == train.epochs:
            valid = task.evaluate(
                model, self.data, "valid", study.metrics, self.device, train.eval_rows(self.device)
            )
            logged.update({f"valid.{k}": v for k, v in valid.summary.items()})
            score = self.sign * valid.summary[study.metrics[0]]
            if score > progress.best_score:
                progress.best_score, progress.stale, progress.best_epoch = score, 0, epoch
                progress.best_state = copy.deepcopy(model.state_dict())
            else:
                progress.stale += 1
        trainer.end_epoch()
        progress.curves += [(epoch, k, v) for k, v in logged.items()]
        if self.on_epoch:
            self.on_epoch(epoch, logged)
        if train.patience and progress.stale >= _patience(train, len(progress.stage_ends) + 1):
            if train.second_stage is None or progress.stage_ends:
                self.stopped = True
                return
            if train.second_stage.start == "best" and progress.best_state is not None:
                model.load_state_dict(progress.best_state)
            end_stage(model, 1)  # e.g. fr_graph freezes its topology
            progress.stage_ends.append(epoch)
            progress.stale = 0
        checkpoint = self.checkpoint
        if checkpoint and epoch < train.epochs and time.perf_counter() - self.last_save >= checkpoint.every_s:
            earlier_wall, earlier_cpu, earlier_peak = self.earlier
            progress.peak_memory_mb = max(earlier_peak, memory.mb)
            progress.wall_s = earlier_wall + time.perf_counter() - self.start
            progress.cpu_s = earlier_cpu + time.process_time() - self.cpu_start
            checkpoint.save({**trainer.state_dict(), **progress.state_dict()})
            self.last_save = time.perf_counter()

    def evaluate_best(self) -> None:
        """The best epoch's weights back, evaluated on the validation and test splits."""
        self.restore_best()
        self.evaluate_final()

    def restore_best(self) -> None:
        if self.progress.best_state is not None:
            self.model.load_state_dict(self.progress.best_state)

    def evaluate_final(self) -> None:
        """The model as it is (the best epoch's: :meth:`restore_best`) on the validation and test
        splits: the trial's final numbers and per-unit results."""
        study, train = self.study, self.study.spec.train
        fault_point("evaluate")
        rows = train.eval_rows(self.device)
        valid = study.task.evaluate(self.model, self.data, "valid", study.metrics, self.device, rows)
        test = study.task.evaluate(self.model, self.data, "test", study.metrics, self.device, rows)
        self.outcome.summary = {
            **{f"valid.{k}": v for k, v in valid.summary.items()},
            **{f"test.{k}": v for k, v in test.summary.items()},
        }
        self.outcome.per_unit = test.per_unit

    def result(self, memory: PeakMemory) -> TrialResult:
        """The trial's result once :meth:`evaluate_best` ran (costs to now); its checkpoint removed."""
        result, progress, trainer = self.outcome, self.progress, self.trainer
        earlier_wall, earlier_cpu, earlier_peak = self.earlier
        result.curves = progress.curves
        result.epochs, result.best_epoch = progress.epoch, progress.best_epoch
        result.tokens_per_s = trainer.tokens / progress.train_time if progress.train_time > 0 else 0.0
        result.train_gflop = self.per_token * trainer.tokens / 1e9
        result.peak_memory_mb = max(earlier_peak, memory.mb)
        result.wall_s = earlier_wall + time.perf_counter() - self.start
        result.cpu_s = earlier_cpu + time.process_time() - self.cpu_start
        if self.checkpoint:
            self.checkpoint.remove()
        return result


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
    """Train ``variant`` with ``seed`` and evaluate it, alone (:class:`TrialRun`); raises
    :class:`TrialFailed`."""
    run = TrialRun(study, variant, seed, data, device, on_epoch, on_step, checkpoint)
    with PeakMemory(device) as memory:
        while run.training:
            run.train_epoch()
            run.end_epoch(memory)
        run.evaluate_best()
    return run.result(memory)

"""``ablate run --gpus``: which GPU each worker process sees, and how many trials share one.

Each worker is an ordinary ``ablate worker`` process whose ``CUDA_VISIBLE_DEVICES`` names one
GPU, so it trains on ``cuda:0`` of its own view; workers are dealt to the GPUs in turn. How many
trials share a GPU is given (``--per-gpu K``) or measured: a probe process on the first GPU
trains one step and runs one validation of every variant, and each GPU gets as many trials as
fit in its free memory at that footprint (:data:`HEADROOM` kept back), but no more than the
machine's CPU cores per GPU (each trial process feeds its GPU from a CPU core) nor the trials
planned per GPU. Seeds are never packed into one model: separate processes keep every trial
exactly the trial it is alone.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ablate.errors import AblateError

if TYPE_CHECKING:
    import torch

    from ablate.study.load import Study
    from ablate.training.trainer import Trainer

VISIBLE = "CUDA_VISIBLE_DEVICES"
HEADROOM = 0.85  # share of a GPU's free memory the packed trials may use (fragmentation, eval peaks)
CONTEXT_MB = 600  # a process's CUDA context and library workspaces, outside torch's allocator


@dataclass(frozen=True)
class Footprint:
    """What the probe measured: one trial's peak (torch's allocator, reserved) and the GPU's
    free and total memory seen from the probe, in MiB."""

    peak_mb: float
    free_mb: float
    total_mb: float

    def fitting(self) -> int:
        """Trials of this footprint that fit at once in the free memory (at least 1)."""
        usable = HEADROOM * (self.free_mb + CONTEXT_MB)  # the probe's own context is freed when it exits
        return max(1, math.floor(usable / (self.peak_mb + CONTEXT_MB)))


@dataclass(frozen=True)
class GpuPlan:
    """``workers`` trial processes dealt in turn to ``devices`` (the GPUs as
    ``CUDA_VISIBLE_DEVICES`` names them); ``footprint``: the probe's measurement, when measured."""

    devices: tuple[str, ...]
    workers: int
    footprint: Footprint | None = None

    @property
    def per_gpu(self) -> int:
        return math.ceil(self.workers / len(self.devices))

    def env(self, worker: int) -> dict[str, str]:
        """Environment of worker ``worker`` (0-based): its GPU, and its share of the CPU cores for
        torch's threads unless ``OMP_NUM_THREADS`` is set."""
        env = {VISIBLE: self.devices[worker % len(self.devices)]}
        if "OMP_NUM_THREADS" not in os.environ:
            env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // self.workers))
        return env

    def describe(self) -> str:
        many = len(self.devices) > 1
        gpus = f"{len(self.devices)} GPU{'s' if many else ''} ({VISIBLE}={','.join(self.devices)})"
        why = ""
        if self.footprint is not None:
            f = self.footprint
            why = (
                f"; measured: a trial peaks at {f.peak_mb:,.0f} MiB + {CONTEXT_MB} MiB of CUDA context, "
                f"{f.free_mb:,.0f} of {f.total_mb:,.0f} MiB free"
            )
        each = "on each of" if many else "on"
        return f"gpus: {self.workers} workers, up to {self.per_gpu} trial(s) at once {each} {gpus}{why}"


def parse_gpus(text: str) -> int | None:
    """``--gpus``: ``all`` → None, else a count of GPUs ≥ 1."""
    if text.strip().lower() == "all":
        return None
    try:
        count = int(text)
    except ValueError:
        count = 0
    if count < 1:
        raise AblateError(f"--gpus {text}: expected 'all' or a number of GPUs ≥ 1")
    return count


def cuda_device_count() -> int:
    """GPUs torch can use here (0 without CUDA, or with a CPU-only build of torch)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def device_names(count: int) -> tuple[str, ...]:
    """The first ``count`` visible GPUs as a child's ``CUDA_VISIBLE_DEVICES`` must name them: the
    entries of this process's own ``CUDA_VISIBLE_DEVICES`` when it is set, else 0 … count-1."""
    given = [d.strip() for d in os.environ.get(VISIBLE, "").split(",") if d.strip()]
    return tuple(given[:count]) if len(given) >= count else tuple(str(i) for i in range(count))


def plan_gpus(study: Study, gpus: str | None, per_gpu: int | None, workers: int) -> GpuPlan:
    """The plan for ``--gpus`` (``--per-gpu``, ``--workers``); raises :class:`AblateError` (one
    line, exit 2) where it cannot run."""
    if gpus is None:
        raise AblateError("--per-gpu needs --gpus all|N")
    wanted = parse_gpus(gpus)
    device = study.spec.train.device
    if device not in ("auto", "cuda", "cuda:0"):
        raise AblateError(
            f"--gpus needs train.device auto or cuda (the study sets '{device}'; "
            f"each worker sees its GPU as cuda:0)"
        )
    present = cuda_device_count()
    if present == 0:
        import torch

        raise AblateError(
            f"--gpus {gpus}: no CUDA device is visible here (torch {torch.__version__}, "
            f"{VISIBLE}={os.environ.get(VISIBLE, 'unset')}); run without --gpus to train on the CPU"
        )
    if wanted is not None and wanted > present:
        raise AblateError(f"--gpus {gpus}: only {present} CUDA device(s) visible here")
    devices = device_names(present if wanted is None else wanted)
    if per_gpu is not None and workers > 1 and workers != len(devices) * per_gpu:
        raise AblateError(
            f"--workers {workers} with --gpus {gpus} --per-gpu {per_gpu}: give one of --workers and "
            f"--per-gpu (--per-gpu {per_gpu} starts {len(devices) * per_gpu} workers)"
        )
    if workers > 1 and per_gpu is None:
        return GpuPlan(devices, workers)  # the workers asked for, dealt in turn
    if per_gpu is not None:
        return GpuPlan(devices, len(devices) * per_gpu)
    if study.task.runs_trials:  # its own model: nothing of ablate's to probe, one trial per GPU
        return GpuPlan(devices, len(devices))
    footprint = probe(study, devices[0])
    per_gpu = min(footprint.fitting(), cpu_cap(len(devices)), trials_cap(study, len(devices)))
    return GpuPlan(devices, len(devices) * per_gpu, footprint)


def cpu_cap(gpus: int) -> int:
    """Trial processes per GPU the CPU can feed: one core each."""
    return max(1, (os.cpu_count() or 1) // gpus)


def trials_cap(study: Study, gpus: int) -> int:
    """No more processes per GPU than trials planned per GPU (at a sequential design's first look)."""
    from ablate.drive import plan

    return max(1, math.ceil(len(plan(study)) / gpus))


# -- the probe ----------------------------------------------------------------------------


def probe(study: Study, device: str) -> Footprint:
    """Measure one trial's footprint in a child process on GPU ``device`` (this process keeps
    no CUDA context of its own while the workers run)."""
    cmd = [sys.executable, "-m", "ablate.commands.gpus", str(study.path), *study.overrides]
    env = {**os.environ, VISIBLE: device}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        why = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        raise AblateError(f"--gpus: the memory probe failed ({why}); give --per-gpu K")
    return Footprint(**json.loads(lines[-1]))


def probe_step(study: Study, variant: str, data: Any, device: torch.device) -> Trainer:
    """Seed 0's trainer of ``variant`` after its first training step: the step a trial takes
    (:class:`~ablate.training.trainer.Trainer`: the same optimiser, parameter groups, clipping, micro-batches
    and precision), so the memory measured is the memory planned for."""
    from ablate.training.trainer import Trainer

    trainer = Trainer.start(study, study.variants[variant], 0, data, device)
    trainer.model.train()
    trainer.step(next(iter(trainer.batches(data))))
    return trainer


def measure_peak_mb(study: Study, device: torch.device) -> float:
    """Peak memory (MiB) of one training step and one validation of each variant on ``device``:
    torch's reserved peak on CUDA, resident-set growth on CPU
    (:class:`~ablate.training.memory.PeakMemory`)."""
    import torch

    from ablate.training.memory import PeakMemory

    task, train = study.task, study.spec.train
    data = task.load()
    peak = 0.0
    for variant in study.variants:
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        with PeakMemory(device) as memory:
            trainer = probe_step(study, variant, data, device)
            task.evaluate(trainer.model, data, "valid", study.metrics, device, train.eval_rows(device))
        reserved = torch.cuda.max_memory_reserved(device) / 2**20 if device.type == "cuda" else 0.0
        peak = max(peak, memory.mb, reserved)
        del trainer
    return peak


def main(argv: list[str]) -> None:
    """``python -m ablate.commands.gpus STUDY [key=value …]``: the probe; prints a :class:`Footprint`
    as JSON."""
    import torch

    from ablate.study.load import load_study

    study = load_study(argv[0], overrides=argv[1:])
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    free, total = torch.cuda.mem_get_info(device) if device.type == "cuda" else (0, 0)
    try:
        peak = measure_peak_mb(study, device)
    except torch.OutOfMemoryError:  # one trial alone does not fit: one per GPU, its own OOM retry decides
        peak = total / 2**20
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info(device)
    reserved = torch.cuda.memory_reserved(device) if device.type == "cuda" else 0
    # Free as the workers will find it: what this probe still holds is theirs too.
    print(json.dumps({"peak_mb": peak, "free_mb": (free + reserved) / 2**20, "total_mb": total / 2**20}))


if __name__ == "__main__":  # pragma: no cover - run as the probe's child process
    try:
        main(sys.argv[1:])
    except AblateError as exc:  # the parent shows this line in its own
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)

"""Packed trials on the CPU: k seeds of SASRec on ML-1M (``studies/sasrec_ml1m.yaml``) trained one
after another, as trials alone (each with every torch thread, its micro-batches in parallel
streams), against the same k seeds as one pack whose members step at once, one single-threaded
stream each (:mod:`ablate.training.packed`).

    python benchmarks/packed.py [--k 2] [--steps 16] [--reps 3] [--threads 2] [--micro-batches N]
                                [--note "..."] [--no-write]

Each repetition times ``--steps`` training steps of every member both ways, interleaved (the
order alternates between repetitions); the figure is member-steps per second, and an epoch of k
seeds is k × steps per epoch ÷ that. Training steps only: evaluation is the same either way.
Written to benchmarks/RESULTS.md (section "Packed trials on the CPU").
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from datetime import date
from pathlib import Path

import torch
from results_file import publish  # benchmarks/ is on sys.path when run as a script

from ablate.components import dropout_generator
from ablate.study.load import load_study
from ablate.tasks import cpu_streams
from ablate.training.randomness import GlobalStates
from ablate.training.trainer import Trainer

REPO = Path(__file__).resolve().parents[1]
SECTION = "## Packed trials on the CPU"
CPU = torch.device("cpu")


def members(study, data, k: int) -> list[tuple[Trainer, GlobalStates]]:
    built = []
    for seed in range(k):
        trainer = Trainer.start(study, study.variants["base"], seed, data, CPU)
        trainer.model.train()
        built.append((trainer, GlobalStates.capture()))
    return built


def alone(built, data, steps: int) -> float:
    """Seconds for ``steps`` steps of each member, one member after another (every thread)."""
    start = time.perf_counter()
    for trainer, states in built:
        with states.active():
            batches = iter(trainer.batches(data))
            for _ in range(steps):
                trainer.step(next(batches))
    return time.perf_counter() - start


def packed(built, data, steps: int) -> float:
    """Seconds for ``steps`` steps of each member, members at once in single-threaded streams."""
    generators = [states.cpu_generator() for _, states in built]

    def run(index: int) -> None:
        trainer = built[index][0]
        with dropout_generator(generators[index]):
            batches = iter(trainer.batches(data))
            for _ in range(steps):
                trainer.step(next(batches))

    start = time.perf_counter()
    list(cpu_streams(run, range(len(built)), CPU))
    seconds = time.perf_counter() - start
    for (_, states), generator in zip(built, generators, strict=True):
        states.take_cpu(generator)
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", type=int, default=2)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--micro-batches", type=int, default=None, help="default: the study's")
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--note", default="")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    study = load_study(REPO / "studies/sasrec_ml1m.yaml")
    changes = {"precision": args.precision}
    if args.micro_batches is not None:
        changes["micro_batches"] = args.micro_batches
    study.spec = study.spec.model_copy(update={"train": study.spec.train.model_copy(update=changes)})
    data = study.task.load()
    steps_per_epoch = len(
        list(study.task.train_batches(data, study.spec.train.batch_size, torch.Generator()))
    )
    load_before = os.getloadavg()[0]
    built = members(study, data, args.k)
    alone(built, data, 2)  # warm-up: kernels compiled, pools started
    packed(built, data, 2)
    times: dict[str, list[float]] = {"alone": [], "packed": []}
    forms = {"alone": alone, "packed": packed}
    for rep in range(args.reps):
        for name in ("alone", "packed") if rep % 2 == 0 else ("packed", "alone"):
            times[name].append(forms[name](built, data, args.steps))
            print(name, f"{times[name][-1]:.2f} s", file=sys.stderr, flush=True)
    load_after = os.getloadavg()[0]
    member_steps = args.k * args.steps
    rows = []
    for name, label in (("alone", "one after another (trials alone)"), ("packed", "packed, members at once")):
        per = [member_steps / t for t in times[name]]
        epoch = args.k * steps_per_epoch / statistics.median(per)
        each = " / ".join(f"{p:.2f}" for p in per)
        rows.append(f"| {label} | {each} | {statistics.median(per):.2f} | {epoch:.1f} |")
    speed = statistics.median(times["alone"]) / statistics.median(times["packed"])
    micro = study.spec.train.micro_batches
    section = "\n".join(
        [
            SECTION,
            "",
            f"`python benchmarks/packed.py --k {args.k} --steps {args.steps} --reps {args.reps} --threads "
            f"{args.threads}{f' --micro-batches {micro}' if args.micro_batches else ''}` — {date.today()}, "
            f"torch {torch.__version__}, {args.threads} thread(s); SASRec ML-1M (`sasrec_ml1m`, `base`), "
            f"micro_batches {micro}, {args.precision}; {args.k} seeds, {args.steps} steps each a repetition, "
            f"interleaved; {steps_per_epoch} steps an epoch. Load average (1 min) {load_before:.1f} before, "
            f"{load_after:.1f} after. {args.note}".rstrip(),
            "",
            "| how | member-steps/s, by repetition | median | s per epoch of all k seeds |",
            "|---|---|---:|---:|",
            *rows,
            "",
            f"Packed / one after another: **{speed:.2f}×** (median times).",
            "",
        ]
    )
    publish(SECTION, section, write=not args.no_write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

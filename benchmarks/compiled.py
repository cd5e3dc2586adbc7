"""``train.compile`` measured (issue 57): a trial alone's training step of a seqrec study's variant,
eager with the fast paths on (the default), eager with the C kernels' torch forms (what the compiled
graph is traced from), and compiled (``train.compile: default``; ``reduce-overhead`` too on a GPU),
interleaved in one run; the compiled rows' first pass over the timed batches (tracing, inductor's
code generation and C++ compile, a recompile for dynamic shapes) timed apart.

    python benchmarks/compiled.py [--study studies/sasrec_ml1m.yaml] [--variant base]
                                  [--micro-batches 4 1] [--modes default] [--steps 8] [--reps 3]
                                  [--threads 2] [--device cpu|cuda] [--precision fp32|bf16]
                                  [--note "..."] [--no-write]

Each row has a trainer of its own (seed 0), stepping through the same ``steps`` batches (the first
of an epoch, drawn from one throwaway generator) every repetition; rows alternate within a
repetition. Written to benchmarks/RESULTS.md (section "torch.compile of the step (session 43)").
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from results_file import cpu, publish  # benchmarks/ is on sys.path when run as a script

from ablate import fastpaths
from ablate.study.load import load_study
from ablate.training.trainer import Trainer

REPO = Path(__file__).resolve().parents[1]
SECTION = "## torch.compile of the step (session 43)"


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(trainer: Trainer, batches: list, device: torch.device, eager_kernels: bool) -> float:
    """Seconds for one step on each of ``batches``; ``eager_kernels`` False: the C kernels' torch forms."""
    switch = contextlib.nullcontext() if eager_kernels else fastpaths.fast_paths(kernels=False)
    synchronize(device)
    start = time.perf_counter()
    with switch:
        for batch in batches:
            trainer.step(batch)
    synchronize(device)
    return time.perf_counter() - start


def rows_for(study, variant: str, data, micro_batches: int, modes: list[str], device, precision: str):
    """``(name, trainer, eager_kernels)`` for each row at ``micro_batches``."""
    rows = []
    for mode in ["off", "off", *modes]:
        train = study.spec.train.model_copy(
            update={"micro_batches": micro_batches, "compile": mode, "precision": precision}
        )
        study.spec = study.spec.model_copy(update={"train": train})  # a trainer keeps the one it starts with
        trainer = Trainer.start(study, study.variants[variant], 0, data, device)
        name = f"compiled, `{mode}`" if mode != "off" else None
        if name is None:
            name = "eager, fast paths on (default)" if not rows else "eager, C kernels' torch forms"
        rows.append((name, trainer, mode != "off" or not rows))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--study", default="studies/sasrec_ml1m.yaml")
    parser.add_argument("--variant", default="base")
    parser.add_argument("--micro-batches", type=int, nargs="+", default=[4, 1])
    parser.add_argument(
        "--modes", nargs="+", default=None, help="default: default (+ reduce-overhead on CUDA)"
    )
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--note", default="")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    modes = args.modes or (["default", "reduce-overhead"] if device.type == "cuda" else ["default"])
    study = load_study(REPO / args.study)
    data = study.task.load()
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    table = []
    for micro_batches in args.micro_batches:
        drawn = study.task.train_batches(data, study.spec.train.batch_size, torch.Generator().manual_seed(0))
        batches = [b.to(device) for b in itertools.islice(drawn, args.steps)]
        rows = rows_for(study, args.variant, data, micro_batches, modes, device, args.precision)
        first = {}
        for name, trainer, kernels in rows:  # warm-up: a compiled row's first pass compiles
            first[name] = timed(trainer, batches, device, kernels)
            print(f"micro_batches {micro_batches}, {name}: first pass {first[name]:.1f} s", file=sys.stderr)
        times: dict[str, list[float]] = {name: [] for name, *_ in rows}
        for _ in range(args.reps):
            for name, trainer, kernels in rows:
                times[name].append(timed(trainer, batches, device, kernels) / len(batches))
            print(
                f"micro_batches {micro_batches}: "
                + ", ".join(f"{n} {t[-1] * 1000:.0f} ms" for n, t in times.items()),
                file=sys.stderr,
            )
        base = statistics.median(times[rows[0][0]])
        for name, *_ in rows:
            median = statistics.median(times[name])
            compile_s = first[name] - median * len(batches)
            table.append(
                f"| {micro_batches} | {name} | {' / '.join(f'{t * 1000:.0f}' for t in times[name])} | "
                f"{median * 1000:.0f} | {base / median:.2f}× | {first[name]:.1f} | "
                + (f"{compile_s:.1f} |" if "compiled" in name else "— |")
            )
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu()
    section = "\n".join(
        [
            SECTION,
            "",
            f"`python benchmarks/compiled.py --study {args.study} --variant {args.variant} --micro-batches "
            f"{' '.join(map(str, args.micro_batches))} --modes {' '.join(modes)} --steps {args.steps} "
            f"--reps {args.reps} --threads {args.threads} --device {args.device} --precision "
            f"{args.precision}` — {time.strftime('%Y-%m-%d')}, {where}, torch {torch.__version__}, "
            f"{args.threads} thread(s); a trial alone's step (`Trainer.step`, batches of "
            f"{study.spec.train.batch_size}), {args.steps} steps a repetition; "
            f"{time.perf_counter() - started:.0f} s in all. Load average (1 min) {load_before:.1f} before, "
            f"{os.getloadavg()[0]:.1f} after. {args.note}".rstrip(),
            "",
            "| micro_batches | step | ms per step, by repetition | median ms | × eager default | "
            "first pass s | of it compiling, s |",
            "|---:|---|---|---:|---:|---:|---:|",
            *table,
            "",
        ]
    )
    publish(SECTION, section, write=not args.no_write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Trials per GPU: epoch time, tokens/s, peak GPU memory and seeds per hour of the ML-1M
studies' configurations, one trial at a time vs k trials at once on one GPU.

    python benchmarks/gpu.py [--configs sasrec hstu fuxi] [--k 1 2 4 8] [--steps 100] [--warmup 10]
                             [--precision auto|fp32|bf16] [--gpu 0] [--packed | --packed-only]
                             [--override KEY=VALUE ...] [--note "..."] [--no-write]

Each of the k trials is its own process, as ``ablate run --gpus`` starts them, running the trial's
own training loop (the study's batches, model, loss parts, optimiser and precision: ``train.precision``
``auto`` is bf16 autocast on CUDA) for ``--warmup`` steps, then ``--steps`` timed steps; the k
processes start their timed steps together (they wait on a file) so the GPU is shared throughout.
Configurations: SASRec as ``studies/sasrec_ml1m.yaml`` (ML-1M in SASRec's format, BCE with 1
negative), HSTU and FuXi-α as the ``hstu`` and ``fuxi-alpha`` variants of
``studies/hstu_fuxi_ml1m.yaml`` (ML-1M users 1–2999, sampled softmax over 128 negatives).

Per row: step time (mean over the k trials), epoch time (step × steps per epoch), tokens/s per
trial and for all k, peak memory per trial (torch's allocator: allocated / reserved), GPU memory
in use device-wide at the end (every process's context included), and seeds per hour =
k × 3600 / (epoch s × the study's epochs): training only, evaluation and early stopping left
out, so the ratio to one trial at a time (the last column) is the figure to read.

With ``--packed`` each k > 1 is timed a second way: one process training seeds 0..k-1 as one pack
(:mod:`ablate.training.packed`, as ``train.pack: k`` trains them: on a GPU their steps stacked,
one ``vmap`` forward for all, :mod:`ablate.training.stacked`; on the CPU in streams or turns). The
row says how the pack stepped; ``--packed-only`` times each k > 1 as a pack only.

``--override`` sets study keys for every trial of the call, as ``ablate run``'s overrides do, e.g.
``train.compile=reduce-overhead`` (the step's forward compiled and replayed as CUDA graphs:
"packed + graphs" with ``--packed-only``; :mod:`ablate.training.compiled`) with
``train.micro_batches=1`` (each part's width is a shape of its own, and CUDA graphs are recorded
per shape). A compiled trial compiles in its warm-up: give it an epoch's steps (SASRec: 48), so
that the last batch's shape is met there too. The rows say what was set.

Written to benchmarks/RESULTS.md (section "GPU: trials per GPU") with the device's name. Without
CUDA it prints one line and exits with status 2, measuring nothing; ``--device cpu`` runs the
same machinery on the CPU to check the script (never written to RESULTS.md).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from types import SimpleNamespace

import torch
from results_file import write_section  # benchmarks/ is on sys.path when run as a script

from ablate.components import dropout_generator
from ablate.study.load import Study, load_study
from ablate.tasks import cpu_streams
from ablate.training import stacked
from ablate.training.memory import PeakMemory
from ablate.training.randomness import GlobalStates
from ablate.training.trainer import Trainer, trains_in_bf16

REPO = Path(__file__).resolve().parents[1]
SECTION = "## GPU: trials per GPU"


@dataclass(frozen=True)
class Config:
    label: str
    study: Path
    variant: str


CONFIGS = {
    "sasrec": Config("SASRec, ML-1M SASRec format, BCE 1 neg", REPO / "studies/sasrec_ml1m.yaml", "base"),
    "hstu": Config(
        "HSTU, ML-1M users 1–2999, sampled softmax 128", REPO / "studies/hstu_fuxi_ml1m.yaml", "hstu"
    ),
    "fuxi": Config(
        "FuXi-α, ML-1M users 1–2999, sampled softmax 128", REPO / "studies/hstu_fuxi_ml1m.yaml", "fuxi-alpha"
    ),
}
NO_CUDA = "benchmarks/gpu.py: no CUDA device here (torch {version}); nothing measured"


def load(config: Config, precision: str | None, overrides: list[str] = ()) -> Study:
    precisions = [f"train.precision={precision}"] if precision else []
    return load_study(config.study, overrides=[*overrides, *precisions])


def train_steps(
    study: Study, variant: str, steps: int, warmup: int, device: torch.device, seed: int = 0, wait=None
) -> dict:
    """One trial's training loop (as :func:`ablate.training.trainer.train_trial` steps it) for ``warmup``
    then ``steps`` timed steps, epochs repeating as needed; ``wait()`` is called between the two."""
    task, train = study.task, study.spec.train
    data = task.load()
    trainer = Trainer.start(study, study.variants[variant], seed, data, device)
    steps_per_epoch = len(list(task.train_batches(data, train.batch_size, torch.Generator().manual_seed(0))))

    def batches():
        while True:
            yield from trainer.batches(data)

    def step(batch) -> int:
        before = trainer.tokens
        trainer.step(batch)
        return trainer.tokens - before

    trainer.model.train()
    feed = batches()
    for _ in range(warmup):
        step(next(feed))
    if wait is not None:
        wait()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    with PeakMemory(device) as memory:  # on CUDA: the allocator's peak, reset here
        sync()
        start, tokens = time.perf_counter(), 0
        for _ in range(steps):
            tokens += step(next(feed))
        sync()
        seconds = time.perf_counter() - start
    row = {
        "step_s": seconds / steps,
        "tokens_per_s": tokens / seconds,
        "peak_mb": memory.mb,
        "steps_per_epoch": steps_per_epoch,
        "epochs": train.epochs,
        "precision": "bf16" if trains_in_bf16(train.precision, device) else "fp32",
    }
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        row |= {
            "reserved_mb": torch.cuda.max_memory_reserved(device) / 2**20,
            "used_mb": (total - free) / 2**20,
            "device": torch.cuda.get_device_name(device),
        }
    return row


def packed_steps(
    study: Study, variant: str, k: int, steps: int, warmup: int, device: torch.device, wait=None
) -> dict:
    """Seeds 0..k-1 of ``variant`` as one pack (:mod:`ablate.training.packed`: each member's global
    random states swapped in around its steps; on a GPU the members' steps stacked where the model
    stacks, on a CPU with several threads at once, one single-threaded stream each, else in turns)
    for ``warmup`` then ``steps`` timed lockstep steps; ``step_s`` is one lockstep step of all k
    members."""
    task, train = study.task, study.spec.train
    data = task.load()
    members = []
    for seed in range(k):
        trainer = Trainer.start(study, study.variants[variant], seed, data, device)
        trainer.model.train()
        members.append((trainer, GlobalStates.capture(), _endless(trainer, data)))
    in_threads = device.type == "cpu" and torch.get_num_threads() > 1 and k > 1
    stacker, why = (
        (None, "on the CPU")
        if device.type == "cpu" or k < 2
        else stacked.stacker(SimpleNamespace(study=study, trainer=members[0][0], data=data, device=device))
    )
    runs = [SimpleNamespace(trainer=t, study=study, device=device) for t, _, _ in members]

    def lockstep() -> int:
        before = sum(t.tokens for t, _, _ in members)
        if stacker is not None:
            batches = [next(feed).to(device) for _, _, feed in members]
            for result in stacker.step(runs, [states for _, states, _ in members], batches):
                if isinstance(result, Exception):
                    raise result
        elif in_threads:
            generators = [states.cpu_generator() for _, states, _ in members]

            def one(index: int) -> None:
                trainer, _, feed = members[index]
                with dropout_generator(generators[index]):
                    trainer.step(next(feed))

            list(cpu_streams(one, range(k), device))
            for (_, states, _), generator in zip(members, generators, strict=True):
                states.take_cpu(generator)
        else:
            for trainer, states, feed in members:
                with states.active():
                    trainer.step(next(feed))
        return sum(t.tokens for t, _, _ in members) - before

    for _ in range(warmup):
        lockstep()
    if wait is not None:
        wait()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    with PeakMemory(device) as memory:
        sync()
        start, tokens = time.perf_counter(), 0
        for _ in range(steps):
            tokens += lockstep()
        sync()
        seconds = time.perf_counter() - start
    steps_per_epoch = len(list(task.train_batches(data, train.batch_size, torch.Generator().manual_seed(0))))
    row = {
        "step_s": seconds / steps,
        "tokens_per_s": tokens / seconds / k,
        "peak_mb": memory.mb / k,
        "steps_per_epoch": steps_per_epoch,
        "epochs": train.epochs,
        "precision": "bf16" if trains_in_bf16(train.precision, device) else "fp32",
        "stepped": (
            f"stacked ({stacker.steps['stacked']} stacked, {stacker.steps['in turns']} in turns)"
            if stacker is not None
            else ("streams" if in_threads else "turns")
            + (f": not stacked, {why}" if device.type != "cpu" else "")
        ),
    }
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        row |= {
            "reserved_mb": torch.cuda.max_memory_reserved(device) / 2**20 / k,
            "used_mb": (total - free) / 2**20,
            "device": torch.cuda.get_device_name(device),
        }
    return row


def _endless(trainer: Trainer, data):
    while True:
        yield from trainer.batches(data)


def wait_for(path: Path, timeout_s: float = 600.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {path.name} after {timeout_s:.0f} s")
        time.sleep(0.01)


def child(args: argparse.Namespace) -> None:
    """One of the k trial processes: set up, warm up, say ready, wait for go, time, print JSON."""
    barrier = Path(args.barrier)

    def ready_then_go():
        (barrier / f"ready-{args.seed}").touch()
        wait_for(barrier / "go")

    config = config_of(args)
    study = load(config, args.precision, args.override)
    device = torch.device(args.device)
    if args.pack > 1:
        row = packed_steps(study, config.variant, args.pack, args.steps, args.warmup, device, ready_then_go)
    else:
        row = train_steps(study, config.variant, args.steps, args.warmup, device, args.seed, ready_then_go)
    print(json.dumps(row), flush=True)


def config_of(args: argparse.Namespace) -> Config:
    if args.study:
        return Config(Path(args.study).stem, Path(args.study), args.variant)
    return CONFIGS[args.child]


def together(
    name: str,
    k: int,
    steps: int,
    warmup: int,
    device: str = "cuda",
    precision: str | None = None,
    gpu: str = "0",
    study: Path | None = None,
    variant: str = "base",
    packed: bool = False,
    overrides: list[str] = (),
) -> dict:
    """k trial processes of configuration ``name`` (or ``study``'s ``variant``) at once on one GPU
    (``device cpu``: on the CPU, to check the machinery), or with ``packed`` one process training
    the k seeds as one pack; the row of the table."""
    processes, pack = (1, k) if packed else (k, 1)
    with tempfile.TemporaryDirectory() as folder:
        barrier = Path(folder)
        cmd = [sys.executable, __file__, "--child", name, "--steps", str(steps), "--warmup", str(warmup)]
        cmd += ["--device", device, "--barrier", folder, "--pack", str(pack)]
        cmd += ["--precision", precision] if precision else []
        cmd += ["--study", str(study), "--variant", variant] if study else []
        cmd += [f"--override={override}" for override in overrides]
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpu}
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // processes)))
        procs = [
            subprocess.Popen([*cmd, "--seed", str(seed)], env=env, stdout=subprocess.PIPE, text=True)
            for seed in range(processes)
        ]
        try:
            while len(list(barrier.glob("ready-*"))) < processes:
                if any(p.poll() is not None for p in procs):
                    raise RuntimeError(f"{name} × {k}: a trial process exited before it was ready")
                time.sleep(0.05)
            (barrier / "go").touch()
            outputs = [p.communicate()[0] for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
    if any(p.returncode for p in procs):
        raise RuntimeError(f"{name} × {k}: trial processes exited with {[p.returncode for p in procs]}")
    rows = [json.loads(o.strip().splitlines()[-1]) for o in outputs]
    # A pack's one row stands for each of its k members (step_s: one lockstep step of them all).
    how = {"how": "packed", "stepped": rows[0]["stepped"]} if packed else {"how": "processes"}
    return {**summarise(name, k, rows * k if packed else rows), **how, "set": ", ".join(overrides)}


def summarise(name: str, k: int, trials: list[dict]) -> dict:
    """One table row from the k trials' own measurements."""
    step_s = sum(t["step_s"] for t in trials) / k
    epoch_s = step_s * trials[0]["steps_per_epoch"]
    return {
        "config": name,
        "k": k,
        "step_s": step_s,
        "epoch_s": epoch_s,
        "tokens_per_s": sum(t["tokens_per_s"] for t in trials) / k,
        "tokens_per_s_all": sum(t["tokens_per_s"] for t in trials),
        "peak_mb": max(t["peak_mb"] for t in trials),
        "reserved_mb": max(t.get("reserved_mb", 0.0) for t in trials),
        "used_mb": max(t.get("used_mb", 0.0) for t in trials),
        "seeds_per_hour": k * 3600 / (epoch_s * trials[0]["epochs"]),
        "precision": trials[0]["precision"],
        "device": trials[0].get("device", "cpu"),
    }


def with_speedups(rows: list[dict]) -> list[dict]:
    """Each row's seeds per hour over its configuration's one-at-a-time row (None without one)."""
    alone = {r["config"]: r["seeds_per_hour"] for r in rows if r["k"] == 1 and r.get("how") != "packed"}
    return [
        {**r, "speedup": r["seeds_per_hour"] / alone[r["config"]] if r["config"] in alone else None}
        for r in rows
    ]


def table(rows: list[dict], steps: int, warmup: int, note: str = "") -> str:
    device = rows[0]["device"] if rows else "?"
    out = [
        SECTION,
        "",
        f"`python benchmarks/gpu.py` — {date.today()}, {device}, torch {torch.__version__}; each trial "
        f"its own process, {warmup} warm-up then {steps} timed steps, k processes timed together on one "
        f"GPU; epoch = step × steps per epoch; seeds/hour = k × 3600 / (epoch s × the study's epochs), "
        f"training only; peak = torch's allocator per trial (allocated / reserved); GPU used = device-wide "
        f"at the end."
        f"{(' ' + note) if note else ''}",
        "",
        "| config | precision | how | trials at once | step ms | epoch s | tokens/s per trial | tokens/s all "
        "| peak MiB (alloc / reserved) | GPU used MiB | seeds/hour | × one at a time |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in with_speedups(rows):
        speedup = f"{r['speedup']:.2f}×" if r["speedup"] is not None else "—"
        how = f"one pack, {r['stepped']}" if r.get("how") == "packed" else "processes"
        how += f"; {r['set']}" if r.get("set") else ""
        out.append(
            f"| {CONFIGS[r['config']].label if r['config'] in CONFIGS else r['config']} | {r['precision']} "
            f"| {how} | {r['k']} | {r['step_s'] * 1e3:.1f} | {r['epoch_s']:.2f} | {r['tokens_per_s']:,.0f} "
            f"| {r['tokens_per_s_all']:,.0f} | {r['peak_mb']:,.0f} / {r['reserved_mb']:,.0f} "
            f"| {r['used_mb']:,.0f} | {r['seeds_per_hour']:.1f} | {speedup} |"
        )
    return "\n".join([*out, ""])


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS))
    p.add_argument("--k", nargs="+", type=int, default=[1, 2, 4, 8], help="trials at once on the GPU")
    p.add_argument("--steps", type=int, default=100, help="timed training steps per trial")
    p.add_argument("--warmup", type=int, default=10, help="untimed steps first (CUDA kernels, allocator)")
    p.add_argument(
        "--precision", choices=["auto", "fp32", "bf16"], help="train.precision (default: the study's)"
    )
    p.add_argument("--gpu", default="0", help="the GPU, as CUDA_VISIBLE_DEVICES names it")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu: check the script only")
    p.add_argument("--study", type=Path, help="time this study file's --variant instead of --configs")
    p.add_argument("--variant", default="base")
    p.add_argument("--note", default="", help="what else was running, for the record")
    p.add_argument("--no-write", action="store_true")
    p.add_argument(
        "--packed",
        action="store_true",
        help="also time each k > 1 as one process training the k seeds as a pack",
    )
    p.add_argument("--packed-only", action="store_true", help="time each k > 1 as a pack only")
    p.add_argument("--override", action="append", default=[], help="KEY=VALUE set in every trial's study")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--pack", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--barrier", help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.child:
        child(args)
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        print(NO_CUDA.format(version=torch.__version__))
        return 2
    names = [args.study.stem] if args.study else args.configs
    rows = []
    for name in names:
        for k in args.k:
            packs = [True] if args.packed_only else [False, True] if args.packed else [False]
            for packed in packs if k > 1 else [False]:
                settings = (args.device, args.precision, args.gpu, args.study, args.variant, packed)
                row = together(name, k, args.steps, args.warmup, *settings, args.override)
                rows.append(row)
                print({key: round(v, 4) if isinstance(v, float) else v for key, v in row.items()}, flush=True)
    section = table(rows, args.steps, args.warmup, args.note)
    print(section)
    if args.device == "cuda" and not args.study and not args.no_write:
        write_section(SECTION, section)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Training and evaluation speed of the seqrec task on ML-1M.

    python benchmarks/seqrec.py [--epochs 1] [--max-steps 0] [--note "..."] [--no-write]

Measures, with the studies' own code path (task batches → model → loss → Adam step):

* SASRec (published config, BCE with 1 negative) on ML-1M in SASRec's format (6,040 users,
  48 steps of 128 per epoch — the same job as SASRec.pytorch's 21.6 s/epoch in ANCHORS.md),
  for every combination of layout (padded, jagged via fbgemm, jagged via pure torch) and batch
  order (plain shuffle; the same cut into 4 length-sorted micro-batches; length_pool 8);
* SASRec / HSTU / FuXi-α in the HSTU code base's ML-1M setting (sampled softmax over 128
  negatives, cosine similarity) on the timestamped users 1–2999 (24 steps per epoch);
* full-ranking evaluation of all 6,040 users × 3,416 items (forward + scores + ranks + metrics);
* the package's CPU kernels against torch's (column "CPU kernels"): dropout masks from 16-bit
  lanes of 64-bit draws vs ``torch.bernoulli``, per-position negatives' logits from one matmul vs
  gathered vectors — same model, same step, side by side in one run.

Epoch time is training only (no evaluation); tokens/s counts real target tokens. Peak memory
is resident-set growth during the epoch. Results are printed and written to
benchmarks/RESULTS.md (section "Sequential recommendation"). The machine is shared: the load
average before and after is recorded with the table; compare ratios within one run.
"""

from __future__ import annotations

import argparse
import os
import time
from contextlib import contextmanager
from datetime import date
from pathlib import Path

import torch
from results_file import cpu, write_section  # benchmarks/ is on sys.path when run as a script
from torch.utils.flop_counter import FlopCounterMode

from ablate.fastpaths import fast_paths
from ablate.jagged import last_of_rows
from ablate.model.build import build_backbone, count_parameters
from ablate.study.load import load_study
from ablate.training.memory import PeakMemory
from ablate.training.trainer import Trainer
from ablate_plugins.seqrec import evaluation

REPO = Path(__file__).resolve().parents[1]
SECTION = "## Sequential recommendation"
SASREC = REPO / "studies/sasrec_ml1m.yaml"
HSTU_FUXI = REPO / "studies/hstu_fuxi_ml1m.yaml"


def load(path: Path, micro_batches: int | None = None, **task_options):
    """The study at ``path`` with ``task_options`` replaced, and ``train.micro_batches`` where given."""
    study = load_study(path)
    study.task.options = study.task.options.model_copy(update=task_options)
    if micro_batches is not None:
        study.spec = with_training(study.spec, micro_batches=micro_batches)
    return study


def with_training(spec, **changes):
    """``spec`` (a StudySpec) with ``train:`` options changed."""
    return spec.model_copy(update={"train": spec.train.model_copy(update=changes)})


def epoch(study, variant: str, data, epochs: int, max_steps: int, precision: str = "fp32") -> dict:
    """Train ``epochs`` epochs (or ``max_steps`` steps) of ``variant`` in ``precision``
    (``train.precision``) as a trial steps them (:class:`ablate.training.trainer.Trainer`, seed 0); time and
    tokens."""
    task = study.task
    study.spec = with_training(study.spec, precision=precision)
    trainer = Trainer.start(study, study.variants[variant], 0, data, torch.device("cpu"))
    model, train = trainer.model, study.spec.train
    steps = padded = 0
    micro = train.micro_batches
    model.train()
    with PeakMemory(torch.device("cpu")) as memory:
        start = time.perf_counter()
        for _ in range(epochs):
            for batch in trainer.batches(data):
                trainer.step(batch)
                steps += 1
                groups = [g for g, _ in task.split_batch(model, batch, micro)] if micro > 1 else [batch]
                padded += sum(g.items.numel() for g in groups)
                if max_steps and steps >= max_steps:
                    break
            if max_steps and steps >= max_steps:
                break
        seconds = time.perf_counter() - start
    per_step = seconds / steps
    flops = step_flops(trainer, data, steps)
    steps_per_epoch = len(list(task.train_batches(data, train.batch_size, torch.Generator().manual_seed(0))))
    return {
        "model": model,
        "params": count_parameters(model),
        "pool": task.options.length_pool,
        "micro": micro,
        "steps": steps,
        "step_s": per_step,
        "epoch_s": per_step * steps_per_epoch,
        "tokens_per_s": trainer.tokens / seconds,
        "padding": padded / trainer.tokens,
        "peak_mb": memory.mb,
        "gflop_step": flops / 1e9,
        "gflops": flops / 1e9 / per_step,
    }


def step_flops(trainer, data, steps: int) -> float:
    """Matrix-multiply FLOPs per training step (forward and backward, as executed: padding and the
    masked half of causal attention included), counted by torch's FlopCounterMode over the same
    ``steps`` batches the timing ran (from a fresh generator of the same seed). One torch thread
    here: the mode counts the ops of its own thread only, and parallel loss parts would run theirs
    in other threads (same ops either way)."""
    trainer.generator.manual_seed(0)
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with FlopCounterMode(display=False) as counter:
            for _, batch in zip(range(steps), trainer.batches(data), strict=False):
                trainer.step(batch)
    finally:
        torch.set_num_threads(saved)
    trainer.model.zero_grad(set_to_none=True)
    return counter.get_total_flops() / steps


def machine_peak(dtype: torch.dtype, size: int = 2048, reps: int = 5) -> float:
    """GFLOP/s of a large square matmul at the current thread count (median of ``reps``): the
    roofline's compute ceiling as this machine reaches it, not a data-sheet figure."""
    a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
    torch.mm(a, b)
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        torch.mm(a, b)
        times.append(time.perf_counter() - start)
    return 2 * size**3 / sorted(times)[reps // 2] / 1e9


def evaluation_time(study, model, data, reps: int = 5) -> dict[str, float]:
    """Median seconds of one full-ranking test evaluation over every user: as the task runs it
    (batches of the CPU default, one single-threaded stream of batches per torch thread, the
    final block computing each user's last token only), with the split's batches kept from an
    earlier evaluation and made anew; one stream using every thread in batches
    of 128 (the path before session 8, 2026-11-22) and of 512 (before session 7); the task's
    path computing the whole final block and picking the last token afterwards. Interleaved, so
    load affects all alike."""
    plain_forward = model.forward

    def whole_final_block(batch, last_only=False):
        hidden = plain_forward(batch)
        return last_of_rows(hidden, batch.lengths) if last_only else hidden

    def one_stream(work, items, device):
        return map(work, items)

    rows = study.spec.train.eval_rows(torch.device("cpu"))
    paths = {
        "task": (plain_forward, rows, evaluation.cpu_streams),
        "task_first": (plain_forward, rows, evaluation.cpu_streams),
        "one_stream_128": (plain_forward, 128, one_stream),
        "one_stream_512": (plain_forward, 512, one_stream),
        "whole_block": (whole_final_block, rows, evaluation.cpu_streams),
    }
    times = {name: [] for name in paths}
    streams = evaluation.cpu_streams
    try:
        for _ in range(reps):
            for name, (forward, batch_size, schedule) in paths.items():
                model.forward, evaluation.cpu_streams = forward, schedule
                if name == "task_first":  # a split's first evaluation makes its batches
                    data.batch_cache.clear()
                start = time.perf_counter()
                study.task.evaluate(
                    model, data, "test", ["full.ndcg@10", "full.hr@10"], torch.device("cpu"), batch_size
                )
                times[name].append(time.perf_counter() - start)
    finally:
        model.forward, evaluation.cpu_streams = plain_forward, streams
    return {name: sorted(t)[len(t) // 2] for name, t in times.items()} | {"rows": rows}


KERNELS = ("ablate", "ablate, unfused", "torch")


@contextmanager
def cpu_kernels(kind: str):
    """``ablate``: the package's CPU paths (the fused C kernels: dropout, causal softmax-dropout,
    per-position negatives' logits reading the table in place); ``ablate, unfused``: torch ops
    where a kernel would run, as without a C compiler (the same dropout draws; negatives' logits
    from one matmul on small catalogues); ``torch``: torch's dropout and gathered negatives."""
    plain = kind == "torch"
    with fast_paths(kernels=kind == "ablate", lanes=not plain, dense=not plain):
        yield


def run(epochs: int, max_steps: int) -> tuple[list[dict], dict]:
    rows = []
    layouts = {
        "padded": {"jagged": False},
        "jagged (fbgemm)": {"jagged": True},
        "jagged (torch)": {"jagged": True, "fbgemm": False},
    }
    sasrec = {"config": "SASRec, BCE 1 neg", "data": "ML-1M SASRec format"}
    model_for_eval = None
    # (length_pool, micro_batches): plain shuffled batches, the same cut into 4 length-sorted groups
    # (same loss), and length-pooled batches (a different objective, see the README).
    for pool, micro in ((1, 1), (1, 4), (8, 1)):
        for name, layout in layouts.items():
            with fast_paths(fbgemm=layout.get("fbgemm", True)):
                study = load(SASREC, jagged=layout["jagged"], length_pool=pool, micro_batches=micro)
                data = study.task.load()
                result = epoch(study, "base", data, epochs, max_steps)
            rows.append({**sasrec, "layout": name, "precision": "fp32", "kernels": "ablate", **result})
            print(
                rows[-1]["config"],
                name,
                pool,
                micro,
                {k: v for k, v in result.items() if k != "model"},
                flush=True,
            )
            if name == "padded" and (pool, micro) == (1, 1):
                model_for_eval, eval_study, eval_data = result["model"], study, data
    # The study's own layout with torch's CPU dropout (the ratio the lane masks buy), and in bf16
    # autocast (AMX on this CPU): `train.precision: bf16`.
    for precision, kind, micro in (
        ("fp32", "torch", 1),
        ("fp32", "ablate, unfused", 4),
        ("bf16", "ablate", 1),
        ("bf16", "ablate", 4),
    ):
        study = load(SASREC, micro_batches=micro)
        with cpu_kernels(kind):
            result = epoch(study, "base", study.task.load(), epochs, max_steps, precision)
        rows.append({**sasrec, "layout": "padded", "precision": precision, "kernels": kind, **result})
        print(
            "SASRec",
            precision,
            rows[-1]["kernels"],
            {k: v for k, v in result.items() if k != "model"},
            flush=True,
        )
    for variant, label in (("base", "SASRec"), ("hstu", "HSTU"), ("fuxi-alpha", "FuXi-α")):
        # The study's configuration (micro_batches 4) with both kernel sets, and plain batches.
        for kind, micro in (("ablate", None), ("torch", None), ("ablate", 1)):
            study = load(HSTU_FUXI) if micro is None else load(HSTU_FUXI, micro_batches=micro)
            data = study.task.load()
            with cpu_kernels(kind):
                result = epoch(study, variant, data, epochs, max_steps)
            rows.append(
                {
                    "config": f"{label}, sampled softmax 128",
                    "data": "ML-1M users 1–2999",
                    "layout": "jagged (fbgemm)",
                    "precision": "fp32",
                    "kernels": kind,
                    **result,
                }
            )
            print(label, rows[-1]["kernels"], {k: v for k, v in result.items() if k != "model"}, flush=True)
    timed = {
        "peak_fp32": machine_peak(torch.float32),
        "peak_bf16": machine_peak(torch.bfloat16),
        **evaluation_time(eval_study, model_for_eval, eval_data),
        "users": eval_data.num_users,
        "items": eval_data.num_items,
    }
    print("evaluation", timed, flush=True)
    return rows, timed


def table(rows: list[dict], timed: dict, epochs: int, max_steps: int, loads: tuple, note: str) -> str:
    measured = f"{max_steps} steps, extrapolated to an epoch" if max_steps else f"{epochs} epoch(s)"
    out = [
        SECTION,
        "",
        f"`python benchmarks/seqrec.py` — {date.today()}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} CPU threads ({cpu()}); "
        f"{measured} of "
        f"training per row (Adam step included, evaluation excluded); tokens/s counts real target tokens; "
        f"padding = padded / real tokens; peak = resident-set growth; CPU kernels: `ablate` = the fused C "
        f"kernels (dropout, causal softmax + dropout, counter-based draws; per-position negatives' logits "
        f"reading the table in place), `ablate, unfused` = torch ops in their place (no C compiler: the "
        f"same draws, negatives' logits from one matmul), "
        f"`torch` = torch's dropout and gathered negatives (the code before 2026-11-22's session 5). "
        f"Load average (1 min) "
        f"{loads[0]:.1f} before, {loads[1]:.1f} after.{(' ' + note) if note else ''}",
        "",
        "| config | data | layout | length_pool | micro_batches | precision | CPU kernels | step s | epoch s "
        "| tokens/s | padding | peak MB | params | GFLOP/step | GFLOP/s | of peak |",
        "|---|---|---|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        out.append(
            f"| {r['config']} | {r['data']} | {r['layout']} | {r['pool']} | {r['micro']} "
            f"| {r['precision']} | "
            f"{r['kernels']} | {r['step_s']:.3f} | "
            f"{r['epoch_s']:.1f} | {r['tokens_per_s']:,.0f} | {r['padding']:.2f} | {r['peak_mb']:.0f} | "
            f"{r['params']:,} | {r['gflop_step']:.1f} | {r['gflops']:.1f} "
            f"| {r['gflops'] / timed['peak_' + r['precision']]:.0%} |"
        )
    out += [
        "",
        f"Roofline: GFLOP/step counts the matrix multiplies of one training step as executed (torch's "
        f"FlopCounterMode: forward and backward, padding and the masked half of causal attention "
        f"included); GFLOP/s = that over the step time; the peak is this machine's rate on a "
        f"2048 × 2048 matmul at the same thread count, measured in the same run: "
        f"**{timed['peak_fp32']:.0f} GFLOP/s fp32, {timed['peak_bf16']:.0f} GFLOP/s bf16 (AMX)**.",
        "",
        f"Full-ranking evaluation of all {timed['users']:,} users × {timed['items']:,} items "
        f"(forward, scores, history exclusion, ranks, HR@10 / NDCG@10; median of 5, interleaved): "
        f"**{timed['task']:.2f} s** as the task runs it ({timed['rows']} users per batch, one "
        f"single-threaded stream of batches per thread, the final block computing each user's last "
        f"token only; batches kept from the split's previous evaluation, "
        f"{timed['task_first']:.2f} s at its first); one two-threaded stream: "
        f"{timed['one_stream_128']:.2f} s in batches of "
        f"128, {timed['one_stream_512']:.2f} s in batches of 512; the whole final block computed: "
        f"{timed['whole_block']:.2f} s (target ≤ 1 s).",
        "",
    ]
    return "\n".join(out)


def write(section: str) -> None:
    write_section(SECTION, section)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument(
        "--max-steps", type=int, default=0, help="time this many steps per row, not whole epochs"
    )
    parser.add_argument("--note", default="", help="what else was running, for the record")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument(
        "--eval-only",
        action="store_true",
        help="time only the full-ranking evaluation (untrained model); prints, writes nothing",
    )
    args = parser.parse_args()
    if args.eval_only:
        study = load(SASREC)
        data = study.task.load()
        spec = study.variants["base"]
        ctx = study.build_context(spec, study.task.max_len(data))
        torch.manual_seed(0)
        model = study.task.build_model(build_backbone(spec, ctx), ctx, data)
        print({**evaluation_time(study, model, data), "users": data.num_users, "items": data.num_items})
        return
    before = os.getloadavg()[0]
    rows, timed = run(args.epochs, args.max_steps)
    section = table(rows, timed, args.epochs, args.max_steps, (before, os.getloadavg()[0]), args.note)
    print(section)
    if not args.no_write:
        write(section)


if __name__ == "__main__":
    main()

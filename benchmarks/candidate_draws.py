"""What the sampled protocol's fixed candidates do to one trained model's test metric: one trial
trained as its study trains it, then its test split ranked again against freshly drawn candidates.

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/candidate_draws.py \
        [--study studies/tisasrec_ml1m.yaml] [--variant tisasrec] [--seed 0] [--draws 20] \
        [--set KEY=VALUE] [--no-write]

Ablate draws the sampled protocol's 100 negatives per user once per split, with fixed seeds, so
every epoch, seed and variant is ranked against the same candidates. The published trainers
(SASRec's, TiSASRec's) draw them afresh at every evaluation. Both are uniform draws from the same
items (here: the user's unrated ones), so the expected metric is the same; what a fresh draw adds is
the spread of one draw. This measures it on a real model: the trial is trained with
:func:`ablate.training.trainer.train_trial` (the run's own loop and best-validation selection; its test metric
with the fixed candidates must equal the committed trial's where the study has trial files), then
its final test evaluation is repeated ``--draws`` times, each against candidates drawn with another
seed. Prints the fixed draw's value, the fresh draws' mean, sd and range, and where the fixed draw
falls among them; writes the section "Fixed vs fresh candidates" of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import gzip
import importlib
import json
import time
from datetime import date
from pathlib import Path

import numpy as np
import torch
from results_file import write_section  # benchmarks/ is on sys.path when run as a script

from ablate.study.load import load_study
from ablate.training.trainer import train_trial

REPO = Path(__file__).resolve().parents[1]
SECTION = "## Fixed vs fresh candidates (sampled protocol)"
FIRST_FRESH_SEED = 1  # the fresh draws' seeds: 1 … draws (the fixed ones are 20180821 / 20180822)


def committed_value(study_path: Path, variant: str, seed: int, metric: str) -> float | None:
    """The committed trial file's test metric for this (variant, seed), where the report has one."""
    folder = REPO / "reports" / study_path.stem / "trials"
    for path in sorted(folder.glob(f"{variant}-seed{seed}-*.trial.json.gz")):
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            return json.load(handle)["final"][f"test.{metric}"]
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--study", type=Path, default=REPO / "studies" / "tisasrec_ml1m.yaml")
    parser.add_argument("--variant", default="tisasrec")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--draws", type=int, default=20)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a study override")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md as it is")
    args = parser.parse_args()

    study = load_study(args.study, overrides=args.set)
    task, metrics = study.task, study.metrics
    data = task.load()
    fixed = task.negatives(data, "test")
    fresh: list[dict[str, float]] = []
    evaluate = task.evaluate

    def evaluate_and_redraw(model, data, split, metrics, device, batch_size):
        """The trial's own evaluation; after its test evaluation, the same model on fresh draws."""
        result = evaluate(model, data, split, metrics, device, batch_size)
        if split == "test":
            for draw in range(FIRST_FRESH_SEED, FIRST_FRESH_SEED + args.draws):
                task._negatives["test"] = (data, draw_for(task, data, draw))
                fresh.append(evaluate(model, data, split, metrics, device, batch_size).summary)
            task._negatives["test"] = (data, fixed)
        return result

    task.evaluate = evaluate_and_redraw  # this instance only: the run's own code does the rest
    start = time.perf_counter()
    result = train_trial(study, study.variants[args.variant], args.seed, data, torch.device("cpu"))
    wall = time.perf_counter() - start

    lines = [
        SECTION,
        "",
        f"`{args.study.relative_to(REPO) if args.study.is_relative_to(REPO) else args.study}`, variant "
        f"`{args.variant}`, seed {args.seed}: trained {result.epochs} epochs (best validation at "
        f"{result.best_epoch}) in {wall:.0f} s; its test split ranked against the fixed candidates "
        f"and against {args.draws} fresh draws "
        f"(seeds {FIRST_FRESH_SEED}–{FIRST_FRESH_SEED + args.draws - 1}) "
        f"of {task.options.sampled_negatives} unrated items per user. {date.today().isoformat()}.",
        "",
        "| metric | fixed draw | committed trial | fresh draws: mean ± sd | min – max "
        "| fixed − mean (in sd) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for metric in metrics:
        ours = result.summary[f"test.{metric}"]
        values = np.array([summary[metric] for summary in fresh])
        mean, sd = values.mean(), values.std(ddof=1)
        committed = None if args.set else committed_value(args.study, args.variant, args.seed, metric)
        lines.append(
            f"| {metric} | {ours:.4f} | {'—' if committed is None else f'{committed:.4f}'} | "
            f"{mean:.4f} ± {sd:.4f} | {values.min():.4f} – {values.max():.4f} | "
            f"{ours - mean:+.4f} ({(ours - mean) / sd:+.2f}) |"
        )
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        write_section(SECTION, text)


def draw_for(task, data, seed: int) -> np.ndarray:
    """Candidates as the task draws them for a split (its own sampler), with another seed."""
    sampler = importlib.import_module(type(task).__module__.rpartition(".")[0] + ".metrics")
    return sampler.draw_negatives(data.sequences, data.num_items, task.options.sampled_negatives, seed)


if __name__ == "__main__":
    main()

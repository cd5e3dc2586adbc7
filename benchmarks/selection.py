"""Early stopping on validation vs the published trainers' fixed length: one trial trained to its
full ``train.epochs`` without early stopping, its test split evaluated at every validation.

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/selection.py \
        [--study studies/tisasrec_ml1m.yaml] [--variant tisasrec] [--seeds 0 1 2] \
        [--set KEY=VALUE] [--no-write]

SASRec's and TiSASRec's trainers run a fixed number of epochs and report the test metric of their
last evaluation; ablate stops after ``train.patience`` evaluations without a better validation
metric and reports the test metric at the best one. One run to ``train.epochs`` with the patience
switched off gives every reading at once, from the same trajectory: the test metric at the last
evaluation (the published selection), at the best validation over the whole run, and at the best
validation before ``patience`` evaluations without improvement (ablate's, replayed from the curve:
up to that stop the run is the study's own trial, so where the study has trial files it must equal
the committed test metric). Writes the section "Early stopping vs a fixed length" of
benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import time
from datetime import date
from pathlib import Path

import numpy as np
import torch
from candidate_draws import committed_value  # benchmarks/ is on sys.path when run as a script
from results_file import write_section

from ablate.study.load import load_study
from ablate.training.trainer import train_trial

REPO = Path(__file__).resolve().parents[1]
SECTION = "## Early stopping vs a fixed length"


def replayed_stop(valid: list[float], patience: int) -> int:
    """The index of the evaluation ablate's early stopping keeps: the best before ``patience``
    evaluations in a row without improvement (or the best of all where that never happens)."""
    best, kept, stale = -np.inf, 0, 0
    for index, score in enumerate(valid):
        if score > best:
            best, kept, stale = score, index, 0
        else:
            stale += 1
            if stale >= patience:
                break
    return kept


def one_seed(args: argparse.Namespace, seed: int) -> dict[str, float]:
    study = load_study(args.study, overrides=[*args.set, "train.patience=null"])
    patience = load_study(args.study, overrides=args.set).spec.train.patience
    task, metric = study.task, study.metrics[0]
    data = task.load()
    evaluate = task.evaluate
    test_now: list[float] = []
    readings: list[tuple[int, float, float]] = []  # (epoch, valid, test) at each validation

    def evaluate_test_too(model, data, split, metrics, device, batch_size):
        result = evaluate(model, data, split, metrics, device, batch_size)
        if split == "valid":
            test_now.append(evaluate(model, data, "test", metrics, device, batch_size).summary[metric])
        return result

    def on_epoch(epoch: int, logged: dict[str, float]) -> None:
        if f"valid.{metric}" in logged:
            readings.append((epoch, logged[f"valid.{metric}"], test_now[-1]))

    task.evaluate = evaluate_test_too  # this instance only: the run's own loop does the rest
    start = time.perf_counter()
    result = train_trial(
        study, study.variants[args.variant], seed, data, torch.device("cpu"), on_epoch=on_epoch
    )
    epochs, valid, test = zip(*readings, strict=True)
    stop = replayed_stop(list(valid), patience)
    best = int(np.argmax(valid))
    return {
        "seed": seed,
        "wall_s": time.perf_counter() - start,
        "last_epoch": epochs[-1],
        "last": test[-1],
        "best_epoch": epochs[best],
        "best": test[best],
        "ours_epoch": epochs[stop],
        "ours": test[stop],
        "committed": None if args.set else committed_value(args.study, args.variant, seed, metric),
        "final": result.summary[f"test.{metric}"],
        "metric": metric,
        "patience": patience,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--study", type=Path, default=REPO / "studies" / "tisasrec_ml1m.yaml")
    parser.add_argument("--variant", default="tisasrec")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a study override")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md as it is")
    args = parser.parse_args()
    rows = []
    for seed in args.seeds:
        rows.append(one_seed(args, seed))
        print(rows[-1], flush=True)
    metric, patience = rows[0]["metric"], rows[0]["patience"]
    shown = args.study.relative_to(REPO) if args.study.is_relative_to(REPO) else args.study
    lines = [
        SECTION,
        "",
        f"`{shown}`, variant `{args.variant}`, trained to {rows[0]['last_epoch']} epochs without early "
        f"stopping, test {metric} at every validation; {date.today().isoformat()}. Ablate's selection "
        f"(patience {patience}) is replayed from the validation curve.",
        "",
        f"| seed | published: last evaluation | best validation, whole run | ablate (patience {patience}) "
        "| committed trial | last − ablate | wall s |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        kept = "—" if row["committed"] is None else f"{row['committed']:.4f}"
        lines.append(
            f"| {row['seed']} | {row['last']:.4f} (epoch {row['last_epoch']}) | {row['best']:.4f} "
            f"(epoch {row['best_epoch']}) | {row['ours']:.4f} (epoch {row['ours_epoch']}) | {kept} "
            f"| {row['last'] - row['ours']:+.4f} | {row['wall_s']:.0f} |"
        )
    gaps = np.array([row["last"] - row["ours"] for row in rows])
    spread = f" (sd {gaps.std(ddof=1):.4f})" if len(rows) > 1 else ""
    lines += [
        "",
        f"Mean last − ablate: {gaps.mean():+.4f} over {len(rows)} seed(s){spread}.",
    ]
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        write_section(SECTION, text)


if __name__ == "__main__":
    main()

"""What SASRec's published candidate exclusion would do to a committed trial's sampled test metric,
computed from the trial file's per-user ranks (no training):

    python benchmarks/candidate_exclusion.py [--study studies/sasrec_ml1m.yaml] [--no-write]

SASRec.pytorch's evaluation draws its 100 negatives among the items outside the user's *training*
items, so the user's validation item and the test item itself can be drawn; ablate's sampler (and
TiSASRec's code) excludes every item the user interacted with. Each held-out item is drawn at least
once with probability 1 - (1 - 1/M)^100, M the user's candidates under the published rule. A drawn
copy of the test item ties it; a drawn validation item ranks ahead of it or not, which only a model
can say. From each user's committed test rank r (read back from NDCG@10 = 1/log2(r + 2)), this prints
the upper bound (every drawn held-out item lands ahead: rank r + 1, or r + 2 when both are drawn; a
second copy of one item, about 100²/2M² ≈ 0.05 % here, is not counted) and
the tie alone broken against the test item half the time. Writes the section "Candidate exclusion
(sampled protocol)" of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import gzip
import json
from datetime import date
from pathlib import Path

import numpy as np
import pandas as pd
from results_file import write_section  # benchmarks/ is on sys.path when run as a script

from ablate.study.load import load_study

REPO = Path(__file__).resolve().parents[1]
SECTION = "## Candidate exclusion (sampled protocol)"
METRIC, CUTOFF = "ndcg@10", 10


def ndcg_at(rank: np.ndarray) -> np.ndarray:
    return np.where(rank < CUTOFF, 1.0 / np.log2(rank + 2.0), 0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--study", type=Path, default=REPO / "studies" / "sasrec_ml1m.yaml")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md as it is")
    args = parser.parse_args()
    study = load_study(args.study)
    data = study.task.load()
    draws = study.task.options.sampled_negatives
    # the published rule's candidates: every item but the training ones (all but the last two)
    candidates = pd.Series(
        [data.num_items - len(np.unique(seq[:-2])) for seq in data.sequences], index=np.asarray(data.users)
    )
    lines = [
        SECTION,
        "",
        f"`{args.study.relative_to(REPO) if args.study.is_relative_to(REPO) else args.study}`'s committed "
        f"trials, test {METRIC} against {draws} sampled negatives, per-user ranks from the trial files. "
        f"{date.today().isoformat()}.",
        "",
        f"| trial | {METRIC} (ours) | P(a held-out item drawn), mean | drop, upper bound "
        "| drop, tie broken half the time |",
        "|---|---:|---:|---:|---:|",
    ]
    folder = REPO / "reports" / args.study.stem / "trials"
    for path in sorted(folder.glob("*.trial.json.gz")):
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            split = json.load(handle)["per_unit"]
        units = pd.DataFrame(split["data"], columns=split["columns"])
        ours = units[METRIC].to_numpy()
        hit = ours > 0
        rank = np.where(hit, np.round(2.0 ** (1.0 / np.where(hit, ours, 1.0)) - 2.0), np.inf)
        drawn = 1.0 - (1.0 - 1.0 / candidates.loc[units["unit"]].to_numpy()) ** draws
        one, both = 2 * drawn * (1 - drawn), drawn**2
        bound = one * (ours - ndcg_at(rank + 1)) + both * (ours - ndcg_at(rank + 2))
        tie = 0.5 * drawn * (ours - ndcg_at(rank + 1))
        lines.append(
            f"| {path.name.split('.')[0]} | {ours.mean():.4f} | {drawn.mean():.4f} | "
            f"{bound.mean():.4f} | {tie.mean():.4f} |"
        )
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        write_section(SECTION, text)


if __name__ == "__main__":
    main()

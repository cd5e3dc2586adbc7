"""Training-step time of study variants with the package's fused CPU kernels on and off.

    python benchmarks/kernels.py [--steps 8] [--reps 3] [--note "..."] [--no-write] [STUDY:VARIANT ...]

Each row trains ``--steps`` steps of one variant of a seqrec study exactly as ``ablate run``
would (its task options, micro-batches and loss; Adam step included, evaluation excluded),
once with the kernels of :mod:`ablate.kernels` and once with torch's ops in their place (what a
machine without a C compiler runs: the same dropout draws, Sinkhorn iterations and stream mixing
as torch ops, per-position negatives' logits from one matmul). The two are interleaved,
``--reps`` times each, and the median step is reported with the ratio. The default rows are
the variants whose kernels changed in session 13: the mHC variants of ``tisasrec_ml1m`` (fused
Sinkhorn-Knopp and stream mixing) and the three models of ``hstu_fuxi_ml1m`` (sampled softmax
over 128 per-position negatives).

Results are printed and written to benchmarks/RESULTS.md (section "Fused kernels on and off").
Compare the ratios within one run: absolute times drift between days on these machines.
"""

from __future__ import annotations

import argparse
import os
import statistics
from datetime import date
from pathlib import Path

import torch
from results_file import cpu, write_section  # benchmarks/ is on sys.path when run as a script
from seqrec import cpu_kernels, epoch, load

REPO = Path(__file__).resolve().parents[1]
SECTION = "## Fused kernels on and off"
DEFAULT_ROWS = [
    "tisasrec_ml1m:base",
    "tisasrec_ml1m:sasrec-mhc",
    "tisasrec_ml1m:tisasrec-mhc",
    "hstu_fuxi_ml1m:base",
    "hstu_fuxi_ml1m:hstu",
    "hstu_fuxi_ml1m:fuxi-alpha",
]
FORMS = {"on": "ablate", "off": "ablate, unfused"}  # seqrec.cpu_kernels' names for the two


def measure(rows: list[str], steps: int, reps: int) -> list[dict]:
    studies, data = {}, {}
    results = []
    for row in rows:
        name, variant = row.split(":")
        if name not in studies:
            studies[name] = load(REPO / "studies" / f"{name}.yaml")
            data[name] = studies[name].task.load()
        times = {form: [] for form in FORMS}
        for _ in range(reps):
            for form, kind in FORMS.items():
                with cpu_kernels(kind):
                    times[form].append(epoch(studies[name], variant, data[name], 1, steps)["step_s"])
        on, off = (statistics.median(times[form]) for form in FORMS)
        results.append({"study": name, "variant": variant, "on": on, "off": off, "times": times})
        print(row, {form: [round(t, 3) for t in ts] for form, ts in times.items()}, flush=True)
    return results


def table(results: list[dict], steps: int, reps: int, loads: tuple, note: str) -> str:
    out = [
        SECTION,
        "",
        f"`python benchmarks/kernels.py --steps {steps} --reps {reps}` — {date.today()}, torch "
        f"{torch.__version__}, {torch.get_num_threads()} CPU threads "
        f"({cpu()}); median training step over {reps} interleaved "
        f"repetitions of {steps} steps, as `ablate run` trains the variant (its micro-batches and loss); "
        f"kernels off = torch's ops in their place, as without a C compiler. Load average (1 min) "
        f"{loads[0]:.1f} before, {loads[1]:.1f} after.{(' ' + note) if note else ''}",
        "",
        "| study | variant | step s, kernels on | step s, kernels off | off / on "
        "| runs on, s | runs off, s |",
        "|---|---|---:|---:|---:|---|---|",
    ]
    for r in results:
        runs = {form: " ".join(f"{t:.3f}" for t in r["times"][form]) for form in FORMS}
        out.append(
            f"| {r['study']} | {r['variant']} | {r['on']:.3f} | {r['off']:.3f} | {r['off'] / r['on']:.2f}× "
            f"| {runs['on']} | {runs['off']} |"
        )
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rows", nargs="*", default=DEFAULT_ROWS, help="STUDY:VARIANT (studies/STUDY.yaml)")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--note", default="", help="what else was running, for the record")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    before = os.getloadavg()[0]
    results = measure(args.rows, args.steps, args.reps)
    section = table(results, args.steps, args.reps, (before, os.getloadavg()[0]), args.note)
    print(section)
    if not args.no_write:
        write_section(SECTION, section)


if __name__ == "__main__":
    main()

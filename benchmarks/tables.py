"""Training-step time of HSTU and FuXi-α with the relative tables' two gathers.

    python benchmarks/tables.py [--steps 8] [--reps 3] [--threads 1] [--note "..."] [--no-write]

HSTU's and FuXi-α's relative position and time tables look up one learned scalar per
(query, key) pair, ``[b, n, n]`` of them per block. The package gathers with ``index_select``
(whose gradient is ``index_add_``) and builds the position table once, ``[1, n, n]``, where
every row has the same positions (right-padded sequences); the "indexing" form is what it did
before session 14: ``weight[index]`` (advanced indexing, whose gradient accumulates through
``index_put_``) on a ``[b, n, n]`` position table. The variants of ``studies/hstu_fuxi_ml1m.yaml``
train ``--steps`` steps each as ``ablate run`` would (micro-batches, loss, Adam step), the two
forms interleaved ``--reps`` times; the median step and the ratio are reported. The values and
gradients are the same in both forms (``tests/plugins/test_bias.py``).

Results are printed and written to benchmarks/RESULTS.md (section "Relative tables: gathers").
Compare the ratios within one run: absolute times drift between days on these machines.
"""

from __future__ import annotations

import argparse
import os
from contextlib import contextmanager
from pathlib import Path

import torch
from results_file import publish, section_text, two_form_options, two_form_table  # on sys.path
from seqrec import epoch, load

import ablate_plugins.attention_parts as parts

REPO = Path(__file__).resolve().parents[1]
SECTION = "## Relative tables: gathers"
STUDY = "hstu_fuxi_ml1m"
VARIANTS = ["hstu", "fuxi-alpha"]


def indexed_positions(self: parts.RelativePositionTable, tokens) -> torch.Tensor:
    """The position table as before session 14: one ``[b, n, n]`` gather by advanced indexing."""
    p = tokens.positions
    offset = (p[:, None, :] - p[:, :, None]).clamp(-(self.max_len - 1), self.max_len - 1)
    return self.weight[offset + self.max_len - 1]


@contextmanager
def gathers(form: str):
    """``index_select``: the package's; ``indexing``: advanced indexing, per-row position tables."""
    lookup, positions = parts.table_lookup, parts.RelativePositionTable.forward
    if form == "indexing":
        parts.table_lookup = lambda weight, index: weight[index]
        parts.RelativePositionTable.forward = indexed_positions
    try:
        yield
    finally:
        parts.table_lookup, parts.RelativePositionTable.forward = lookup, positions


FORMS = ["index_select", "indexing"]


def table(results: dict, steps: int, reps: int, loads: tuple, note: str) -> str:
    command = f"python benchmarks/tables.py --steps {steps} --reps {reps} --threads {torch.get_num_threads()}"
    setting = (
        f"`studies/{STUDY}.yaml`, median training step over {reps} interleaved repetitions of {steps} steps."
    )
    return section_text(SECTION, command, setting, loads, note, two_form_table(results, FORMS))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    two_form_options(parser, steps=8)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    before = os.getloadavg()[0]
    study = load(REPO / "studies" / f"{STUDY}.yaml")
    data = study.task.load()
    results = {variant: {form: [] for form in FORMS} for variant in VARIANTS}
    for _ in range(args.reps):
        for variant in VARIANTS:
            for form in FORMS:
                with gathers(form):
                    results[variant][form].append(epoch(study, variant, data, 1, args.steps)["step_s"])
                print(variant, form, f"{results[variant][form][-1]:.3f} s/step", flush=True)
    section = table(results, args.steps, args.reps, (before, os.getloadavg()[0]), args.note)
    publish(SECTION, section, not args.no_write)


if __name__ == "__main__":
    main()

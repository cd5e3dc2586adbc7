"""Training-step time of the tabular task with the readout-only final block and without it.

    python benchmarks/tabular.py [--steps 20] [--reps 3] [--threads 1] [--note "..."] [--no-write]

The tabular model places its readout ([CLS]) token last and asks the backbone for that token
alone (``last_only``), so the final block runs its attention query, join and FFN for one token
per row, as FT-Transformer's and T2G-Former's code run their last layer for [CLS] only. The
"full" form runs every token through every block and then reads the readout, which is what the
model did before session 14. Both variants of ``studies/t2g_california.yaml`` (softmax and
fr_graph, T2G-Former's published width) train ``--steps`` AdamW steps of batch 256 on the real
California split per repetition, the two forms interleaved, ``--reps`` times; the median step
and the ratio are reported. Compare the ratios within one run: absolute times drift.

Results are printed and written to benchmarks/RESULTS.md (section "Tabular readout-only final block").
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
from results_file import publish, section_text, two_form_options, two_form_table  # on sys.path

from ablate.model.build import build_backbone
from ablate.study.load import load_study
from ablate.training.trainer import Trainer
from ablate_plugins.tabular.model import TabularModel

REPO = Path(__file__).resolve().parents[1]
STUDY = REPO / "studies" / "t2g_california.yaml"
SECTION = "## Tabular readout-only final block"
VARIANTS = ["base", "fr_graph"]


def every_token_forward(model: TabularModel, batch) -> torch.Tensor:
    """The head on the readout token of a backbone that runs every token through every block."""
    x = model.tokenizer(batch.numeric, batch.categorical)
    hidden = model.backbone(x, model.token_context(x.shape[0], x.shape[1], x.device))
    return model.head(hidden[:, -1])


FORMS = {"readout only": TabularModel.forward, "every token": every_token_forward}


def step_time(study, data, variant: str, forward, steps: int) -> float:
    """Mean seconds per training step over ``steps`` steps, after 3 warm-up steps."""
    task = study.task
    spec = study.variants[variant]
    ctx = study.build_context(spec, task.max_len(data))
    torch.manual_seed(0)
    model = task.build_model(build_backbone(spec, ctx), ctx, data)
    model.forward = forward.__get__(model)  # this instance only
    model.train()
    trainer = Trainer(study, model, torch.Generator().manual_seed(0), torch.device("cpu"))
    done, start = 0, None
    for batch in trainer.batches(data):
        if done == 3:
            start = time.perf_counter()
        trainer.step(batch)
        done += 1
        if done == steps + 3:
            break
    return (time.perf_counter() - start) / steps


def table(results: dict, steps: int, reps: int, loads: tuple, note: str) -> str:
    command = (
        f"python benchmarks/tabular.py --steps {steps} --reps {reps} --threads {torch.get_num_threads()}"
    )
    setting = (
        f"`studies/t2g_california.yaml` (d 272, 3 blocks, batch 256, real California split), mean step "
        f"over {steps} steps after 3 warm-up steps, median of {reps} interleaved repetitions."
    )
    return section_text(SECTION, command, setting, loads, note, two_form_table(results, list(FORMS)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    two_form_options(parser, steps=20)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    before = os.getloadavg()[0]
    study = load_study(STUDY)
    data = study.task.load()
    results = {variant: {form: [] for form in FORMS} for variant in VARIANTS}
    for _ in range(args.reps):
        for variant in VARIANTS:
            for form, forward in FORMS.items():
                results[variant][form].append(step_time(study, data, variant, forward, args.steps))
                print(variant, form, f"{results[variant][form][-1]:.3f} s/step", flush=True)
    section = table(results, args.steps, args.reps, (before, os.getloadavg()[0]), args.note)
    publish(SECTION, section, not args.no_write)


if __name__ == "__main__":
    main()

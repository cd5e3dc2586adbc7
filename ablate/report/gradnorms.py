"""Gradient norms (exploratory): how large each variant's gradients were before clipping, from the
per-epoch curves ``train.grad_norm`` (the mean over an epoch's steps) and ``train.grad_norm_max``
(its largest step) that :func:`ablate.training.trainer.train_trial` logs.

A claim of more stable training (hyper-connections, normalisation placements, initialisations) is
a claim about these numbers: spikes show in the maximum, a drift in the mean's late epochs. The
section is descriptive — no test, no verdict — beside the verdicts on the study's metrics.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure

from ablate.report.document import Element

MEAN, PEAK = "train.grad_norm", "train.grad_norm_max"

HEADERS = [
    "variant",
    "mean ± sd over seeds",
    "last epoch",
    "largest step",
    "epochs with a step ≥ 10× the mean",
]


def _frame(curves: pd.DataFrame | None) -> pd.DataFrame:
    if curves is None or curves.empty:
        return pd.DataFrame(columns=["variant", "seed", "epoch", "metric", "value"])
    c = curves[curves["metric"].astype(str).isin([MEAN, PEAK])]
    return c.assign(
        variant=c["variant"].astype(str), value=pd.to_numeric(c["value"], errors="coerce")
    ).dropna(subset=["value"])


def grad_norm_rows(curves: pd.DataFrame | None, names: list[str]) -> list[list[str]]:
    """One row per variant with gradient-norm curves (order: ``names``, then any others): the
    per-trial mean over epochs of the epoch means, as mean ± sd over seeds; the last epoch's mean
    (mean over seeds); the largest single step of any seed; and how many (seed, epoch) pairs had a
    step at least ten times that epoch's mean, of how many."""
    c = _frame(curves)
    if c.empty:
        return []
    wide = c.pivot_table(index=["variant", "seed", "epoch"], columns="metric", values="value").reset_index()
    present = list(dict.fromkeys([n for n in names if n in set(wide["variant"])] + sorted(wide["variant"])))
    rows = []
    for variant in present:
        v = wide[wide["variant"] == variant]
        per_seed = v.groupby("seed")[MEAN].mean()
        last = v[v["epoch"] == v.groupby("seed")["epoch"].transform("max")][MEAN].mean()
        sd = f" ± {per_seed.std(ddof=1):#.3g}" if len(per_seed) > 1 else ""
        spikes = f"{int((v[PEAK] >= 10 * v[MEAN]).sum())} of {len(v)}" if PEAK in v else "—"
        peak = f"{v[PEAK].max():#.3g}" if PEAK in v else "—"
        rows.append([variant, f"{per_seed.mean():#.3g}{sd}", f"{last:#.3g}", peak, spikes])
    return rows


def grad_norm_figure(curves: pd.DataFrame | None, names: list[str], path: Path) -> Path | None:
    """The epoch mean of the gradient norm per epoch, mean over seeds with a ± 1 sd band, log scale."""
    c = _frame(curves)
    c = c[c["metric"] == MEAN]
    if c.empty:
        return None
    present = set(c["variant"])
    order = [n for n in names if n in present] + sorted(present - set(names))
    fig = Figure(figsize=(6.8, 4.0))
    ax = fig.add_subplot()
    sns.lineplot(data=c, x="epoch", y="value", hue="variant", hue_order=order, errorbar="sd", ax=ax)
    ax.set(xlabel="epoch", ylabel="gradient norm before clipping (epoch mean)", yscale="log")
    ax.legend(title="variant", bbox_to_anchor=(1.01, 1), loc="upper left", frameon=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    fig.clear()
    return path


CAPTION = "Gradient norm before clipping per epoch (epoch mean): mean over seeds, band ± 1 sd; log scale."


def grad_norm_elements(curves: pd.DataFrame | None, names: list[str]) -> list[Element]:
    """The report's exploratory section on gradient norms (its figure: :func:`grad_norm_figure`);
    [] when none were logged."""
    rows = grad_norm_rows(curves, names)
    if not rows:
        return []
    return [
        Element("h2", "Gradient norms (exploratory)"),
        Element(
            "p",
            "The total L2 norm of the gradients before clipping, logged per epoch as the mean over its steps "
            "and its largest step; descriptive only, no test. Columns: each trial's mean over epochs "
            "(mean ± sd over seeds), the last epoch's mean (mean over seeds), the largest step of any seed, "
            "and the epochs (over all seeds) whose largest step was ≥ 10× that epoch's mean (a spike).",
        ),
        Element("table", headers=HEADERS, items=rows, left=1),
    ]

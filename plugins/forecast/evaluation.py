"""Forecast metrics: MSE / MAE on the normalised scale, one evaluation unit per window.

A window's value is its mean over channels and horizon steps; every window has the same number
of values, so the split's MSE / MAE (the papers' figure) is the mean over windows.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from ablate.tasks import Evaluation

from .batches import eval_batches
from .data import Series
from .model import ForecastModel

METRICS = ("mse", "mae")


def check(name: str) -> str | None:
    return None if name in METRICS else f"unknown metric '{name}' for forecast; expected mse or mae"


def window_errors(prediction: np.ndarray, target: np.ndarray) -> dict[str, np.ndarray]:
    """``[b, c, H]`` forecasts and targets → per-window ``{"mse": [b], "mae": [b]}``."""
    diff = prediction.astype(np.float64) - target.astype(np.float64)
    return {"mse": (diff**2).mean(axis=(1, 2)), "mae": np.abs(diff).mean(axis=(1, 2))}


@torch.no_grad()
def evaluate(
    model: ForecastModel,
    series: Series,
    split: str,
    metrics: list[str],
    device: torch.device,
    batch_size: int,
) -> Evaluation:
    model.eval()
    units, errors = [], {m: [] for m in METRICS}
    for batch in eval_batches(series, split, batch_size):
        batch = batch.to(device)
        prediction = model(batch).float().cpu().numpy()
        for name, values in window_errors(prediction, batch.targets.cpu().numpy()).items():
            errors[name].append(values)
        units.append(batch.starts.cpu().numpy())
    per_unit = pd.DataFrame(
        {"unit": np.concatenate(units), **{m: np.concatenate(errors[m]) for m in metrics}}
    )
    return Evaluation(summary={m: float(per_unit[m].mean()) for m in metrics}, per_unit=per_unit)

"""Tabular metrics, one evaluation unit per row.

Regression: ``rmse`` and ``mae`` in the target's original units (predictions are mapped back from
the standardised scale, as the FT-Transformer / T2G-Former papers report). Per row the ``rmse``
column holds the squared error (the split's RMSE is the root of their mean) and ``mae`` the
absolute error. Classification: ``accuracy``, per row 1 if correct.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from ablate.tasks import Evaluation

from .batches import eval_batches
from .data import Table
from .model import TabularModel


def _errors(prediction: np.ndarray, target: np.ndarray) -> dict[str, np.ndarray]:
    error = prediction - target
    return {"rmse": error**2, "mae": np.abs(error)}


def _hits(prediction: np.ndarray, target: np.ndarray) -> dict[str, np.ndarray]:
    return {"accuracy": (prediction == target).astype(np.float64)}


@dataclass(frozen=True)
class Target:
    """What one task type predicts: its metrics, how head outputs ``[r, out]`` become a
    prediction ``[r]`` (original units or class index), and the per-row metric values."""

    metrics: tuple[str, ...]
    predict: Callable[[np.ndarray, float, float], np.ndarray]  # outputs, y_mean, y_std
    row_values: Callable[[np.ndarray, np.ndarray], dict[str, np.ndarray]]


TARGETS = {
    "regression": Target(
        ("rmse", "mae"), lambda out, mean, std: out[:, 0].astype(np.float64) * std + mean, _errors
    ),
    "binclass": Target(
        ("accuracy",), lambda out, mean, std: (out[:, 0] > 0).astype(np.int64), _hits
    ),  # sigmoid > .5
    "multiclass": Target(("accuracy",), lambda out, mean, std: out.argmax(axis=1), _hits),
}
HIGHER_IS_BETTER = {"rmse": False, "mae": False, "accuracy": True}


def check(name: str, task_type: str | None) -> str | None:
    allowed = TARGETS[task_type].metrics if task_type else tuple(HIGHER_IS_BETTER)
    if name in allowed:
        return None
    kind = f"{task_type} " if task_type else ""
    return f"unknown metric '{name}' for tabular {kind}data; expected {' or '.join(allowed)}"


def predictions(outputs: np.ndarray, task_type: str, y_mean: float, y_std: float) -> np.ndarray:
    """Head outputs ``[r, out]`` → predicted value (original units) or class index ``[r]``."""
    return TARGETS[task_type].predict(outputs, y_mean, y_std)


def row_values(prediction: np.ndarray, target: np.ndarray, task_type: str) -> dict[str, np.ndarray]:
    return TARGETS[task_type].row_values(prediction, target)


def summarise(values: dict[str, np.ndarray], metrics: list[str]) -> dict[str, float]:
    return {m: float(np.sqrt(values[m].mean()) if m == "rmse" else values[m].mean()) for m in metrics}


@torch.no_grad()
def evaluate(
    model: TabularModel, table: Table, split: str, metrics: list[str], device: torch.device, batch_size: int
) -> Evaluation:
    model.eval()
    part = table.splits[split]
    outputs = [model(batch.to(device)).float().cpu().numpy() for batch in eval_batches(part, batch_size)]
    prediction = predictions(np.concatenate(outputs), table.task_type, table.y_mean, table.y_std)
    values = row_values(prediction, part.y_raw, table.task_type)
    per_unit = pd.DataFrame({"unit": part.rows, **{m: values[m] for m in metrics}})
    return Evaluation(summary=summarise(values, metrics), per_unit=per_unit)

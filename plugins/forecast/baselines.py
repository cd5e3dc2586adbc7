"""forecast's trivial baselines and its protocol sentence for the report.

Each predicts every test window's horizon from its own lookback, channel by channel, on the
normalised scale the variants are scored on (:mod:`.evaluation`): ``repeat-last`` (the last input
value, held), ``window-mean`` (the lookback's mean, held) and, where the data's period is known and
fits in the lookback, ``seasonal-naive`` (the last period repeated). Dimensions: ``b`` windows,
``c`` channels, ``w`` lookback, ``H`` horizon, ``P`` period.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ablate.tasks import Baseline

from .batches import eval_batches
from .data import Series
from .evaluation import window_errors

BATCH = 512  # windows at once
# The seasonal period of the ETT splits' rows: a day of hourly / 15-minute rows.
DAY_ROWS = {"ett_hour": 24, "ett_minute": 96}


def _repeat_last(inputs: np.ndarray, horizon: int) -> np.ndarray:
    return np.repeat(inputs[..., -1:], horizon, axis=-1)  # [b, c, H]


def _window_mean(inputs: np.ndarray, horizon: int) -> np.ndarray:
    return np.repeat(inputs.mean(axis=-1, keepdims=True), horizon, axis=-1)


def _seasonal(period: int) -> Callable[[np.ndarray, int], np.ndarray]:
    def predict(inputs: np.ndarray, horizon: int) -> np.ndarray:
        w = inputs.shape[-1]
        return inputs[..., w - period + np.arange(horizon) % period]  # step h: the value P·k steps before

    return predict


def _scored(series: Series, predict: Callable[[np.ndarray, int], np.ndarray], metrics: list[str]) -> dict:
    errors: dict[str, list[np.ndarray]] = {m: [] for m in metrics}
    for batch in eval_batches(series, "test", BATCH):
        inputs = batch.inputs.numpy().astype(np.float64)
        found = window_errors(predict(inputs, series.horizon), batch.targets.numpy())
        for m in metrics:
            errors[m].append(found[m])
    return {m: float(np.concatenate(errors[m]).mean()) if errors[m] else float("nan") for m in metrics}


def trivial(series: Series, metrics: list[str], period: int | None) -> list[Baseline]:
    """repeat-last, window-mean and (``period`` known and ≤ the lookback) seasonal-naive."""
    found = [
        Baseline(
            "repeat-last",
            "each channel's last input value, held over the horizon",
            _scored(series, _repeat_last, metrics),
        ),
        Baseline(
            "window-mean",
            "each channel's mean over the lookback, held over the horizon",
            _scored(series, _window_mean, metrics),
        ),
    ]
    if period is not None and period <= series.lookback:
        found.append(
            Baseline(
                "seasonal-naive",
                f"each channel's last {period} input values (one period), repeated over the horizon",
                _scored(series, _seasonal(period), metrics),
            )
        )
    return found


def protocol_text(
    split: str,
    ratios: tuple[float, float, float],
    lookback: int,
    horizon: int,
    rows: tuple[int, int] | None = None,
) -> str:
    """The split, the windows, and the scale MSE / MAE are computed on; ``rows``: (rows the splits
    use, rows in the file), where the data were read."""
    if split in ("ett_hour", "ett_minute"):
        used = (
            f"rows 1–{rows[0]:,} of the file's {rows[1]:,}, the {rows[1] - rows[0]:,} later rows unused"
            if rows is not None and rows[1] > rows[0]
            else f"rows 1–{rows[0]:,}, the whole file"
            if rows is not None
            else "later rows unused"
        )
        how = (
            "the ETT split: the first 12 months train, the next 4 validate, the 4 after test (30-day "
            f"months; {used})"
        )
    else:
        shares = " / ".join(f"{r:.0%}" for r in ratios)
        how = f"by time, {shares} of the rows for training / validation / test"
    return (
        f"The rows are split {how}; each channel is z-normalised with the training rows' mean and sd. "
        f"A test unit is one window: {lookback} rows of input, the next {horizon} rows as target (the "
        f"first test windows read their input from the end of the validation rows; targets never cross "
        f"a split). MSE and MAE are computed on the z-normalised scale, averaged over channels and "
        f"horizon steps per window, then over windows."
    )

"""The ``forecast`` task: multivariate long-horizon forecasting with channels as tokens."""

from __future__ import annotations

import logging
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ablate.components import BuildContext
from ablate.errors import warn
from ablate.tasks import Baseline, Evaluation, Task

from . import baselines, evaluation
from .batches import Batch, train_batches
from .data import Series, ett_elsewhere, prepare, read_csv, scheme_for, split_borders, synthetic
from .model import ForecastModel
from .options import CsvData, ForecastOptions, LossOptions

log = logging.getLogger(__name__)

LOSSES = {"mse": F.mse_loss, "mae": F.l1_loss}


class ForecastTask(Task):
    """Predict the next ``horizon`` rows of every channel from the last ``lookback`` rows.

    Tokens are channels (an unordered set); ``tokens.values`` holds each channel's (instance-
    normalised) lookback window, so data-dependent channel masks (``channel_masked``) work.
    """

    Options = ForecastOptions
    LossOptions = LossOptions
    ordered = False

    options: ForecastOptions

    def features(self) -> frozenset[str]:
        return frozenset({"values"})

    def check_metric(self, name: str) -> str | None:
        return evaluation.check(name)

    def metric_higher_is_better(self, name: str) -> bool:
        return False

    def load(self) -> Series:
        opts, data = self.options, self.options.data
        if isinstance(data, CsvData):
            path = self.data_path()
            raw, channels = read_csv(path, data.date_column, data.channels, data.encoding, data.sep)
            scheme = scheme_for(path, data.split)
            if problem := ett_elsewhere(path, scheme, len(raw)):
                warn(problem)  # the rows it uses are in validate's data line and the report's Methods
            borders = split_borders(len(raw), scheme, opts.lookback, data.ratios)
            source = str(path)
        else:
            raw = synthetic(data.channels, data.rows, data.period, data.noise, data.seed)
            channels = [f"c{i}" for i in range(data.channels)]
            borders = split_borders(len(raw), "ratio", opts.lookback, data.ratios)
            source = f"synthetic(seed={data.seed})"
        series = prepare(raw, channels, borders, source, opts.lookback, opts.horizon)
        log.info("%s", series.describe())
        return series

    def _split(self) -> str:
        data = self.options.data
        return scheme_for(self.data_path(), data.split) if isinstance(data, CsvData) else "ratio"

    def baselines(self, data: Series, metrics: list[str]) -> list[Baseline]:
        """repeat-last, window-mean, and seasonal-naive at the synthetic data's period or an ETT
        split's day."""
        period = getattr(self.options.data, "period", None) or baselines.DAY_ROWS.get(self._split())
        return baselines.trivial(data, metrics, period)

    def protocol(self, metrics: list[str], data: Series | None = None) -> str:
        opts = self.options
        rows = (len(data.values), data.file_rows) if data is not None and data.file_rows else None
        return baselines.protocol_text(self._split(), opts.data.ratios, opts.lookback, opts.horizon, rows)

    def reference(self, data: Series, metrics: list[str]) -> dict:
        """The base's baselines, with a protocol that counts the rows the split uses."""
        return {**super().reference(data, metrics), "protocol": self.protocol(metrics, data)}

    def values_width(self) -> int:
        return self.options.lookback

    def data_summary(self, data: Series) -> dict[str, int | float | str]:
        """Channels and timesteps, and per split its timesteps (validation and test rows include the
        lookback they read) and (input, target) windows, the evaluation units."""
        summary: dict[str, int | float | str] = {"channels": data.num_channels, "timesteps": len(data.values)}
        if data.unused_rows:  # an ETT split's later rows
            summary["timesteps unused"] = f"{data.unused_rows} of the file's {data.file_rows}"
        for split, (start, end) in data.borders.items():
            summary[f"{split} timesteps"] = end - start
        summary.update({f"{split} windows": data.windows(split) for split in data.borders})
        return summary

    def max_len(self, data: Series) -> int:
        return data.num_channels

    def train_batches(self, data: Series, batch_size: int, generator: torch.Generator) -> Iterable[Batch]:
        return train_batches(data, batch_size, generator)

    def batch_tokens(self, batch: Batch) -> int:
        return int(batch.inputs.shape[0] * batch.inputs.shape[1])

    def build_model(self, backbone: nn.Module, ctx: BuildContext, data: Series) -> ForecastModel:
        return ForecastModel(
            backbone, self.options.lookback, self.options.horizon, ctx.dim, self.options.instance_norm
        )

    def loss(
        self, model: ForecastModel, batch: Batch, loss: LossOptions, generator: torch.Generator
    ) -> Tensor:
        return LOSSES[loss.kind](model(batch).float(), batch.targets)

    @torch.no_grad()
    def evaluate(
        self,
        model: ForecastModel,
        data: Series,
        split: str,
        metrics: list[str],
        device: torch.device,
        batch_size: int,
    ) -> Evaluation:
        return evaluation.evaluate(model, data, split, metrics, device, batch_size)

"""The ``tabular`` task: rows of numeric / categorical features as an unordered token set."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ablate.components import Attention, BuildContext, Component, Options
from ablate.tasks import Baseline, Evaluation, Task, data_file_problem

from . import baselines, evaluation
from .batches import Batch, train_batches
from .csv_data import read_csv, split_words
from .data import Table, read_npy, synthetic
from .model import TabularModel
from .options import CsvData, NpyData, TabularOptions
from .preparation import prepare

log = logging.getLogger(__name__)


class TabularTask(Task):
    """Regression or classification from a readout ([CLS]) token over feature tokens
    (FT-Transformer's tokenizer); evaluation keeps one value per test row."""

    Options = TabularOptions
    ordered = False

    options: TabularOptions

    def features(self) -> frozenset[str]:
        return frozenset({"readout"})

    def declared_task_type(self) -> str | None:
        """regression / binclass / multiclass as declared, or from info.json; None if unreadable."""
        data = self.options.data
        if not isinstance(data, NpyData):
            return data.task_type
        try:
            info = json.loads((self.data_path() / "info.json").read_text())
        except (OSError, ValueError):
            return None  # check_files / load report the problem
        return info.get("task_type") if isinstance(info, dict) else None

    def incompatibility(self, slot: str, kind: type[Component], options: Options) -> str | None:
        """An attention kind that mixes no tokens leaves the readout token, which the head reads,
        blind to every feature: each row would get the same prediction."""
        if issubclass(kind, Attention) and not kind.mixes_tokens:
            return (
                f"attention kind '{kind.kind_name()}' mixes no tokens, so the readout token the head "
                f"reads never sees a feature and every row gets the same prediction (a constant "
                f"predictor); choose an attention kind that mixes tokens (softmax, fr_graph)"
            )
        return None

    def data_files(self) -> dict[str, Path]:
        data = self.options.data
        if not isinstance(data, CsvData):
            return super().data_files()
        return {option: self.base_dir / Path(name).expanduser() for option, name in data.files().items()}

    def check_files(self) -> str | None:
        """Every file the data options name exists (``path``, and ``valid`` / ``test`` files)."""
        data = self.options.data
        if not isinstance(data, CsvData):
            return super().check_files()
        for option, name in data.files().items():
            problem = data_file_problem(self.base_dir / Path(name).expanduser())
            if problem is not None:
                return f"{option}: {problem}"
        return None

    def check_metric(self, name: str) -> str | None:
        return evaluation.check(name, self.declared_task_type())

    def metric_higher_is_better(self, name: str) -> bool:
        return evaluation.HIGHER_IS_BETTER.get(name, True)

    def load(self) -> Table:
        data = self.options.data
        if isinstance(data, NpyData):
            raw, missing = read_npy(self.data_path()), data.missing
        elif isinstance(data, CsvData):
            raw, missing = read_csv(data, self.base_dir), data.missing
        else:
            raw = synthetic(**data.model_dump(exclude={"format"}))
            missing = "error"
        options = self.options
        table = prepare(raw, missing, options.scaling, options.standardize_target, options.quantile_noise)
        log.info("%s", table.describe())
        return table

    def baselines(self, data: Table, metrics: list[str]) -> list[Baseline]:
        return baselines.trivial(data, metrics)

    def protocol(self, metrics: list[str]) -> str:
        data = self.options.data
        if isinstance(data, CsvData):
            split = split_words(data)
        else:
            split = " " + baselines.SPLITS["npy" if isinstance(data, NpyData) else "synthetic"]
        return baselines.protocol_text(split, self.options.scaling, self.declared_task_type())

    def max_len(self, data: Table) -> int:
        return 1 + data.num_features  # readout + features

    def data_summary(self, data: Table) -> dict[str, int | float | str]:
        return {
            **{f"{split} rows": len(part) for split, part in data.splits.items()},
            "numeric features": len(data.numeric_names),
            "categorical features": len(data.categorical_names),
            "target": data.task_type if data.classes == 1 else f"{data.task_type} ({data.classes} classes)",
        }

    def train_batches(self, data: Table, batch_size: int, generator: torch.Generator) -> Iterable[Batch]:
        return train_batches(data.splits["train"], batch_size, generator)

    def batch_tokens(self, batch: Batch) -> int:
        return len(batch) * (1 + batch.numeric.shape[1] + batch.categorical.shape[1])

    def build_model(self, backbone: nn.Module, ctx: BuildContext, data: Table) -> TabularModel:
        return TabularModel(backbone, len(data.numeric_names), data.cardinalities, ctx.dim, data.classes)

    def loss(self, model: TabularModel, batch: Batch, loss, generator: torch.Generator) -> Tensor:
        """MSE on the standardised target, BCE with logits, or cross-entropy."""
        out = model(batch).float()
        if out.shape[1] > 1:
            return F.cross_entropy(out, batch.y)
        if batch.y.dtype == torch.long:
            return F.binary_cross_entropy_with_logits(out[:, 0], batch.y.float())
        return F.mse_loss(out[:, 0], batch.y)

    @torch.no_grad()
    def evaluate(
        self,
        model: TabularModel,
        data: Table,
        split: str,
        metrics: list[str],
        device: torch.device,
        batch_size: int,
    ) -> Evaluation:
        return evaluation.evaluate(model, data, split, metrics, device, batch_size)

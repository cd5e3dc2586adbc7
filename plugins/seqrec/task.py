"""The ``seqrec`` task: SASRec-style next-item prediction with leave-one-out evaluation."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from ablate.components import BuildContext
from ablate.errors import DataError
from ablate.jagged import Jagged
from ablate.tasks import Baseline, Evaluation, Task

from . import baselines, losses, metrics
from . import metrics as M
from .batches import Batch, length_groups, train_batches, train_part
from .cache import cached
from .data import Interactions, synthetic, with_catalogue
from .evaluation import evaluate
from .model import SeqRecModel, padded_layout
from .options import (
    FileData,
    JsonLinesData,
    MovieLensData,
    SeqRecOptions,
    TableData,
    UserItemData,
    UserLinesData,
)
from .readers import (
    read_catalogue,
    read_json_lines,
    read_movielens,
    read_table,
    read_user_item,
    read_user_lines,
)

# Each file format's reader, called with the format's options (less ``format`` / ``path``).
READERS = {
    MovieLensData: read_movielens,
    UserItemData: read_user_item,
    UserLinesData: read_user_lines,
    TableData: read_table,
    JsonLinesData: read_json_lines,
}
# The sampled protocol draws its negatives once per split with these seeds: every epoch,
# variant and seed is ranked against the same candidates.
NEGATIVE_SEEDS = {"valid": 20180821, "test": 20180822}


class SeqRecTask(Task):
    """Next-item prediction; evaluation ranks all unseen items (or SASRec's sampled
    candidates) per user."""

    Options = SeqRecOptions
    LossOptions = losses.LossOptions
    ordered = True

    options: SeqRecOptions

    def __init__(self, options: SeqRecOptions, base_dir: Path):
        super().__init__(options, base_dir)
        self._negatives: dict[str, tuple[Interactions, np.ndarray]] = {}  # split → (data, [u, k])

    def features(self) -> frozenset[str]:
        data = self.options.data
        if isinstance(data, (TableData, JsonLinesData)):
            has_time = data.timestamp is not None
        elif isinstance(data, FileData):
            has_time = isinstance(data, MovieLensData)
        else:
            has_time = data.timestamps
        return frozenset({"timestamps"}) if has_time else frozenset()

    def check_metric(self, name: str) -> str | None:
        return metrics.check(name)

    def load(self) -> Interactions:
        data = self.options.data
        if isinstance(data, FileData):
            path = self.data_path()
            options = data.model_dump(exclude={"format", "path"})
            read = READERS[type(data)]
            loaded = (
                cached(path, {"format": data.format, **options}, lambda: read(path, **options))
                if self.options.cache
                else read(path, **options)
            )
        else:
            loaded = synthetic(**data.model_dump(exclude={"format"}))
        if self.options.catalogue is not None:
            path = self.catalogue_path()
            loaded = with_catalogue(loaded, read_catalogue(path), str(path))
        if loaded.num_items < 2:
            raise DataError(
                f"{loaded.source}: next-item prediction needs at least 2 items; found {loaded.num_items}"
            )
        if self.options.protocol == "sampled":
            rated_all = next(
                (
                    u
                    for u, s in enumerate(loaded.sequences)
                    if len(s) >= loaded.num_items and len(np.unique(s)) >= loaded.num_items
                ),
                None,
            )
            if rated_all is not None:
                user = loaded.user_ids[rated_all] if loaded.user_ids is not None else loaded.users[rated_all]
                raise DataError(
                    f"{loaded.source}: user {user} rated every one of the {loaded.num_items} items, so "
                    "the sampled protocol has no negatives to draw for them; use task.protocol: full, "
                    "or leave such users out of the file"
                )
        return loaded

    def catalogue_path(self) -> Path | None:
        """The catalogue file (``catalogue``, relative to the data file's folder), or None."""
        path = self.data_path()
        if self.options.catalogue is None or path is None:
            return None
        return path.parent / Path(self.options.catalogue).expanduser()

    def data_files(self) -> dict[str, Path]:
        files = super().data_files()
        catalogue = self.catalogue_path()
        return files if catalogue is None else {**files, "catalogue": catalogue}

    def check_files(self) -> str | None:
        catalogue = self.catalogue_path()
        if catalogue is not None and not catalogue.is_file():
            return f"catalogue: {catalogue} is not a file"
        return super().check_files()

    def artifacts(self, data: Interactions) -> dict[str, bytes]:
        """File data: which source id each user unit and item index stands for (``users.csv``,
        ``items.csv``), so predictions can be traced back to the file's ids."""
        return data.id_maps() if isinstance(self.options.data, FileData) else {}

    def negatives(self, data: Interactions, split: str) -> np.ndarray:
        """``[u, k]`` sampled-protocol candidates for ``split``, drawn once per data set."""
        drawn_for, drawn = self._negatives.get(split, (None, None))
        if drawn_for is not data:
            drawn = M.draw_negatives(
                data.sequences, data.num_items, self.options.sampled_negatives, NEGATIVE_SEEDS[split]
            )
            self._negatives[split] = (data, drawn)
        return drawn

    def baselines(self, data: Interactions, metrics: list[str]) -> list[Baseline]:
        sampled = any(M.protocol(name, self.options.protocol) == "sampled" for name in metrics)
        negatives = self.negatives(data, "test") if sampled else None
        return [baselines.popularity(data, metrics, self.options.protocol, negatives)]

    def protocol(self, metrics: list[str]) -> str:
        return baselines.protocol_text(self.options.protocol, self.options.sampled_negatives, metrics)

    def max_len(self, data: Interactions) -> int:
        return self.options.max_len

    def data_summary(self, data: Interactions) -> dict[str, int | float | str]:
        """Leave-one-out units: a user trains where it has a training target, and every user is a
        validation and a test unit."""
        return {
            "users": data.num_users,
            "items": data.num_items,
            "interactions": data.num_interactions,
            "train units": sum(len(train_part(s)) >= 2 for s in data.sequences),
            "valid units": data.num_users,
            "test units": data.num_users,
            "mean sequence length": round(data.num_interactions / max(data.num_users, 1), 2),
        }

    def train_batches(
        self, data: Interactions, batch_size: int, generator: torch.Generator
    ) -> Iterable[Batch]:
        return train_batches(data, self.options.max_len, batch_size, generator, self.options.length_pool)

    def batch_tokens(self, batch: Batch) -> int:
        return int((batch.targets > 0).sum())

    def build_model(self, backbone: nn.Module, ctx: BuildContext, data: Interactions) -> SeqRecModel:
        layout = Jagged.from_valid if self.options.jagged else padded_layout
        return SeqRecModel(backbone, data.num_items, ctx.dim, layout, self.options.normalize)

    def loss_problem(
        self, loss: losses.LossOptions, data: Interactions
    ) -> tuple[tuple[str | int, ...], str] | None:
        negatives = getattr(loss.root, "negatives", None)
        if negatives is not None and negatives > data.num_items:
            return ("negatives",), (
                f"{negatives} negatives per target, but the data have only {data.num_items} items "
                f"to draw them from"
            )
        return None

    def split_batch(self, model: SeqRecModel, batch: Batch, parts: int) -> list[tuple[Batch, float]]:
        """The batch's rows sorted by length and cut into ``parts`` groups, each padded to its own
        longest row (:func:`length_groups`), each weighted by its share of the batch's targets:
        the groups' weighted means are the batch's mean over real target positions."""
        total = self.batch_tokens(batch)
        groups = length_groups(batch, parts, model.num_items + 1)
        return [(group, self.batch_tokens(group) / total) for group in groups]

    def loss(
        self, model: SeqRecModel, batch: Batch, loss: losses.LossOptions, generator: torch.Generator
    ) -> Tensor:
        """Mean over real target positions."""
        where = batch.targets > 0
        seen = None
        if batch.seen is not None:
            seen = losses.SeenItems(batch.seen, model.num_items + 1, where.nonzero(as_tuple=True)[0])
        return losses.compute(
            loss, model.head(model(batch)[where]), batch.targets[where], model.table(), generator, seen
        )

    @torch.no_grad()
    def evaluate(
        self,
        model: SeqRecModel,
        data: Interactions,
        split: str,
        metrics: list[str],
        device: torch.device,
        batch_size: int,
    ) -> Evaluation:
        protocol = self.options.protocol
        sampled = any(M.protocol(name, protocol) == "sampled" for name in metrics)
        return evaluate(
            model,
            data,
            split,
            metrics,
            device,
            batch_size,
            self.options.max_len,
            protocol,
            self.negatives(data, split) if sampled else None,
        )

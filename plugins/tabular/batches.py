"""Rows as batches of feature tokens. Dimensions: ``b`` rows, ``k`` numeric, ``m`` categorical."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, fields, replace

import numpy as np
import torch
from torch import Tensor

from .data import Split


@dataclass
class Batch:
    numeric: Tensor  # [b, k] float32, scaled
    categorical: Tensor  # [b, m] long, per-feature codes
    y: Tensor  # [b] float32 (regression) or long (class index)
    rows: Tensor  # [b] long, the evaluation unit

    def to(self, device: torch.device | str) -> Batch:
        return replace(self, **{f.name: getattr(self, f.name).to(device) for f in fields(self)})

    def __len__(self) -> int:
        return len(self.y)


def collate(split: Split, index: np.ndarray) -> Batch:
    return Batch(
        numeric=torch.from_numpy(split.numeric[index]),
        categorical=torch.from_numpy(split.categorical[index]),
        y=torch.from_numpy(split.y[index]),
        rows=torch.from_numpy(split.rows[index]),
    )


def train_batches(split: Split, batch_size: int, generator: torch.Generator) -> Iterator[Batch]:
    order = torch.randperm(len(split), generator=generator, device=generator.device).cpu().numpy()
    for first in range(0, len(order), batch_size):
        yield collate(split, order[first : first + batch_size])


def eval_batches(split: Split, batch_size: int) -> Iterator[Batch]:
    for first in range(0, len(split), batch_size):
        yield collate(split, np.arange(first, min(first + batch_size, len(split))))

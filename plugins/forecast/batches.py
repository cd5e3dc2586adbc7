"""Windows of a series as batches of channel tokens.

A window starting at row ``s`` has input ``values[s : s + w]`` and target
``values[s + w : s + w + H]``; a batch holds them channel-major. Dimensions: ``b`` windows,
``c`` channels (the tokens), ``w`` lookback, ``H`` horizon.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, fields, replace

import numpy as np
import torch
from numpy.lib.stride_tricks import sliding_window_view
from torch import Tensor

from ablate.components import TokenContext

from .data import Series


@dataclass
class Batch:
    inputs: Tensor  # [b, c, w] float32, normalised
    targets: Tensor  # [b, c, H] float32, normalised
    starts: Tensor  # [b] long, first input row of each window (the evaluation unit)

    def to(self, device: torch.device | str) -> Batch:
        return replace(self, **{f.name: getattr(self, f.name).to(device) for f in fields(self)})

    def token_context(self, values: Tensor) -> TokenContext:
        """Channels as an unordered token set; ``values [b, c, w]`` are the windows the model
        embeds (the masks of ``channel_masked`` are built from them)."""
        b, c = self.inputs.shape[:2]
        return TokenContext(
            valid=torch.ones(b, c, dtype=torch.bool, device=self.inputs.device),
            causal=False,
            positions=torch.arange(c, device=self.inputs.device).expand(b, c),
            values=values,
        )


def collate(series: Series, starts: np.ndarray) -> Batch:
    w, h = series.lookback, series.horizon
    span = sliding_window_view(series.values, w + h, axis=0)  # [t - w - h + 1, c, w + h], a view
    windows = span[starts]  # [b, c, w + h]
    return Batch(
        inputs=torch.from_numpy(np.ascontiguousarray(windows[..., :w])),
        targets=torch.from_numpy(np.ascontiguousarray(windows[..., w:])),
        starts=torch.from_numpy(starts),
    )


def train_batches(series: Series, batch_size: int, generator: torch.Generator) -> Iterator[Batch]:
    """One epoch over the training windows, shuffled by ``generator``."""
    starts = series.window_starts("train")
    order = torch.randperm(len(starts), generator=generator, device=generator.device).cpu().numpy()
    for first in range(0, len(order), batch_size):
        yield collate(series, starts[order[first : first + batch_size]])


def eval_batches(series: Series, split: str, batch_size: int) -> Iterator[Batch]:
    """Every window of ``split`` in time order."""
    starts = series.window_starts(split)
    for first in range(0, len(starts), batch_size):
        yield collate(series, starts[first : first + batch_size])

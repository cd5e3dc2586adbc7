"""The forecast model: channels as tokens (iTransformer / DUET).

Each channel's lookback window ``[w]`` is embedded to ``d`` by one linear map (the "inverted"
embedding), the backbone mixes the ``c`` channel tokens, and a linear head maps each token to
the ``H`` future values. With ``instance_norm`` every window is first normalised per channel
(mean / std over its ``w`` rows, RevIN without affine parameters) and the forecast is mapped
back. Dimensions: ``b`` windows, ``c`` channels, ``w`` lookback, ``H`` horizon, ``d`` width.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .batches import Batch

EPS = 1e-5


class ForecastModel(nn.Module):
    def __init__(self, backbone: nn.Module, lookback: int, horizon: int, dim: int, instance_norm: bool):
        super().__init__()
        self.embed = nn.Linear(lookback, dim)
        self.backbone = backbone
        self.head = nn.Linear(dim, horizon)
        self.instance_norm = instance_norm

    def forward(self, batch: Batch) -> Tensor:
        """Forecast ``[b, c, H]`` on the data's (training-statistics) normalised scale."""
        x = batch.inputs  # [b, c, w]
        if self.instance_norm:
            mean = x.mean(-1, keepdim=True)
            std = torch.sqrt(x.var(-1, keepdim=True, unbiased=False) + EPS)
            x = (x - mean) / std
        hidden = self.backbone(self.embed(x), batch.token_context(values=x))  # [b, c, d]
        y = self.head(hidden)  # [b, c, H]
        if self.instance_norm:
            y = y * std + mean
        return y

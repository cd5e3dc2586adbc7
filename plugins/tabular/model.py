"""Feature tokenizer and readout head (FT-Transformer, Gorishniy et al. 2021; T2G-Former).

Tokens are ``[readout, numeric_1..k, categorical_1..m]`` (``n = 1 + k + m``)::

    T_readout = W_0                                  (the [CLS] token: weight row 0 times 1)
    T_j       = x_j · W_j + B_j                      numeric feature j, W, B ∈ R^{k × d}
    T_{k+j}   = E[c_j + offset_j] + B_{k+j}          categorical feature j, one table for all
                                                     features, offset_j = Σ_{i<j} cardinality_i

The backbone mixes the set of tokens (``positions`` = the feature's index, ``readout`` marks the
[CLS] token); the head reads the readout token: ``ReLU → Linear(d, out)`` after the backbone's
final norm. Dimensions: ``b`` rows, ``k`` numeric, ``m`` categorical, ``n`` tokens, ``d`` width.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ablate.components import TokenContext

from .batches import Batch


class FeatureTokenizer(nn.Module):
    def __init__(self, numeric: int, cardinalities: list[int], dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(numeric + 1, dim))  # row 0: the readout token
        self.bias = nn.Parameter(torch.empty(numeric + len(cardinalities), dim))  # no bias on the readout
        self.categories = nn.Embedding(sum(cardinalities), dim) if cardinalities else None
        offsets = (
            torch.tensor([0, *cardinalities[:-1]], dtype=torch.long).cumsum(0)
            if cardinalities
            else torch.zeros(0, dtype=torch.long)
        )
        self.register_buffer("offsets", offsets, persistent=False)
        # FT-Transformer's initialisation (as nn.Linear's default)
        for p in [self.weight, self.bias] + ([self.categories.weight] if self.categories is not None else []):
            nn.init.kaiming_uniform_(p, a=math.sqrt(5))

    @property
    def tokens(self) -> int:
        return self.weight.shape[0] + len(self.offsets)

    def forward(self, numeric: Tensor, categorical: Tensor) -> Tensor:
        """``numeric [b, k]``, ``categorical [b, m]`` → tokens ``[b, 1 + k + m, d]``."""
        ones = torch.ones(numeric.shape[0], 1, dtype=self.weight.dtype, device=numeric.device)
        x = torch.cat([ones, numeric.to(self.weight.dtype)], dim=1)[:, :, None] * self.weight  # [b, 1 + k, d]
        if self.categories is not None:
            x = torch.cat([x, self.categories(categorical + self.offsets)], dim=1)
        bias = torch.cat([torch.zeros_like(self.bias[:1]), self.bias])  # [n, d]
        return x + bias


class TabularModel(nn.Module):
    def __init__(self, backbone: nn.Module, numeric: int, cardinalities: list[int], dim: int, outputs: int):
        super().__init__()
        self.tokenizer = FeatureTokenizer(numeric, cardinalities, dim)
        self.backbone = backbone
        self.head = nn.Sequential(nn.ReLU(), nn.Linear(dim, outputs))

    @staticmethod
    def token_context(b: int, n: int, device: torch.device) -> TokenContext:
        readout = torch.zeros(b, n, dtype=torch.bool, device=device)
        readout[:, 0] = True
        return TokenContext(
            valid=torch.ones(b, n, dtype=torch.bool, device=device),
            causal=False,
            positions=torch.arange(n, device=device).expand(b, n),
            readout=readout,
        )

    def forward(self, batch: Batch) -> Tensor:
        """Head outputs ``[b, out]`` (regression: standardised value; classes: logits)."""
        x = self.tokenizer(batch.numeric, batch.categorical)  # [b, n, d]
        hidden = self.backbone(x, self.token_context(x.shape[0], x.shape[1], x.device))
        return self.head(hidden[:, 0])

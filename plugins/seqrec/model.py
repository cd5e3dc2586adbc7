"""The seqrec model: item embedding → backbone → hidden states, scored against the same table.

Items are embedded from a table ``[m, d]`` (``m = num_items + 1``, row 0 padding), scaled by
``√d`` as in SASRec; the backbone adds position / time information itself. Scores are dot
products with the input table (weight tying, SASRec / FuXi-α), or cosine similarities when
``normalize`` is set (HSTU / FuXi-α's L2-normalised embeddings).
"""

from __future__ import annotations

from collections.abc import Callable

import torch.nn.functional as F
from torch import Tensor, nn

from ablate.jagged import Jagged, Padded

from .batches import Batch

Layout = Callable[[Tensor], "Padded | Jagged"]  # valid [b, n] → the blocks' token layout


def padded_layout(valid: Tensor) -> Padded:
    return Padded()


class SeqRecModel(nn.Module):
    """``layout`` makes the backbone's token layout from each batch's ``valid`` mask:
    ``Jagged.from_valid`` (position-wise layers on real tokens only) or ``padded_layout``."""

    def __init__(
        self,
        backbone: nn.Module,
        num_items: int,
        dim: int,
        layout: Layout = padded_layout,
        normalize: bool = False,
    ):
        super().__init__()
        self.layout = layout
        self.normalize = normalize
        self.items = nn.Embedding(num_items + 1, dim, padding_idx=0)
        # Xavier-normal, as SASRec (std √(2 / (m + d)), ~0.02 for ML-1M; HSTU / FuXi-α use 0.02):
        # Adam moves every element by ~lr per step, so a small table learns in few epochs.
        nn.init.xavier_normal_(self.items.weight)
        self.items.weight.data[0].zero_()
        self.backbone = backbone
        self.scale = dim**0.5

    @property
    def num_items(self) -> int:
        return self.items.num_embeddings - 1

    def forward(self, batch: Batch, last_only: bool = False) -> Tensor:
        """Hidden states ``[b, n, d]``; position ``i`` has seen items ``0..i``. With ``last_only``
        ``[b, d]`` at each user's last item only (ranking; the final block computes just those)."""
        x = self.items(batch.items) * self.scale
        tokens = batch.token_context()
        tokens.layout = self.layout(batch.valid)
        return self.backbone(x, tokens, last_only=True) if last_only else self.backbone(x, tokens)

    def head(self, hidden: Tensor) -> Tensor:
        """Hidden states as they meet the item table: L2-normalised under ``normalize``."""
        return F.normalize(hidden, dim=-1) if self.normalize else hidden

    def table(self) -> Tensor:
        """``[m, d]`` item vectors that outputs are scored against (the tied input table,
        L2-normalised under ``normalize``; padding row 0 stays zero)."""
        return F.normalize(self.items.weight, dim=-1) if self.normalize else self.items.weight

    def scores(self, hidden: Tensor) -> Tensor:
        """``[..., d]`` → ``[..., m]`` scores of every item (column 0 is padding)."""
        return self.head(hidden) @ self.table().T

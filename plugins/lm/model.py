"""The language model around the backbone: token embedding → blocks → final norm → logits.

The embedding table ``E [V, d]`` starts ``N(0, 0.02²)`` (GPT-2, LLaMA); with ``tie_embeddings``
the output head is ``E`` itself (``logits = h Eᵀ``, MiniMind ties its ``lm_head`` so), else a
bias-free ``Linear(d, V)``. Positions come from the backbone's bias channels (``rope`` for
MiniMind). Dimensions: ``b`` windows, ``n`` positions, ``t`` real positions, ``d`` width, ``V``
vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor, nn

from ablate.jagged import Jagged, Padded

from .batches import Batch

EMBEDDING_STD = 0.02


def padded_layout(valid: Tensor) -> Padded:
    return Padded()


class LMModel(nn.Module):
    def __init__(
        self,
        backbone: nn.Module,
        vocab_size: int,
        dim: int,
        layout: Callable[[Tensor], Padded | Jagged] = padded_layout,
        tie_embeddings: bool = True,
    ):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, dim)
        nn.init.normal_(self.embed.weight, std=EMBEDDING_STD)
        self.backbone = backbone
        self.layout = layout
        self.head = None if tie_embeddings else nn.Linear(dim, vocab_size, bias=False)

    def forward(self, batch: Batch) -> Tensor:
        """Hidden states ``[b, n, d]``; position ``i`` has read inputs ``0..i`` of its window."""
        tokens = batch.token_context()
        tokens.layout = self.layout(batch.valid)
        return self.backbone(self.embed(batch.inputs), tokens)

    def logits(self, hidden: Tensor) -> Tensor:
        """``[..., d] → [..., V]``."""
        return self.head(hidden) if self.head is not None else hidden @ self.embed.weight.T

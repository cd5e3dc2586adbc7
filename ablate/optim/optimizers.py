"""``train.optimizer``: the optimisers a study may name, defined once (the schema validates
against the keys, the training loop constructs from the values)."""

from __future__ import annotations

import torch

from ablate.schema import Vocabulary

OPTIMIZERS: Vocabulary[type[torch.optim.Optimizer]] = Vocabulary(
    "optimizer",
    {
        "adam": torch.optim.Adam,
        "adamw": torch.optim.AdamW,
    },
)

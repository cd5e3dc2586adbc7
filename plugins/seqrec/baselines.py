"""seqrec's trivial baseline and its protocol sentence for the report.

``popularity``: every user gets the same scores, each item's count over the items seen up to the
test point (:func:`.batches.history` of the test split: each user's training items and validation
item, which the model reads at test time too: the strongest count its inputs allow, where
training items only gave .0390 NDCG@10 on Musical Instruments against .0436), ranked with the task's own
candidates and tie rule (:mod:`.metrics`): the full protocol against every item the user has not
seen, the sampled one against the same drawn negatives the variants are ranked against. Items of
equal count tie, and ties count against the target, as for a model.
"""

from __future__ import annotations

import numpy as np
import torch

from ablate.tasks import Baseline

from . import metrics as M
from .batches import history, target
from .data import Interactions
from .evaluation import summarise

CHUNK = 1024  # users ranked at once


def popularity(
    data: Interactions, metrics: list[str], protocol: str, negatives: np.ndarray | None
) -> Baseline:
    """The popularity baseline on the test split; ``negatives [u, k]``: the sampled protocol's
    test candidates (rows aligned with ``data``), needed when a metric uses that protocol."""
    protocols = {M.protocol(name, protocol) for name in metrics}
    counts = np.bincount(
        np.concatenate([history(s, "test") for s in data.sequences]), minlength=data.num_items + 1
    )
    scores = torch.from_numpy(counts.astype(np.float64))
    ranks: dict[str, list[torch.Tensor]] = {p: [] for p in protocols}
    for start in range(0, data.num_users, CHUNK):
        chunk = data.sequences[start : start + CHUNK]
        targets = torch.tensor([target(s, "test") for s in chunk], dtype=torch.long)
        every = scores.expand(len(chunk), -1)
        if "full" in protocols:
            exclude = M.exclusion_mask([history(s, "test") for s in chunk], targets, data.num_items)
            ranks["full"].append(M.ranks(every, targets, exclude))
        if "sampled" in protocols:
            drawn = torch.from_numpy(negatives[start : start + CHUNK])
            ranks["sampled"].append(M.sampled_ranks(every, targets, drawn))
    found = summarise(data.users, {p: torch.cat(r).numpy() for p, r in ranks.items()}, metrics, protocol)
    about = (
        "every user gets the items ranked by their count up to the test point (training and validation items)"
    )
    return Baseline("popularity", about, found.summary)


def protocol_text(protocol: str, sampled_negatives: int, metrics: list[str]) -> str:
    """The split, the candidates each metric ranks the target against, and the tie rule."""
    used = {M.protocol(name, protocol) for name in metrics}
    against = {
        "full": "every item the user has not interacted with before the target (full ranking)",
        "sampled": f"{sampled_negatives} items drawn once per split, uniformly with replacement, from those "
        "the user never interacted with (the sampled protocol; the same draw for every variant and seed)",
    }
    if len(used) == 1:
        ranked = f"against {against[next(iter(used))]}"
    else:
        ranked = "; ".join(f"under the {p} protocol against {against[p]}" for p in sorted(used))
    return (
        "Leave-one-out split: each user's last item is the test target, the one before it the "
        "validation target, and the earlier items are training data; every user is one test unit. "
        f"The test target is ranked {ranked}. Ties count against the target: an item scoring equal "
        "to it ranks above it, so a constant score gives the worst rank. "
        "HR@K = 1 when the target ranks in the top K, NDCG@K = 1/log2(rank + 1) there (0 beyond; rank 1 is "
        "the top), MRR = 1/rank; each is the mean over users."
    )

"""Evaluation of a model and of the training-popularity baseline: full ranking over unseen
items and/or the sampled protocol (see :mod:`.metrics`), from one pass over the users."""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from ablate.tasks import Evaluation, cpu_streams

from . import metrics as M
from .batches import eval_batches, history, target, train_part
from .data import Interactions
from .model import SeqRecModel


@torch.no_grad()
def evaluate(
    model: SeqRecModel,
    data: Interactions,
    split: str,
    metrics: list[str],
    device: torch.device,
    batch_size: int,
    max_len: int,
    protocol: str = "full",
    negatives: np.ndarray | None = None,
) -> Evaluation:
    """Rank items by the score at each user's last history position. ``negatives [u, k]``
    (rows aligned with ``data``) are the sampled protocol's candidates; needed when a metric
    uses that protocol."""
    device = torch.device(device)
    protocols = {M.protocol(name, protocol) for name in metrics}
    if "sampled" in protocols and negatives is None:
        raise ValueError("the sampled protocol needs negatives")
    num_items = data.num_items

    def rank(prepared: tuple) -> tuple[Tensor, dict[str, Tensor]]:
        batch, histories, rows_in_data = prepared
        batch = batch.to(device)
        rows = torch.arange(len(histories), device=device)
        last = batch.lengths - 1
        hidden = model(batch, last_only=True)  # [b, d]
        # float32 scores even under bf16 autocast: rounding would create ties, which count
        # against the target (a float64 model keeps float64: the exactness tests train one).
        with torch.autocast(device.type, enabled=False):
            scores = model.scores(hidden.to(torch.promote_types(hidden.dtype, torch.float32)))  # [b, m]
        targets = batch.targets[rows, last]
        found = {}
        if "full" in protocols:
            found["full"] = M.ranks(scores, targets, M.exclusion_mask(histories, targets, num_items)).cpu()
        if "sampled" in protocols:
            drawn = torch.from_numpy(negatives[rows_in_data]).to(device)
            found["sampled"] = M.sampled_ranks(scores, targets, drawn).cpu()
        return batch.users.cpu(), found

    was_training = model.training
    model.eval()
    users, ranks = [], {p: [] for p in protocols}
    try:
        for batch_users, found in cpu_streams(rank, eval_batches(data, split, max_len, batch_size), device):
            users.append(batch_users)
            for p, r in found.items():
                ranks[p].append(r)
    finally:
        model.train(was_training)
    by_protocol = {p: torch.cat(r).numpy() for p, r in ranks.items()}
    return summarise(torch.cat(users).numpy(), by_protocol, metrics, protocol)


def popularity_evaluation(
    data: Interactions, split: str, metrics: list[str], batch_size: int = 1024
) -> Evaluation:
    """Rank items by how often they occur in the training parts, with the same exclusions
    (full ranking)."""
    sampled = [name for name in metrics if M.protocol(name, "full") == "sampled"]
    if sampled:
        raise ValueError(f"the popularity baseline ranks fully; got sampled-protocol metrics {sampled}")
    seen = np.concatenate([train_part(s) for s in data.sequences])
    counts = np.bincount(seen, minlength=data.num_items + 1)
    scores = torch.from_numpy(counts.astype(np.float64))
    ranks = []
    for start in range(0, data.num_users, batch_size):
        chunk = data.sequences[start : start + batch_size]
        histories = [history(s, split) for s in chunk]
        targets = torch.tensor([target(s, split) for s in chunk], dtype=torch.long)
        exclude = M.exclusion_mask(histories, targets, data.num_items)
        ranks.append(M.ranks(scores.expand(len(chunk), -1), targets, exclude))
    return summarise(data.users, {"full": torch.cat(ranks).numpy()}, metrics, "full")


def summarise(
    users: np.ndarray, ranks: dict[str, np.ndarray], metrics: list[str], protocol: str
) -> Evaluation:
    """Per-user metric values (rows ordered by user id) and their means; ``ranks`` per protocol,
    plain metric names use ``protocol``."""
    order = np.argsort(users, kind="stable")
    per_unit = pd.DataFrame({"unit": users[order]})
    for name in metrics:
        per_unit[name] = M.values(name, ranks[M.protocol(name, protocol)][order])
    summary = {name: float(per_unit[name].mean()) for name in metrics}
    return Evaluation(summary=summary, per_unit=per_unit)

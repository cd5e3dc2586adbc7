"""Ranking metrics for next-item prediction, under two protocols.

``rank`` is the number of other candidate items scoring at least as high as the target
(ties count against the target). Candidates (``full`` protocol) are all items except padding
(index 0) and the user's history, but the target always stays a candidate; under the
``sampled`` protocol they are a fixed draw of items the user never interacted with. A metric
name may pin its protocol with a prefix (``sampled.ndcg@10``); plain names use the task's. From a rank:
``hr@K = [rank < K]``, ``ndcg@K = 1/log2(rank + 2)`` if ``rank < K`` else 0,
``mrr = 1/(rank + 1)``. Dimensions: ``b`` users, ``m`` items including padding.
"""

from __future__ import annotations

import re

import numpy as np
import torch
from torch import Tensor

ACCEPTED = "hr@K, ndcg@K (K a positive integer) or mrr, optionally prefixed 'full.' or 'sampled.'"
_PATTERN = re.compile(r"(?:(full|sampled)\.)?(?:(hr|ndcg)@([1-9][0-9]*)|mrr)")


def parse(name: str) -> tuple[str, int | None]:
    """``'ndcg@10'`` → ``('ndcg', 10)``, ``'mrr'`` → ``('mrr', None)``; ValueError otherwise.
    A protocol prefix is accepted and left out (see :func:`protocol`)."""
    match = _PATTERN.fullmatch(name.lower())
    if not match:
        raise ValueError(f"unknown metric '{name}' for seqrec; expected {ACCEPTED}")
    return (match.group(2), int(match.group(3))) if match.group(2) else ("mrr", None)


def protocol(name: str, default: str) -> str:
    """The protocol ``name`` is ranked under: its prefix, else ``default``."""
    match = _PATTERN.fullmatch(name.lower())
    return match.group(1) if match and match.group(1) else default


def check(name: str) -> str | None:
    try:
        parse(name)
    except ValueError as exc:
        return str(exc)
    return None


def exclusion_mask(histories: list[np.ndarray], targets: Tensor, num_items: int) -> Tensor:
    """``[b, m]`` bool, True where an item is not a candidate: padding and seen items,
    never the target."""
    b = len(histories)
    mask = torch.zeros(b, num_items + 1, dtype=torch.bool, device=targets.device)
    rows = np.repeat(np.arange(b), [len(h) for h in histories])
    cols = np.concatenate(histories) if b else np.zeros(0, dtype=np.int64)
    mask[torch.from_numpy(rows).to(targets.device), torch.from_numpy(cols).to(targets.device)] = True
    mask[:, 0] = True
    mask[torch.arange(b, device=targets.device), targets] = False
    return mask


def ranks(scores: Tensor, targets: Tensor, exclude: Tensor) -> Tensor:
    """``[b]`` long: how many candidates (other than the target) score ≥ the target.

    NaN scores count against the target: a NaN candidate ranks above it, a NaN target last.
    """
    target_score = scores.gather(1, targets[:, None])
    # "not below" is ≥ with NaN on either side counted as above: one comparison pass. The target's
    # own column is taken off whatever ``exclude`` says about it.
    above = (scores < target_score).logical_not_().logical_and_(exclude.logical_not())
    return above.sum(1) - above.gather(1, targets[:, None]).squeeze(1).long()


def sampled_ranks(scores: Tensor, targets: Tensor, negatives: Tensor) -> Tensor:
    """``[b]`` long: how many of each row's sampled ``negatives [b, k]`` score ≥ the target
    (a negative drawn twice counts twice, as in SASRec's evaluation). NaN counts against the target."""
    target_score = scores.gather(1, targets[:, None])
    return (scores.gather(1, negatives) < target_score).logical_not_().sum(1)  # NaN on either side: above


def draw_negatives(sequences: list[np.ndarray], num_items: int, count: int, seed: int) -> np.ndarray:
    """``[u, count]`` items per user, uniform (with replacement, as SASRec) over the items in
    ``1..num_items`` the user never interacted with."""
    rng = np.random.default_rng(seed)
    every = np.arange(1, num_items + 1)
    out = np.empty((len(sequences), count), dtype=np.int64)
    for row, seq in enumerate(sequences):
        unseen = np.setdiff1d(every, seq, assume_unique=False)
        if not len(unseen):
            raise ValueError(f"user {row} interacted with every item: no negatives to sample")
        out[row] = unseen[rng.integers(0, len(unseen), size=count)]
    return out


def values(name: str, rank: np.ndarray) -> np.ndarray:
    """Per-user metric values from 0-based ranks."""
    kind, k = parse(name)
    rank = np.asarray(rank, dtype=np.float64)
    if kind == "hr":
        return (rank < k).astype(np.float64)
    if kind == "ndcg":
        return np.where(rank < k, 1.0 / np.log2(rank + 2.0), 0.0)
    return 1.0 / (rank + 1.0)

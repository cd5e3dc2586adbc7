"""Token windows and right-padded batches of them.

A split's documents are encoded one after another into ``ids [T]`` (each opened by its
document-start id) with ``nbytes [T]``, the bytes of text each token covers. A document of ``L``
tokens makes ``L − 1`` predictions, cut into windows of at most ``w`` of them: window ``k`` reads
``ids[s : s + len + 1]`` (inputs ``[: len]``, targets ``[1 :]``) with ``s`` the document's start
plus ``k·w``. No window spans two documents, so attention never crosses a document boundary; a
document's last window is shorter and its row is right-padded (with ``jagged: true`` the
position-wise layers see the real tokens only). Dimensions: ``b`` windows, ``n`` positions,
``T`` tokens, ``W`` windows.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, fields, replace

import numpy as np
import torch
from torch import Tensor

from ablate.components import TokenContext

from .vocab import Encoded


@dataclass
class Tokens:
    """One split's tokens and windows."""

    ids: np.ndarray  # [T] int64
    nbytes: np.ndarray  # [T] int32, bytes of text each token covers (0 for document starts)
    starts: np.ndarray  # [W] int64, each window's first token
    lengths: np.ndarray  # [W] int64, its predictions (≤ w)
    documents: int

    @property
    def windows(self) -> int:
        return len(self.starts)

    @property
    def predictions(self) -> int:
        return int(self.lengths.sum())

    def window_bytes(self) -> np.ndarray:
        """``[W]``: the bytes of text each window's targets cover."""
        cum = np.concatenate([[0], np.cumsum(self.nbytes, dtype=np.int64)])
        return cum[self.starts + self.lengths + 1] - cum[self.starts + 1]


def windows_of(encoded: list[Encoded], window: int) -> Tokens:
    """Every document's windows of at most ``window`` predictions (see the module note)."""
    docs = [e for e in encoded if len(e.ids) > 1]  # a document start alone predicts nothing
    lengths_per_doc = np.array([len(e.ids) for e in docs], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths_per_doc)])[:-1]
    starts, lengths = [], []
    for offset, size in zip(offsets, lengths_per_doc, strict=True):
        local = np.arange(0, size - 1, window, dtype=np.int64)
        starts.append(offset + local)
        lengths.append(np.minimum(window, size - 1 - local))
    empty = np.zeros(0, np.int64)
    return Tokens(
        ids=np.concatenate([e.ids for e in docs]).astype(np.int64) if docs else np.zeros(0, np.int64),
        nbytes=np.concatenate([e.nbytes for e in docs]) if docs else np.zeros(0, np.int32),
        starts=np.concatenate(starts) if starts else empty,
        lengths=np.concatenate(lengths) if lengths else empty,
        documents=len(docs),
    )


@dataclass
class Batch:
    inputs: Tensor  # [b, n] long, 0 at padding
    targets: Tensor  # [b, n] long, the next token at each position, 0 at padding
    valid: Tensor  # [b, n] bool, True at real positions
    windows: Tensor  # [b] long, each row's window index (the evaluation unit)

    def to(self, device: torch.device | str) -> Batch:
        return replace(self, **{f.name: getattr(self, f.name).to(device) for f in fields(self)})

    def token_context(self) -> TokenContext:
        b, n = self.inputs.shape
        positions = torch.arange(n, device=self.inputs.device).expand(b, n)
        return TokenContext(valid=self.valid, causal=True, positions=positions)


def collate(tokens: Tokens, rows: np.ndarray) -> Batch:
    starts, lengths = tokens.starts[rows], tokens.lengths[rows]
    n = int(lengths.max())
    at = np.arange(n)
    valid = at[None, :] < lengths[:, None]  # [b, n]
    index = np.where(valid, starts[:, None] + at[None, :], 0)
    ids = tokens.ids
    return Batch(
        inputs=torch.from_numpy(np.where(valid, ids[index], 0)),
        targets=torch.from_numpy(np.where(valid, ids[index + 1], 0)),
        valid=torch.from_numpy(valid),
        windows=torch.from_numpy(np.asarray(rows, dtype=np.int64)),
    )


def train_batches(
    tokens: Tokens, batch_size: int, generator: torch.Generator, per_epoch: int | None
) -> Iterator[Batch]:
    """One epoch: the windows shuffled by ``generator`` (the first ``per_epoch`` of them, if set)."""
    order = torch.randperm(tokens.windows, generator=generator, device=generator.device).cpu().numpy()
    if per_epoch is not None:
        order = order[:per_epoch]
    for first in range(0, len(order), batch_size):
        yield collate(tokens, order[first : first + batch_size])


def eval_batches(tokens: Tokens, batch_size: int) -> Iterator[Batch]:
    """Every window of a held-out split, in order."""
    for first in range(0, tokens.windows, batch_size):
        yield collate(tokens, np.arange(first, min(first + batch_size, tokens.windows)))

"""The lm task's trivial baselines, scored on the test split's windows as :mod:`.evaluation`
scores a model (summed over every target token, bits per byte over the bytes they cover):

- ``uniform``: every token the model can predict equally likely: the vocabulary less the
  document-start id (never a target), so ``ln(V − 1)`` nats a token — 8 bits per byte with byte
  tokens;
- ``unigram``: each token's frequency among the training split's targets, add-one smoothed over
  those ``V − 1`` tokens (so an unseen token costs finite bits), context ignored.
"""

from __future__ import annotations

import math

import numpy as np

from ablate.tasks import Baseline

from .batches import Tokens
from .evaluation import summary


def targets(tokens: Tokens) -> np.ndarray:
    """``[N]`` every window's target ids, window after window (``ids[s + 1 : s + len + 1]``)."""
    ends = np.cumsum(tokens.lengths)
    within = np.arange(int(ends[-1]) if len(ends) else 0) - np.repeat(ends - tokens.lengths, tokens.lengths)
    return tokens.ids[np.repeat(tokens.starts + 1, tokens.lengths) + within]


def _scored(name: str, about: str, nll: float, test: Tokens, metrics: list[str]) -> Baseline:
    whole = summary(np.array([nll]), np.array([test.predictions]), np.array([int(test.window_bytes().sum())]))
    return Baseline(name, about, {m: whole[m] for m in metrics})


def trivial(train: Tokens, test: Tokens, vocab_size: int, bos: int, metrics: list[str]) -> list[Baseline]:
    """The uniform and unigram baselines' test metrics (see the module note)."""
    predictable = vocab_size - 1  # every id but the document start
    uniform = _scored(
        "uniform",
        f"every one of the {predictable} predictable tokens equally likely",
        test.predictions * math.log(predictable),
        test,
        metrics,
    )
    counts = np.bincount(targets(train), minlength=vocab_size).astype(np.float64) + 1.0
    counts[bos] = 0.0  # never a target: no probability
    log_p = np.log(counts, where=counts > 0, out=np.full(vocab_size, -np.inf)) - math.log(counts.sum())
    unigram = _scored(
        "unigram",
        "each token's training frequency (add-one smoothed), context ignored",
        float(-log_p[targets(test)].sum()),
        test,
        metrics,
    )
    return [uniform, unigram]

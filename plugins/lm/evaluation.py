"""Held-out metrics of a language model, one evaluation unit per window.

For a split's windows with token negative log-likelihoods ``ℓ`` (nats), ``N`` predicted tokens and
``B`` bytes of text they cover (:mod:`.vocab`)::

    loss        = Σ ℓ / N                 mean cross-entropy per token (nats)
    perplexity  = exp(loss)
    bpb         = Σ ℓ / (ln 2 · B)        bits per byte: comparable across tokenizers

The summary is the split's figure (sums over every window: what papers report); the per-window
values (each window's own ``loss``, ``perplexity``, ``bpb``) feed the paired tests across units.
All three are lower-is-better.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import Tensor

from ablate.tasks import Evaluation

from .batches import Batch, Tokens, eval_batches
from .model import LMModel

METRICS = ("loss", "perplexity", "bpb")


def check(name: str) -> str | None:
    if name in METRICS:
        return None
    return f"unknown metric '{name}' for lm; expected one of {', '.join(METRICS)}"


def token_nll(model: LMModel, batch: Batch) -> Tensor:
    """``[t]`` float32 negative log-likelihoods of the batch's real targets, row-major."""
    hidden = model(batch)[batch.valid]  # [t, d]
    return F.cross_entropy(at_least_fp32(model.logits(hidden)), batch.targets[batch.valid], reduction="none")


def at_least_fp32(logits: Tensor) -> Tensor:
    """Logits for the cross-entropy: bf16 ones (autocast) in float32, float64 ones kept."""
    return logits.to(torch.promote_types(logits.dtype, torch.float32))


def window_metrics(nll: np.ndarray, tokens: np.ndarray, nbytes: np.ndarray) -> dict[str, np.ndarray]:
    """Per-window metrics from each window's summed NLL, tokens and bytes."""
    loss = nll / np.maximum(tokens, 1)
    return {"loss": loss, "perplexity": np.exp(loss), "bpb": nll / (math.log(2) * np.maximum(nbytes, 1))}


def summary(nll: np.ndarray, tokens: np.ndarray, nbytes: np.ndarray) -> dict[str, float]:
    loss = float(nll.sum() / max(int(tokens.sum()), 1))
    return {
        "loss": loss,
        "perplexity": math.exp(loss),
        "bpb": float(nll.sum() / (math.log(2) * max(int(nbytes.sum()), 1))),
    }


@torch.no_grad()
def evaluate(
    model: LMModel, split: Tokens, metrics: list[str], device: torch.device, batch_size: int
) -> Evaluation:
    model.eval()
    nll = np.zeros(split.windows, dtype=np.float64)
    for batch in eval_batches(split, batch_size):
        batch = batch.to(device)
        per_token = token_nll(model, batch).double()
        b = batch.valid.shape[0]
        rows = torch.arange(b, device=per_token.device)[:, None].expand_as(batch.valid)[batch.valid]
        sums = per_token.new_zeros(b).index_add_(0, rows, per_token)
        nll[batch.windows.cpu().numpy()] = sums.cpu().numpy()
    tokens, nbytes = split.lengths, split.window_bytes()
    per_window = window_metrics(nll, tokens, nbytes)
    per_unit = pd.DataFrame({"unit": np.arange(split.windows), **{m: per_window[m] for m in metrics}})
    whole = summary(nll, tokens, nbytes)
    return Evaluation(summary={m: whole[m] for m in metrics}, per_unit=per_unit)

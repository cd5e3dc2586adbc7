# The same training code after a no-op refactor: comments and spacing only. The gate's key reads
# the syntax tree, so this is the incumbent's code, not a change.
"""A small NumPy MLP on a fixed synthetic two-class problem: the research loop's example
(``ablate gate``). Each trial's seed moves the initial weights and the order of the batches only;
the data are the same for every trial."""

from __future__ import annotations

import numpy as np


def make_data(rows: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1234)  # fixed: every trial sees the same split
    angle = rng.uniform(0, 1.5 * np.pi, rows)
    label = rng.integers(0, 2, rows)
    radius = 0.3 + angle / (1.5 * np.pi)
    sign = 1 - 2 * label
    points = np.stack([sign * radius * np.cos(angle), sign * radius * np.sin(angle)], axis=1)
    return points + 0.08 * rng.standard_normal((rows, 2)), label


def train(config: dict, seed: int, reporter) -> dict[str, float]:
    x, y = make_data(config["rows"])
    cut = int(0.7 * len(x))
    rng = np.random.default_rng(seed)
    width, lr = config["width"], config["lr"]
    w1 = rng.standard_normal((2, width)) * config["init_scale"]
    b1 = np.zeros(width)
    w2 = rng.standard_normal((width, 2)) * config["init_scale"]
    b2 = np.zeros(2)

    # one pass over the training rows per epoch, in the seed's order
    for _epoch in range(config["epochs"]):
        order = rng.permutation(cut)
        for start in range(0, cut, config["batch_size"]):
            idx = order[start : start + config["batch_size"]]
            h = np.maximum(x[idx] @ w1 + b1, 0.0)
            logits = h @ w2 + b2
            p = np.exp(logits - logits.max(axis=1, keepdims=True))
            p /= p.sum(axis=1, keepdims=True)
            p[np.arange(len(idx)), y[idx]] -= 1.0
            g = p / len(idx)
            gh = (g @ w2.T) * (h > 0)
            w2 -= lr * h.T @ g
            b2 -= lr * g.sum(axis=0)
            w1 -= lr * x[idx].T @ gh
            b1 -= lr * gh.sum(axis=0)

    # held-out accuracy
    h = np.maximum(x[cut:] @ w1 + b1, 0.0)
    accuracy = float(((h @ w2 + b2).argmax(axis=1) == y[cut:]).mean())
    return {"acc": accuracy}

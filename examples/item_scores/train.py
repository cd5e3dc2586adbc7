"""A small MLP on two noisy interleaved spirals that returns, beside its metrics, each test row's
score: ``{"valid.acc": …, "test.acc": …, "units": {"acc": {row id: 0 or 1, …}}}``, ``test.acc``
the rows' mean. With ``report: {variance: seeds_and_units}`` the verdicts then answer whether a
difference shows again on retraining *and* on new test rows like these (seeds crossed with units).
"""

from __future__ import annotations

import torch
from torch import nn


def make_data(rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The same rows for every trial (their own fixed seed): only training varies with the seed."""
    generator = torch.Generator().manual_seed(1234)
    angle = torch.rand(rows, generator=generator) * 3 * torch.pi
    label = torch.randint(0, 2, (rows,), generator=generator)
    sign = 1 - 2 * label.float()
    radius = angle / (3 * torch.pi)
    points = torch.stack([sign * radius * torch.cos(angle), sign * radius * torch.sin(angle)], dim=1)
    return points + 0.05 * torch.randn(rows, 2, generator=generator), label


def train(config: dict, seed: int, reporter) -> dict:
    x, y = make_data(config["rows"])
    cut_valid, cut_test = int(0.6 * len(x)), int(0.8 * len(x))
    width = config["width"]
    model = nn.Sequential(
        nn.Linear(2, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 2)
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=config["lr"])
    generator = torch.Generator().manual_seed(seed)  # batch order varies with the seed
    for epoch in range(1, config["epochs"] + 1):
        model.train()
        for batch in torch.randperm(cut_valid, generator=generator).split(32):
            loss = nn.functional.cross_entropy(model(x[batch]), y[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        reporter.report(epoch, {"train.loss": loss.item()})
    model.eval()
    with torch.no_grad():
        right = (model(x).argmax(dim=1) == y).float()
    test_rows = range(cut_test, len(x))
    return {
        "valid.acc": right[cut_valid:cut_test].mean().item(),
        "test.acc": right[cut_test:].mean().item(),
        "units": {"acc": {f"row{i}": right[i].item() for i in test_rows}},  # the test rows' scores
    }

"""A plain PyTorch training loop as an ablate task: a small MLP on a synthetic two-class problem.

ablate calls ``train(config, seed, reporter)`` once per (variant, seed): ``config`` is the
variant's ``model.config`` from study.yaml, and what it returns are the trial's final metrics.
"""

from __future__ import annotations

import torch
from torch import nn


def make_data(seed: int, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two noisy interleaved spirals; the data's own seed stays fixed so every trial sees the same
    split, and only training randomness varies with the trial's seed."""
    generator = torch.Generator().manual_seed(seed)
    angle = torch.rand(rows, generator=generator) * 3 * torch.pi
    label = torch.randint(0, 2, (rows,), generator=generator)
    radius = angle / (3 * torch.pi)
    sign = 1 - 2 * label.float()
    points = torch.stack([sign * radius * torch.cos(angle), sign * radius * torch.sin(angle)], dim=1)
    return points + 0.05 * torch.randn(rows, 2, generator=generator), label


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    with torch.no_grad():
        return (model(x).argmax(dim=1) == y).float().mean().item()


def train(config: dict, seed: int, reporter) -> dict[str, float]:
    x, y = make_data(seed=1234, rows=config["rows"])
    cut_valid, cut_test = int(0.6 * len(x)), int(0.8 * len(x))
    layers: list[nn.Module] = [nn.Linear(2, config["width"]), nn.ReLU()]
    for _ in range(config["depth"] - 1):
        layers += [nn.Linear(config["width"], config["width"]), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(config["width"], 2)).to(reporter.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=config["lr"])
    x, y = x.to(reporter.device), y.to(reporter.device)
    train_x, train_y = x[:cut_valid], y[:cut_valid]

    generator = torch.Generator().manual_seed(seed)  # batch order varies with the seed
    first_epoch = 1
    state = reporter.resume_state()  # a run stopped mid-trial continues here, exactly
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        generator.set_state(state["generator"])  # the next epoch's batch order, as if never stopped
        first_epoch = state["epoch"] + 1

    for epoch in range(first_epoch, config["epochs"] + 1):
        model.train()
        losses = []
        order = torch.randperm(len(train_x), generator=generator).to(reporter.device)
        for batch in order.split(config["batch_size"]):
            loss = nn.functional.cross_entropy(model(train_x[batch]), train_y[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        valid_acc = accuracy(model, x[cut_valid:cut_test], y[cut_valid:cut_test])
        reporter.report(epoch, {"train.loss": sum(losses) / len(losses), "valid.acc": valid_acc})
        if reporter.should_prune():  # a search's pruner stopped this trial
            break
        reporter.save_state(
            {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "generator": generator.get_state(),
                "epoch": epoch,
            }
        )

    return {
        "valid.acc": accuracy(model, x[cut_valid:cut_test], y[cut_valid:cut_test]),
        "test.acc": accuracy(model, x[cut_test:], y[cut_test:]),
    }

"""A PyTorch Lightning module as an ablate task: a small MLP on a synthetic two-class problem,
trained by Lightning's ``Trainer``; a ``Callback`` forwards each epoch's metrics to ablate.

ablate calls ``train(config, seed, reporter)`` once per (variant, seed): ``config`` is the
variant's ``model.config`` from study.yaml, and what it returns are the trial's final metrics.
Needs the ``lightning`` extra: ``pip install -c constraints.txt -e '.[lightning]'``.
"""

from __future__ import annotations

import logging

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


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


class SpiralClassifier(L.LightningModule):
    def __init__(self, width: int, depth: int, dropout: float, lr: float):
        super().__init__()
        layers: list[nn.Module] = [nn.Linear(2, width), nn.ReLU(), nn.Dropout(dropout)]
        for _ in range(depth - 1):
            layers += [nn.Linear(width, width), nn.ReLU(), nn.Dropout(dropout)]
        self.net = nn.Sequential(*layers, nn.Linear(width, 2))
        self.lr = lr

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.cross_entropy(self(x), y)
        self.log("train.loss", loss, on_step=False, on_epoch=True)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        self.log("valid.acc", (self(x).argmax(dim=1) == y).float().mean(), on_epoch=True)

    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        self.log("test.acc", (self(x).argmax(dim=1) == y).float().mean(), on_epoch=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.lr)


class ReportToAblate(L.Callback):
    """Each epoch's logged metrics to ablate's reporter (curves, a search's pruner); a pruned
    trial stops Lightning's loop."""

    def __init__(self, reporter):
        self.reporter = reporter

    def on_train_epoch_end(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        # Lightning validates before this hook, so the epoch's valid.acc is among the metrics.
        metrics = {key: float(value) for key, value in trainer.callback_metrics.items()}
        self.reporter.report(trainer.current_epoch + 1, metrics)
        if self.reporter.should_prune():
            trainer.should_stop = True


def train(config: dict, seed: int, reporter) -> dict[str, float]:
    # Lightning's banner ("GPU available…", tips) once per trial would bury ablate's progress.
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    x, y = make_data(seed=1234, rows=config["rows"])
    cut_valid, cut_test = int(0.6 * len(x)), int(0.8 * len(x))
    batch = config["batch_size"]
    # Batch order from the trial's seed: a generator of the loader's own, not the global one.
    train_loader = DataLoader(
        TensorDataset(x[:cut_valid], y[:cut_valid]),
        batch_size=batch,
        shuffle=True,
        generator=torch.Generator().manual_seed(seed),
    )
    valid_loader = DataLoader(TensorDataset(x[cut_valid:cut_test], y[cut_valid:cut_test]), batch_size=batch)
    test_loader = DataLoader(TensorDataset(x[cut_test:], y[cut_test:]), batch_size=batch)

    torch.manual_seed(seed)  # the initial weights and dropout masks
    model = SpiralClassifier(config["width"], config["depth"], config["dropout"], config["lr"])
    trainer = L.Trainer(
        max_epochs=config["epochs"],
        accelerator="gpu" if reporter.device.startswith("cuda") else "cpu",
        devices=1,
        # The seeds above make it repeatable; deterministic=True would switch torch's deterministic
        # algorithms on for the whole process, ablate's later trials in this worker included.
        # Nothing written outside the trial's own folder: no logger (lightning_logs/), no
        # checkpoints; the root ablate removes once the trial ends.
        default_root_dir=reporter.checkpoint_path,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=[ReportToAblate(reporter)],
    )
    trainer.fit(model, train_loader, valid_loader)
    if reporter.should_prune():
        return {}  # not used: the trial is recorded as pruned
    (valid,) = trainer.validate(model, valid_loader, verbose=False)
    (test,) = trainer.test(model, test_loader, verbose=False)
    return {"valid.acc": valid["valid.acc"], "test.acc": test["test.acc"]}

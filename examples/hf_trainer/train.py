"""A Hugging Face ``Trainer`` as an ablate task: a small MLP on a synthetic two-class problem,
trained by ``transformers.Trainer``; a ``TrainerCallback`` forwards each evaluation to ablate.

ablate calls ``train(config, seed, reporter)`` once per (variant, seed): ``config`` is the
variant's ``model.config`` from study.yaml, and what it returns are the trial's final metrics.
Needs the ``hf`` extra: ``pip install -c constraints.txt -e '.[hf]'``.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset
from transformers import PrinterCallback, Trainer, TrainerCallback, TrainingArguments, set_seed


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


class Points(Dataset):
    """Rows as the dicts the ``Trainer``'s default collator batches: the model's keyword arguments."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor):
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"points": self.x[index], "labels": self.y[index]}


class SpiralClassifier(nn.Module):
    """A plain ``nn.Module``: the ``Trainer`` needs only a forward that returns the loss first."""

    def __init__(self, width: int, depth: int):
        super().__init__()
        layers: list[nn.Module] = [nn.Linear(2, width), nn.ReLU()]
        for _ in range(depth - 1):
            layers += [nn.Linear(width, width), nn.ReLU()]
        self.net = nn.Sequential(*layers, nn.Linear(width, 2))

    def forward(self, points: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        logits = self.net(points)
        if labels is None:
            return {"logits": logits}
        return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}


def accuracy(prediction) -> dict[str, float]:
    return {"acc": float((np.argmax(prediction.predictions, axis=1) == prediction.label_ids).mean())}


class ReportToAblate(TrainerCallback):
    """Each epoch's evaluation to ablate's reporter (curves, a search's pruner); a pruned trial
    stops the ``Trainer``'s loop."""

    def __init__(self, reporter):
        self.reporter = reporter

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        metrics = metrics or {}
        self.reporter.report(
            round(state.epoch),
            {"valid.acc": metrics["eval_acc"], "valid.loss": metrics["eval_loss"]},
        )
        if self.reporter.should_prune():
            control.should_training_stop = True


def train(config: dict, seed: int, reporter) -> dict[str, float]:
    x, y = make_data(seed=1234, rows=config["rows"])
    cut_valid, cut_test = int(0.6 * len(x)), int(0.8 * len(x))
    train_set = Points(x[:cut_valid], y[:cut_valid])
    valid_set = Points(x[cut_valid:cut_test], y[cut_valid:cut_test])
    test_set = Points(x[cut_test:], y[cut_test:])

    set_seed(seed)  # the initial weights; the Trainer seeds its batch order from args.seed
    model = SpiralClassifier(config["width"], config["depth"])
    arguments = TrainingArguments(
        # The trial's own folder, removed once the trial ends: nothing is saved there anyway
        # (no checkpoints, no TensorBoard/W&B runs), but the Trainer wants an output_dir.
        output_dir=str(reporter.checkpoint_path),
        save_strategy="no",
        report_to="none",
        eval_strategy="epoch",
        logging_strategy="no",
        disable_tqdm=True,
        use_cpu=reporter.device == "cpu",
        seed=seed,
        data_seed=seed,
        num_train_epochs=config["epochs"],
        per_device_train_batch_size=config["batch_size"],
        per_device_eval_batch_size=config["batch_size"],
        learning_rate=config["lr"],
        lr_scheduler_type="constant",
        remove_unused_columns=False,  # the dataset's keys are the model's arguments already
        dataloader_pin_memory=False,
    )
    trainer = Trainer(
        model=model,
        args=arguments,
        train_dataset=train_set,
        eval_dataset=valid_set,
        compute_metrics=accuracy,
        callbacks=[ReportToAblate(reporter)],
    )
    trainer.remove_callback(PrinterCallback)  # its dict per evaluation would bury ablate's progress
    trainer.train()
    if reporter.should_prune():
        return {}  # not used: the trial is recorded as pruned
    # predict(), not evaluate(): the callback reports evaluations as epochs, these are the final ones.
    valid = trainer.predict(valid_set, metric_key_prefix="valid").metrics
    test = trainer.predict(test_set, metric_key_prefix="test").metrics
    return {"valid.acc": valid["valid_acc"], "test.acc": test["test_acc"]}

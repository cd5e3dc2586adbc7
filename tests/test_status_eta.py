"""`ablate status` before any trial has finished: a running trial's checkpoint (epoch 3 of 4 after
300 s) projects its whole length, so the ETA is a number, not "unknown"."""

from __future__ import annotations

import pytest
import torch

from ablate.drive.status import VariantStatus, checkpointed_fractions, eta_seconds, projected_walls
from ablate.training.trainer import Checkpoint, checkpoint_summaries


def test_a_checkpoint_records_the_seconds_so_far(tmp_path):
    checkpoint = Checkpoint(tmp_path / "base-seed0.pt", "sig")
    checkpoint.save({"epoch": 3, "epochs": 4, "wall_s": 300.0, "w": torch.zeros(1)})
    saved = checkpoint_summaries(tmp_path)
    assert saved["base-seed0"]["wall_s"] == 300.0 and saved["base-seed0"]["epoch"] == 3


def test_the_eta_is_projected_from_a_running_trials_checkpoint():
    rows = {"base": VariantStatus(running=1, final_running=1, left=3), "mlp": VariantStatus(left=4)}
    saved = {"base-seed0": {"epoch": 3, "epochs": 4, "wall_s": 300.0, "saved": 0.0}}
    assert eta_seconds(rows, checkpointed_fractions(saved)) is None  # no finished trial, no projection
    assert projected_walls(saved) == [400.0]  # 300 s for 3 of 4 epochs
    # left: 3 + 4 trials, plus the running one's last quarter: 7.25 trials × 400 s, one at a time
    assert eta_seconds(rows, checkpointed_fractions(saved), projected_walls(saved)) == pytest.approx(2900.0)
    rows["mlp"].walls.append(100.0)  # once a trial has finished, its wall time counts instead
    assert eta_seconds(rows, checkpointed_fractions(saved), projected_walls(saved)) == pytest.approx(725.0)
    assert projected_walls({"x-seed1": {"epoch": 2, "epochs": 4, "saved": 0.0}}) == []  # no seconds recorded

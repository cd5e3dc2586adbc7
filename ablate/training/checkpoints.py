"""A trial's mid-training state on disk, so a worker that dies costs at most a few minutes of
training: :class:`Checkpoint` (written atomically, read as plain tensors and values only), the
summaries ``ablate status`` reads, and the interval between writes (``$ABLATE_CHECKPOINT_S``)."""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ablate.errors import AblateError, parse_json


@dataclass
class Checkpoint:
    """Where one trial keeps its mid-training state, so a worker that dies (a killed session,
    a lost machine) costs at most ``every_s`` seconds of training, not the whole trial.

    The state is written at the end of an epoch once ``every_s`` seconds have passed since the
    last write (atomically: a temporary file renamed over the old one) and holds everything the
    rest of the training depends on — model, optimiser, learning-rate schedule, the batch
    generator's and the global random states, early-stopping state and stage, curves — so a
    resumed trial continues exactly as the uninterrupted one would have. ``signature`` names what
    the trial trains (the study's fingerprint, seed, batch size): a checkpoint with another
    signature is ignored."""

    path: Path
    signature: str
    every_s: float = 120.0

    def load(self) -> dict[str, Any] | None:
        try:
            # weights_only: tensors and plain values only, so a planted file cannot run code.
            state = torch.load(self.path, map_location="cpu", weights_only=True)
        except Exception:  # noqa: BLE001 - missing, torn, foreign or not plain data: train from scratch
            return None
        return state if isinstance(state, dict) and state.get("signature") == self.signature else None

    @property
    def summary_path(self) -> Path:
        """A few bytes beside the state for ``ablate status``: epoch reached, epochs planned."""
        return self.path.with_suffix(".json")

    def save(self, state: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_name(f".{self.path.name}.{os.getpid()}.partial")
        torch.save({**state, "signature": self.signature}, partial)
        os.replace(partial, self.path)
        summary = {"epoch": state["epoch"], "epochs": state["epochs"], "saved": time.time()}
        if state.get("wall_s"):  # the trial's seconds so far: `ablate status` estimates a trial's length
            summary["wall_s"] = state["wall_s"]
        partial.write_text(json.dumps(summary))
        os.replace(partial, self.summary_path)

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)
        self.summary_path.unlink(missing_ok=True)


def checkpoint_summaries(folder: Path) -> dict[str, dict[str, float]]:
    """``{file stem: {"epoch", "epochs", "saved", "wall_s" (where known)}}`` of the checkpoints
    in ``folder``."""
    found = {}
    for path in sorted(folder.glob("*.json")):
        try:
            found[path.stem] = parse_json(path.read_text())
        except (OSError, ValueError):  # being replaced, or torn: skip it this time
            continue
    return found


CHECKPOINT_ENV = "ABLATE_CHECKPOINT_S"


def checkpoint_interval() -> float:
    """Seconds between checkpoints: ``$ABLATE_CHECKPOINT_S`` (0: after every epoch), else 120."""
    text = os.environ.get(CHECKPOINT_ENV, "").strip()
    if not text:
        return 120.0
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not math.isfinite(value) or value < 0:
        raise AblateError(f"{CHECKPOINT_ENV}={text!r}: expected a number of seconds ≥ 0")
    return value

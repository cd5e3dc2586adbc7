"""Finished trials taken from other studies' stores instead of trained again (``--reuse DIR``).

A trial's numbers depend on what its fingerprint covers (model, training, task, metrics) and on
its seed, not on the study around it, so two studies sharing a variant — FuXi-α's ablation, whose
full model is ``hstu_fuxi_ml1m``'s ``fuxi-alpha`` — need not train it twice. A donor is a finished
trial run in another tracking store with this trial's fingerprint and seed; its curves, best-epoch
metrics, per-unit test results and costs are copied into this study's run, tagged
:data:`REUSED_TAG` with where they came from. Search trials are never reused.
"""

from __future__ import annotations

import tempfile
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from ..errors import AblateError, first_line, warn
from ..track import (
    REUSED_TAG,
    ROLE,
    UNITS_ARTIFACT,
    Tracker,
    default_uri,
    from_mlflow,
    open_client,
    tracking_problem,
)
from ..train import TrialResult

# A donor's tags that say how its numbers were made (code, resumption, batch size), carried over.
CARRIED_TAGS = (
    "ablate.version",
    "ablate.git_commit",
    "ablate.git_dirty",
    "ablate.oom_retry",
    "ablate.resumed_from_epoch",
)


@dataclass(frozen=True)
class Donor:
    """One finished trial run in another store."""

    client: Any  # an MlflowClient on the donor's store
    uri: str
    experiment: str  # the donor study's name
    run: Any  # its mlflow Run

    @property
    def source(self) -> str:
        return f"{self.experiment} in {self.uri}, run {self.run.info.run_id}"

    def copy_into(self, tracker: Tracker, run_id: str) -> TrialResult | None:
        """Log the donor's per-epoch curves and carried tags into ``run_id``; return its result (its
        step-0 metrics, per-unit frame and costs) for the caller to finish the run with. A donor
        that cannot be read whole is skipped with a warning (None: train the trial), before
        anything is written."""
        try:
            result, tags = self._read()
        except Exception as exc:  # noqa: BLE001 - an unreadable donor costs a training, never the study
            warn(f"not reused ({self.source}): {first_line(exc)}; training it instead")
            return None
        epochs: dict[int, dict[str, float]] = defaultdict(dict)
        for epoch, key, value in result.curves:
            epochs[epoch][key] = value
        for epoch in sorted(epochs):
            tracker.log_metrics(run_id, epochs[epoch], step=epoch)
        for tag, value in {**tags, REUSED_TAG: self.source}.items():
            tracker.set_tag(run_id, tag, value)
        return result

    def _read(self) -> tuple[TrialResult, dict[str, str]]:
        final: dict[str, float] = {}
        curves: list[tuple[int, str, float]] = []
        donor_id = self.run.info.run_id
        for key in self.run.data.metrics:
            for point in self.client.get_metric_history(donor_id, key):
                if point.step > 0:
                    curves.append((point.step, from_mlflow(key), point.value))
                else:
                    final[from_mlflow(key)] = point.value  # logged once, at the end
        with tempfile.TemporaryDirectory() as tmp:
            per_unit = pd.read_csv(self.client.download_artifacts(donor_id, UNITS_ARTIFACT, tmp))
        result = TrialResult(
            summary={k: v for k, v in final.items() if k.startswith(("valid.", "test."))},
            per_unit=per_unit,
            curves=curves,
            params=int(final.get("params", 0)),
            tokens_per_s=final.get("tokens_per_s", 0.0),
            peak_memory_mb=final.get("peak_memory_mb", 0.0),
            wall_s=final.get("wall_s", 0.0),
            cpu_s=final.get("cpu_s", 0.0),
            epochs=int(final.get("epochs", 0)),
            best_epoch=int(final.get("best_epoch", 0)),
        )
        return result, {t: self.run.data.tags[t] for t in CARRIED_TAGS if t in self.run.data.tags}


class Donors:
    """The stores ``--reuse`` names, searched in the order given."""

    def __init__(self, sources: Sequence[str | Path] = ()):
        self.uris = [store_uri(s) for s in sources]
        self._clients: dict[str, Any] = {}

    def __bool__(self) -> bool:
        return bool(self.uris)

    def find(self, fingerprint: str, seed: int) -> Donor | None:
        """The first finished trial run with this fingerprint and seed, or None."""
        wanted = (
            f"tags.`ablate.fingerprint` = '{fingerprint}' and tags.seed = '{seed}'"
            f" and tags.`{ROLE}` = 'trial' and attributes.status = 'FINISHED'"
        )
        for uri in self.uris:
            try:
                client = self._clients.setdefault(uri, open_client(uri))
                names = {e.experiment_id: e.name for e in client.search_experiments()}
                runs = names and client.search_runs(
                    list(names), filter_string=wanted, max_results=1, order_by=["attributes.start_time ASC"]
                )
            except Exception as exc:  # noqa: BLE001 - a store gone unreadable costs a training, not the study
                warn(f"--reuse {uri} not searched: {first_line(exc)}")
                continue
            if runs:
                return Donor(client, uri, names[runs[0].info.experiment_id], runs[0])
        return None


def store_uri(source: str | Path) -> str:
    """The tracking URI of a ``--reuse`` source: a study's output folder (its ``mlflow.db``) or a
    tracking URI; a folder without a store is refused in one line."""
    text = str(source)
    if "://" in text:
        if problem := tracking_problem(text):
            raise AblateError(f"--reuse {text}: {problem}")
        return text
    folder = Path(text)
    if not (folder / "mlflow.db").is_file():
        raise AblateError(f"--reuse {text}: no finished study there (no mlflow.db in that folder)")
    return default_uri(folder)


__all__ = ["Donor", "Donors", "store_uri"]

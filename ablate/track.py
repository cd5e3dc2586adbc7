"""MLflow tracking: one parent run per study, one child run per trial.

The tracking store is the source of truth for reports: everything ``ablate report``
needs (metrics, per-epoch curves, per-unit metric vectors, component labels, report
settings) is logged here, so a report can be rebuilt on a machine that has only the store.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import random
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .errors import AblateError

# Per-artifact download bars would drown the report's output.
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

from mlflow import MlflowClient  # noqa: E402
from mlflow.entities import Metric, Param, RunStatus, RunTag  # noqa: E402
from mlflow.exceptions import MlflowException  # noqa: E402

# MLflow prints migration chatter at INFO on first use of a SQLite store.
for _name in ("mlflow", "alembic"):
    logging.getLogger(_name).setLevel(logging.WARNING)

ROLE = "ablate.role"
PARENT = "mlflow.parentRunId"
UNITS_ARTIFACT = "units/test.csv"


def _now_ms() -> int:
    return int(time.time() * 1000)


def to_mlflow(key: str) -> str:
    """MLflow metric names allow no '@': ``valid.ndcg@10`` is stored as ``valid.ndcg_at_10``."""
    return key.replace("@", "_at_")


def from_mlflow(key: str) -> str:
    return key.replace("_at_", "@")


def default_uri(output_dir: Path) -> str:
    return f"sqlite:///{(output_dir / 'mlflow.db').resolve()}"


def _probe(tracking_uri: str) -> None:
    """Fail in seconds, with one line, on a tracking server that does not answer (MLflow's own
    client would retry for minutes first)."""
    if not tracking_uri.startswith(("http://", "https://")):
        return
    try:
        with urllib.request.urlopen(f"{tracking_uri.rstrip('/')}/health", timeout=10):
            pass
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise AblateError(f"cannot reach MLflow tracking server {tracking_uri}: {reason}") from None


@contextmanager
def _first_use(tracking_uri: str) -> Iterator[None]:
    """Workers opening one SQLite store at once would each run MLflow's schema migrations
    and collide ("duplicate column"); a file lock beside the database lets one go first."""
    if not tracking_uri.startswith("sqlite:///"):
        yield
        return
    db = Path(tracking_uri.removeprefix("sqlite:///"))
    db.parent.mkdir(parents=True, exist_ok=True)
    with open(db.with_name(db.name + ".lock"), "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _locked(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "database is locked" in text or "database table is locked" in text


class _Retrying:
    """An ``MlflowClient`` whose calls retry while a SQLite store is locked by another
    worker process (writers queue on one file; a busy one can hold it past SQLite's timeout)."""

    ATTEMPTS = 30

    def __init__(self, client: MlflowClient):
        self._client = client

    def __getattr__(self, name: str):
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            for attempt in range(self.ATTEMPTS):
                try:
                    return attr(*args, **kwargs)
                except Exception as exc:  # noqa: BLE001 - only lock contention is retried
                    if not _locked(exc) or attempt == self.ATTEMPTS - 1:
                        raise
                    time.sleep(min(0.05 * 2**attempt, 2.0) * (0.5 + random.random()))
            raise AssertionError("unreachable")  # pragma: no cover

        return call


class Tracker:
    """Thin MLflow client wrapper with the study/trial vocabulary."""

    def __init__(
        self, tracking_uri: str, experiment: str, artifact_root: Path | None = None, create: bool = True
    ):
        self.uri = tracking_uri
        _probe(tracking_uri)
        try:
            with _first_use(tracking_uri):  # the client creates (migrates) a SQLite store at once
                self.client = _Retrying(MlflowClient(tracking_uri=tracking_uri))
                found = self.client.get_experiment_by_name(experiment)
        except MlflowException as exc:
            raise AblateError(f"cannot open MLflow tracking store {tracking_uri}: {exc.message}") from None
        except Exception as exc:  # noqa: BLE001 - an unreachable server raises from requests
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise AblateError(f"cannot reach MLflow tracking store {tracking_uri}: {first}") from None
        if found is None and not create:
            raise AblateError(f"no experiment '{experiment}' in the tracking store {tracking_uri}")
        if found is None:
            location = artifact_root.resolve().as_uri() if artifact_root else None
            try:
                self.experiment_id = self.client.create_experiment(experiment, artifact_location=location)
            except MlflowException:  # another worker created it first
                self.experiment_id = self.client.get_experiment_by_name(experiment).experiment_id
        else:
            self.experiment_id = found.experiment_id
        self.experiment = experiment

    # -- runs ------------------------------------------------------------------------
    def study_run(self, name: str, tags: dict[str, str], params: dict[str, Any]) -> str:
        """The study's parent run (found by tag, created on first use)."""
        runs = self.client.search_runs([self.experiment_id], filter_string=f"tags.`{ROLE}` = 'study'")
        if runs:
            run_id = runs[0].info.run_id
        else:
            run = self.client.create_run(self.experiment_id, tags={ROLE: "study", **tags}, run_name=name)
            run_id = run.info.run_id
            self.client.log_batch(run_id, params=[Param(k, str(v)[:6000]) for k, v in params.items()])
        self.client.set_tag(run_id, "ablate.report_settings", tags.get("ablate.report_settings", "{}"))
        return run_id

    def start_trial(
        self, parent: str, name: str, tags: dict[str, str], params: dict[str, Any], role: str = "trial"
    ) -> str:
        """A child run: role ``trial`` (what the report compares) or ``search``."""
        run = self.client.create_run(
            self.experiment_id, tags={PARENT: parent, ROLE: role, **tags}, run_name=name
        )
        self.client.log_batch(run.info.run_id, params=[Param(k, str(v)[:6000]) for k, v in params.items()])
        return run.info.run_id

    def log_metrics(self, run_id: str, metrics: dict[str, float], step: int) -> None:
        ts = _now_ms()
        self.client.log_batch(
            run_id, metrics=[Metric(to_mlflow(k), float(v), ts, step) for k, v in metrics.items()]
        )

    def finish_trial(self, run_id: str, metrics: dict[str, float], per_unit: Any) -> None:
        self.log_metrics(run_id, metrics, step=0)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / Path(UNITS_ARTIFACT).name
            per_unit.to_csv(path, index=False)
            self.client.log_artifact(run_id, str(path), artifact_path=str(Path(UNITS_ARTIFACT).parent))
        self.client.set_terminated(run_id, "FINISHED")

    def fail_trial(self, run_id: str, reason: str, status: str = "FAILED") -> None:
        self.client.set_tag(run_id, "ablate.failure", reason[:5000])
        self.client.set_terminated(run_id, status)

    def set_tag(self, run_id: str, key: str, value: str) -> None:
        self.client.set_tag(run_id, key, value)

    def close_unfinished(self, variant: str, index: int, role: str = "trial", key: str = "seed") -> int:
        """Before (variant, seed) — or (variant, search slot) — is trained again: mark its runs
        left RUNNING by a dead worker, or FINISHED by one that died before Optuna heard of it,
        as KILLED, so exactly one finished run per key remains."""
        flt = (
            f"tags.`{ROLE}` = '{role}' and tags.variant = '{_quote(variant)}' and tags.`{key}` = '{index}'"
            f" and attributes.status != 'KILLED' and attributes.status != 'FAILED'"
        )
        closed = 0
        for run in self.client.search_runs([self.experiment_id], filter_string=flt, max_results=1000):
            self.client.set_tag(run.info.run_id, "ablate.failure", "interrupted")
            self.client.set_terminated(run.info.run_id, "KILLED")
            closed += 1
        return closed

    def trial_runs(self, status: str | None = "FINISHED", role: str = "trial") -> list:
        flt = f"tags.`{ROLE}` = '{role}'"
        if status:
            flt += f" and attributes.status = '{status}'"
        runs, token = [], None
        while True:
            page = self.client.search_runs(
                [self.experiment_id],
                filter_string=flt,
                max_results=1000,
                page_token=token,
                order_by=["attributes.start_time ASC"],
            )
            runs += list(page)
            token = page.token
            if not token:
                return runs

    def report_settings_json(self) -> str | None:
        """The report settings stored with the study (JSON text); None where there are none
        (no study run, or the empty mapping a run without settings was tagged with)."""
        runs = self.client.search_runs([self.experiment_id], filter_string=f"tags.`{ROLE}` = 'study'")
        text = runs[0].data.tags.get("ablate.report_settings") if runs else None
        return text if text and json.loads(text) else None


def _quote(text: str) -> str:
    return text.replace("'", "\\'")


__all__ = ["Tracker", "default_uri", "RunStatus", "RunTag", "UNITS_ARTIFACT"]

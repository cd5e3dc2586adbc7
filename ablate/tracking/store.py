"""MLflow tracking: one parent run per study, one child run per trial.

The tracking store is the source of truth for reports: everything ``ablate report``
needs (metrics, per-epoch curves, per-unit metric vectors, component labels, report
settings) is logged here, so a report can be rebuilt on a machine that has only the store.
"""

from __future__ import annotations

import json
import logging
import os
import random
import tempfile
import time
import urllib.error
import urllib.request
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from urllib.parse import urlparse
from urllib.request import url2pathname

from ablate.errors import AblateError, RunFailed, disk_failure, first_line
from ablate.tracking import emptystore
from ablate.tracking.names import (
    BEST_PREFIX,
    CURVE_PREFIXES,
    DATA_SUMMARY,
    NO_UNITS_TAG,
    PARAMS_PER_BATCH,
    PARENT,
    REPORT_FILES,
    REPORT_FOLDER,
    ROLE,
    STUDY_ARTIFACT,
    UNITS_ARTIFACT,
    flat_params,
    from_mlflow,
    to_mlflow,
)
from ablate.tracking.provenance import PROVENANCE_TAGS as PROVENANCE_TAGS  # re-exported: reuse carries them
from ablate.tracking.provenance import described
from ablate.tracking.provenance import provenance as provenance  # re-exported: the driver tags its runs

# Per-artifact download bars would drown the report's output.
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
# So would a "View run … at" line per closed run against a tracking server (on stdout, mid-progress).
os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
# MLflow's usage telemetry writes ~/.config/mlflow/telemetry.json and looks up its host on the
# network: nothing of a study leaves its output folder unless asked (MLFLOW_DISABLE_TELEMETRY=false).
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

from mlflow import MlflowClient  # noqa: E402
from mlflow.entities import Metric, Param, RunTag  # noqa: E402
from mlflow.exceptions import MlflowException  # noqa: E402
from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository  # noqa: E402

from ablate.tracking.curves import Curves, in_batches  # noqa: E402

# MLflow prints migration chatter at INFO on first use of a SQLite store.
for _name in ("mlflow", "alembic"):
    logging.getLogger(_name).setLevel(logging.WARNING)
# It logs a database error (a full disk) with 90 lines of traceback, then raises it: one line says it.
logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)

PARENT_WAIT_S = 60  # how long a worker waits for the study run the experiment's creator makes


def default_uri(output_dir: Path) -> str:
    return f"sqlite:///{(output_dir / 'mlflow.db').resolve()}"


def tracking_problem(tracking_uri: str) -> str | None:
    """Why ``tracking_uri`` names no tracking store, or None. A URI has a scheme; MLflow reads a
    bare word or path as its retired file store, so ``notaurl`` is most likely a mistyped URI."""
    if "://" in tracking_uri:
        return None
    return (
        "not a tracking URI; give http://host:5000, sqlite:///path/mlflow.db or postgresql://user:pw@host/db"
    )


def _probe(tracking_uri: str) -> None:
    """Fail in seconds, in one line, on a tracking server that does not answer (MLflow would retry)."""
    if not tracking_uri.startswith(("http://", "https://")):
        return
    try:
        with urllib.request.urlopen(f"{tracking_uri.rstrip('/')}/health", timeout=10):
            pass
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise AblateError(f"cannot reach MLflow tracking server {tracking_uri}: {reason}") from None


# What a passing fault says: a SQLite store locked by another writer, or a tracking server that
# dropped a connection mid-answer (seen at 32 workers on one busy server: "Connection broken:
# IncompleteRead"); MLflow's own HTTP retries cover error statuses, not a broken answer.
TRANSIENT = ("database is locked", "database table is locked", "connection broken", "connection aborted")
TRANSIENT += ("connection reset", "remotedisconnected")


def _locked(exc: BaseException) -> bool:
    text = str(exc).lower()
    return any(fault in text for fault in TRANSIENT)


class _Retrying:
    """An ``MlflowClient`` whose calls retry while a SQLite store is locked by another
    worker process (writers queue on one file; a busy one can hold it past SQLite's timeout)
    or a tracking server broke a connection. A run created twice that way stays unfinished, and
    only finished runs are read back."""

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


def read_units(client: MlflowClient, run: Any):
    """A finished trial run's per-unit test metrics (:data:`UNITS_ARTIFACT`) as a DataFrame; empty
    for a run tagged as having none (:data:`NO_UNITS_TAG`: a task without per-unit results)."""
    import pandas as pd  # only readers of results need it

    if run.data.tags.get(NO_UNITS_TAG) == "true":
        return pd.DataFrame()
    # A local store's artifact read where it lies: MLflow's download (a copy through a temporary
    # folder) took 50 ms a trial, 11 ms read here (42 trials: 3.62 s → 3.16 s of reading on 2 cores).
    uri = run.info.artifact_uri or ""
    local = Path(url2pathname(urlparse(uri).path)) / UNITS_ARTIFACT if uri.startswith("file:") else None
    if local is not None and local.is_file():
        return pd.read_csv(local)
    with tempfile.TemporaryDirectory() as tmp:
        return pd.read_csv(client.download_artifacts(run.info.run_id, UNITS_ARTIFACT, tmp))


def trial_metrics(
    client: MlflowClient, run: Any, curve_keys: tuple[str, ...] | None = None
) -> tuple[dict[str, float], list[tuple[int, str, float]]]:
    """A finished trial run's final numbers (``valid.*`` of its restored best state, ``test.*``,
    costs) and its per-epoch curves ``(epoch, key, value)`` of the keys starting with one of
    ``curve_keys`` (None: every key logged per epoch; ``()``: none). Keys as ablate names them
    (``ndcg@10``). Stores written before ``best.valid.*`` existed kept the best state's values
    as an extra step-0 point of each ``valid.*`` history: read there (else the latest value)."""
    stored = run.data.metrics
    final: dict[str, float] = {}
    for key, value in stored.items():
        if key.startswith(BEST_PREFIX):
            final[from_mlflow(key.removeprefix(BEST_PREFIX))] = value
        elif not key.startswith(CURVE_PREFIXES):
            final[from_mlflow(key)] = value
    curves: list[tuple[int, str, float]] = []
    for key in stored:
        wanted = key.startswith(CURVE_PREFIXES) and (curve_keys is None or key.startswith(curve_keys))
        legacy = key.startswith("valid.") and BEST_PREFIX + key not in stored
        if not (wanted or legacy):
            continue
        if legacy:  # its latest value, unless a step-0 point below says otherwise
            final[from_mlflow(key)] = stored[key]
        for point in client.get_metric_history(run.info.run_id, key):
            if point.step > 0:
                if wanted:
                    curves.append((point.step, from_mlflow(key), point.value))
            elif legacy:
                final[from_mlflow(key)] = point.value
    return final, curves


def open_client(tracking_uri: str) -> MlflowClient:
    """A client on another study's store, read by this process (a locked SQLite file is retried)."""
    _probe(tracking_uri)
    return _Retrying(MlflowClient(tracking_uri=tracking_uri))


class Tracker:
    """Thin MLflow client wrapper with the study/trial vocabulary."""

    def __init__(
        self, tracking_uri: str, experiment: str, artifact_root: Path | None = None, create: bool = True
    ):
        self.uri = tracking_uri
        _probe(tracking_uri)
        try:
            with emptystore.first_use(tracking_uri):  # the client creates (migrates) a SQLite store at once
                self.client = _Retrying(MlflowClient(tracking_uri=tracking_uri))
                found = self.client.get_experiment_by_name(experiment)
        except Exception as exc:  # noqa: BLE001 - MLflow's refusal; an unreachable server raises from requests
            local, said = tracking_uri.startswith("sqlite:"), isinstance(exc, MlflowException)
            verb = "open" if local or said else "reach"  # a file, or a server that answered
            error = RunFailed if local and disk_failure(exc) else AblateError  # a full disk: not bad input
            reason = exc.message if said else first_line(exc)
            raise error(f"cannot {verb} MLflow tracking store {tracking_uri}: {reason}") from None
        if found is None and not create:
            raise AblateError(f"no experiment '{experiment}' in the tracking store {tracking_uri}")
        self.created = False  # whether this tracker created the experiment (and so creates the study run)
        if found is None:
            location = artifact_root.resolve().as_uri() if artifact_root else None
            try:
                self.experiment_id = self.client.create_experiment(experiment, artifact_location=location)
                self.created = True
            except MlflowException:  # another worker created it first
                self.experiment_id = self.client.get_experiment_by_name(experiment).experiment_id
        else:
            self.experiment_id = found.experiment_id
        self.experiment = experiment
        self.provenance: dict[str, str] = {}  # tags every run this tracker opens gets (provenance())
        self.curves = Curves(lambda run_id, metrics: self.client.log_batch(run_id, metrics=metrics))
        self.artifact_uris: dict[str, str] = {}  # open trial runs' artifact locations, from their creation

    # -- the study's run ---------------------------------------------------------------
    def study_run(self, name: str, tags: dict[str, str], params: dict[str, Any]) -> str:
        """The study's parent run (found by tag, created on first use). One run serves every
        worker and every invocation: closed by whichever ends the study, reopened by a resumed one
        (:meth:`open_study`).

        Workers starting together must not each create one: the worker whose ``create_experiment``
        succeeded (MLflow lets exactly one) creates it, the others wait for it. Only where that
        worker died first do the others create their own, keep the earliest and delete the rest."""
        found = self.parent_run()
        deadline = time.monotonic() + PARENT_WAIT_S
        while found is None and not self.created and time.monotonic() < deadline:
            time.sleep(0.5)
            found = self.parent_run()
        if found is not None:
            run_id = found.info.run_id
        else:
            created = self.client.create_run(self.experiment_id, tags={ROLE: "study", **tags}, run_name=name)
            run_id = self.parent_run().info.run_id
            if run_id != created.info.run_id:
                self.client.delete_run(created.info.run_id)
            else:
                self._log_params(run_id, params)
        stamped = {"ablate.report_settings": tags.get("ablate.report_settings", "{}"), **self.provenance}
        self.client.log_batch(run_id, tags=[RunTag(k, v) for k, v in stamped.items()])
        return run_id

    def parent_run(self):
        """The study's parent run (an MLflow ``Run``), or None before the study first ran."""
        runs = self.client.search_runs([self.experiment_id], filter_string=f"tags.`{ROLE}` = 'study'")
        return min(runs, key=lambda run: (run.info.start_time, run.info.run_id)) if runs else None

    def study_status(self, run_id: str) -> str:
        return self.client.get_run(run_id).info.status

    def tag_of(self, run_id: str, key: str) -> str | None:
        return self.client.get_run(run_id).data.tags.get(key)

    def open_study(self, run_id: str) -> None:
        """Mark the study's run RUNNING again (a resumed study trains): MLflow lets a finished run's
        status be set back; its end time stays until it is closed again."""
        if self.study_status(run_id) != "RUNNING":
            self.client.update_run(run_id, status="RUNNING")

    def close_study(self, run_id: str, status: str) -> None:
        """FINISHED, FAILED (trials failed for good) or KILLED (stopped)."""
        self.client.set_terminated(run_id, status)

    def attach_text(self, run_id: str, text: str, artifact_file: str) -> None:
        """Store ``text`` as an artifact of the run; the first artifact a worker writes, so an artifact
        store it cannot reach stops it here, in one line, before any training."""
        try:
            with tempfile.TemporaryDirectory() as tmp:
                local, folder = Path(tmp) / Path(artifact_file).name, str(Path(artifact_file).parent)
                local.write_text(text, encoding="utf-8")
                self._log_artifact(run_id, str(local), None if folder == "." else folder)
        except Exception as exc:  # noqa: BLE001 - boto, requests, OSError: each store fails its own way
            reason = first_line(exc)
            raise AblateError(f"cannot store artifacts in the tracking store {self.uri}: {reason}") from None

    def _log_artifact(self, run_id: str, local: str, folder: str | None) -> None:
        """One request where the run's artifact location is known from its creation (``MlflowClient``
        reads the run from the server first: a request a trial, issue 56)."""
        uri = self.artifact_uris.get(run_id)
        if uri is None:
            self.client.log_artifact(run_id, local, artifact_path=folder)
        else:
            get_artifact_repository(uri, tracking_uri=self.uri).log_artifact(local, folder)

    def attach_files(self, run_id: str, files: dict[str, bytes | Path], folder: str) -> None:
        """Store each file (name → its bytes, or a file to copy) as an artifact under ``folder``."""
        if not files:
            return
        with tempfile.TemporaryDirectory() as tmp:
            for name, content in files.items():
                local = Path(tmp) / name
                local.parent.mkdir(parents=True, exist_ok=True)
                local.write_bytes(content.read_bytes() if isinstance(content, Path) else content)
            self.client.log_artifacts(run_id, tmp, artifact_path=folder)

    def study_meta(self) -> dict[str, Any]:
        """What the parent run records about how the study was made: ``ablate_version``,
        ``git_commit``, ``git_dirty``, ``data_summary``, ``resolved_study`` (those present)."""
        run = self.parent_run()
        if run is None:
            return {}
        tags, meta = run.data.tags, {}
        if "ablate.version" in tags:
            meta["ablate_version"] = tags["ablate.version"]
        if "ablate.git_commit" in tags:
            meta["git_commit"] = tags["ablate.git_commit"]
            meta["git_dirty"] = tags.get("ablate.git_dirty") == "true"
        if DATA_SUMMARY in tags:
            meta["data_summary"] = json.loads(tags[DATA_SUMMARY])
        if described(tags):  # the conditions its numbers reproduce under (stores before them: none)
            meta["conditions"] = described(tags)
        with tempfile.TemporaryDirectory() as tmp:
            try:
                local = self.client.download_artifacts(run.info.run_id, STUDY_ARTIFACT, tmp)
                meta["resolved_study"] = Path(local).read_text(encoding="utf-8")
            except Exception:  # noqa: BLE001 - a store written before the artifact existed
                pass
        return meta

    # -- trial runs ----------------------------------------------------------------------
    def _log_params(self, run_id: str, params: dict[str, Any]) -> None:
        items = [Param(k, v) for k, v in flat_params(params).items()]
        for start in range(0, len(items), PARAMS_PER_BATCH):
            self.client.log_batch(run_id, params=items[start : start + PARAMS_PER_BATCH])

    def start_trial(
        self, parent: str, name: str, tags: dict[str, str], params: dict[str, Any], role: str = "trial"
    ) -> str:
        """A child run: role ``trial`` (what the report compares) or ``search``."""
        run = self.client.create_run(
            self.experiment_id, tags={PARENT: parent, ROLE: role, **self.provenance, **tags}, run_name=name
        )
        self._log_params(run.info.run_id, params)
        self.artifact_uris[run.info.run_id] = run.info.artifact_uri
        self.curves.opened(run.info.run_id)
        return run.info.run_id

    def log_metrics(self, run_id: str, metrics: dict[str, float], step: int) -> None:
        """Curve points at ``step``, sent in batches (:mod:`ablate.tracking.curves`)."""
        ts = int(time.time() * 1000)  # MLflow's time stamps: ms
        self.curves.add(run_id, [Metric(to_mlflow(k), float(v), ts, step) for k, v in metrics.items()])

    def finish_trial(self, run_id: str, metrics: dict[str, float], per_unit: Any) -> None:
        """Log the trial's final numbers (test metrics and costs at step 0, the best state's
        validation metrics as ``best.valid.*``: the ``valid.*`` histories stay the curves) and its
        per-unit test metrics, and close its run."""
        final = {(BEST_PREFIX + k if k.startswith("valid.") else k): v for k, v in metrics.items()}
        ts = int(time.time() * 1000)  # MLflow's time stamps: ms
        metrics = self.curves.take(run_id) + [Metric(to_mlflow(k), float(v), ts, 0) for k, v in final.items()]
        # A task with no per-unit results (``function``) stores no empty table; its run says so,
        # so that a reader tells that from a table lost.
        tags = [] if len(per_unit) else [RunTag(NO_UNITS_TAG, "true")]
        for chunk in in_batches(metrics):
            self.client.log_batch(run_id, metrics=chunk, tags=tags)
            tags = []
        if len(per_unit):
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / Path(UNITS_ARTIFACT).name
                per_unit.to_csv(path, index=False)
                self._log_artifact(run_id, str(path), str(Path(UNITS_ARTIFACT).parent))
        self.client.set_terminated(run_id, "FINISHED")
        self.artifact_uris.pop(run_id, None)

    def fail_trial(self, run_id: str, reason: str, status: str = "FAILED") -> None:
        """Close a trial's run as ``status`` with its reason, and its curve up to there."""
        tags = [RunTag("ablate.failure", reason[:5000])]
        for chunk in in_batches(self.curves.take(run_id)):
            self.client.log_batch(run_id, metrics=chunk, tags=tags)
            tags = []
        self.client.set_terminated(run_id, status)
        self.artifact_uris.pop(run_id, None)

    def set_tags(self, run_id: str, tags: dict[str, str], removed: Iterable[str] = ()) -> None:
        """``tags`` on the run in one request; the tags ``removed`` deleted."""
        self.client.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()])
        for key in removed:
            self.client.delete_tag(run_id, key)

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
        run = self.parent_run()
        text = run.data.tags.get("ablate.report_settings") if run else None
        return text if text and json.loads(text) else None


def attach_report(tracking_uri: str, experiment: str, paths: dict[str, Path]) -> None:
    """Log the written report's files (report.md / .html, results.csv, comparisons.csv, table.tex)
    to the study's parent run, under ``report/``. A store that takes no artifacts (read-only, an
    artifact server down) costs a warning, not the report."""
    try:
        tracker = Tracker(tracking_uri, experiment, create=False)
        run = tracker.parent_run()
        if run is None:
            return
        for key in REPORT_FILES:
            if key in paths and Path(paths[key]).is_file():
                tracker.client.log_artifact(run.info.run_id, str(paths[key]), artifact_path=REPORT_FOLDER)
    except Exception as exc:  # noqa: BLE001 - the report itself is written already
        reason = first_line(exc)
        warnings.warn(f"the report was not attached to the study's MLflow run: {reason}", stacklevel=2)


def _quote(text: str) -> str:
    return text.replace("'", "\\'")

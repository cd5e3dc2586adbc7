"""A study's two stores checked against each other as it starts, and the queue rebuilt from the
tracking records where its journal was lost.

A study keeps its queue (which (variant, seed) is done, running, left: the Optuna journal) apart
from its numbers (curves, metrics, per-unit results: the MLflow store). Losing either one used to
go unnoticed: without the journal every trial trained again beside the old records; without the
MLflow store ``status`` said finished while ``run`` found no finished trials. Both are caught
before anything is created or trained, in one line with the way back; a lost journal is rebuilt
from the tracking records on request (``ablate run --rebuild-queue``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from optuna.trial import TrialState, create_trial

from ablate.drive.ledger import DATA_DIGEST, key_of
from ablate.drive.queue import Queue
from ablate.drive.reuse import StoredTrial
from ablate.errors import AblateError
from ablate.tracking.store import Tracker, default_uri

if TYPE_CHECKING:  # pragma: no cover
    from ablate.drive.stores import Stores
    from ablate.study.load import Study


def _finished_runs(study: Study, uri: str) -> list:
    """The study's finished final-trial runs in the tracking store at ``uri`` (search trials,
    which carry a slot instead of a seed, left out)."""
    try:
        tracker = Tracker(uri, study.name, create=False)
    except AblateError:  # no experiment of this study there: nothing was lost
        return []
    return [run for run in tracker.trial_runs(status="FINISHED") if "seed" in run.data.tags]


def _local_tracking(stores: Stores) -> Path | None:
    """The MLflow database of a study whose tracking store is the default one in its output folder."""
    if stores.shared or stores.tracking_uri != default_uri(stores.output_dir):
        return None
    return stores.output_dir / "mlflow.db"


def _lost(path: Path) -> str | None:
    """How a store's file is lost: missing, or empty (a disk that filled as it was made, a copy cut
    short: 0 bytes read as a new store would train everything again); None where it is there."""
    try:
        return "is empty (0 bytes)" if path.stat().st_size == 0 else None
    except FileNotFoundError:
        return "is missing"


def check_stores(study: Study, stores: Stores, rebuild_queue: bool = False) -> int:
    """Raise :class:`AblateError` in one line when one of a study's local stores is lost while
    the other holds finished trials; with ``rebuild_queue``, rebuild a lost journal instead.
    Returns the number of trials rebuilt."""
    database = _local_tracking(stores)
    if database is None:
        return 0
    journal = stores.optuna_url.removeprefix("sqlite:///")
    if (journal_lost := _lost(Path(journal))) and database.is_file() and not _lost(database):
        runs = _finished_runs(study, stores.tracking_uri)
        if runs and rebuild_queue:
            return rebuild(study, stores, runs)
        if runs:
            raise AblateError(
                f"{journal} {journal_lost}, but {database} holds {len(runs)} finished trial(s) of "
                f"'{study.name}': the queue was lost, and running on would train them all again; "
                f"`ablate run {study.path} --rebuild-queue` rebuilds it from the tracking records "
                f"(finished trials kept, the rest trained), or give a new --output folder"
            )
    elif rebuild_queue:
        raise AblateError(f"--rebuild-queue: {journal} is there; nothing to rebuild")
    if not journal_lost and (database_lost := _lost(database)):
        done = [t for t in Queue.final(study, stores.storage()).trials() if t.state == TrialState.COMPLETE]
        if done:
            raise AblateError(
                f"{database} {database_lost}, but {journal} holds {len(done)} finished trial(s): their "
                f"metrics, curves and per-unit results were in it; restore it from a backup, or move "
                f"{Path(journal).name} away and run again (with --reuse DIR where `ablate report "
                f"--trials DIR` wrote them out, so they are copied, not trained)"
            )
    return 0


def rebuild(study: Study, stores: Stores, runs: list) -> int:
    """The final queue rebuilt from the study's finished trial runs: one COMPLETE trial per
    (variant, seed) with what the ledger reads (variant, seed, fingerprint, data digest, run, the
    best-epoch metrics). Search queues are not rebuilt: a study with ``search:`` searches again."""
    queue = Queue.final(study, stores.storage())
    primary = f"valid.{study.metrics[0]}"
    seen = {key_of(t) for t in queue.trials() if t.state == TrialState.COMPLETE}
    tracker = Tracker(stores.tracking_uri, study.name, create=False)
    rebuilt = 0
    for run in sorted(runs, key=lambda r: r.info.start_time):
        tags = run.data.tags
        key = (tags.get("variant"), int(tags["seed"]))
        if key in seen or key[0] not in study.variants or "ablate.fingerprint" not in tags:
            continue
        result, _ = StoredTrial(tracker.client, stores.tracking_uri, study.name, run).read()
        if primary not in result.summary:
            continue
        attrs = {
            "variant": key[0],
            "seed": key[1],
            "fingerprint": tags["ablate.fingerprint"],
            "mlflow_run_id": run.info.run_id,
            "rebuilt_from": "mlflow",
            **result.summary,
            "wall_s": result.wall_s,
        }
        if f"ablate.{DATA_DIGEST}" in tags:
            attrs[DATA_DIGEST] = tags[f"ablate.{DATA_DIGEST}"]
        done = create_trial(state=TrialState.COMPLETE, value=result.summary[primary], user_attrs=attrs)
        queue.study.add_trial(done)
        seen.add(key)
        rebuilt += 1
    return rebuilt

"""The one place ablate reads Optuna's private modules; nothing else may (``tests/test_layout.py``).

Optuna names a journal's operations and its lock file's suffix only in private modules, and the
journal check (:mod:`.journal`) needs both: the operations to tell a record a crash cut off from
one Optuna would replay, the suffix to find a lock a killed writer left behind. A database's take
(:func:`claim_first_waiting`) needs the trials table, which Optuna's schema module names. Should
Optuna move any of them, the import fails here, by name, and ``tests/test_layout.py`` fails with it.
A trial's storage id, which a read of the queue holds in a private field (:func:`storage_id`), is
read here alone too; the same test checks it against the storage's public answer.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from optuna.storages import RDBStorage
from optuna.storages._rdb.models import TrialModel, TrialUserAttributeModel
from optuna.storages.journal._file import LOCK_FILE_SUFFIX
from optuna.storages.journal._storage import JournalOperation
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy import select, update
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

# What a record's op_code may be: Optuna's own operations.
JOURNAL_OPERATIONS = frozenset(int(op) for op in JournalOperation)


def storage_id(trial: FrozenTrial) -> int:
    """The storage's id of a trial read from it, which Optuna keeps in a private field: asking the
    storage for it again (``get_trial_id_from_study_id_trial_number``) is a call, through the gRPC
    proxy a round trip, for what the read already holds."""
    return trial._trial_id


def claim_first_waiting(storage: RDBStorage, study_id: int) -> int | None:
    """The id of the study's lowest-numbered WAITING trial, set RUNNING in the same transaction
    (as Optuna's ``set_trial_state_values`` does when ``ask`` pops one), or None if none waits.

    Optuna's ``ask`` reads every waiting trial with its attributes and tries them in turn: at 730
    queued that read took 390 ms a take on PostgreSQL (benchmarks/RESULTS.md). Here one statement
    finds the row; ``FOR UPDATE SKIP LOCKED`` passes over rows other workers are claiming at that
    moment (PostgreSQL; SQLite has one writer at a time and ignores it), and the update's condition
    on the state makes the claim exactly-once on every database."""
    trials = TrialModel.__table__
    first_waiting = (
        select(trials.c.trial_id)
        .where(trials.c.study_id == study_id, trials.c.state == TrialState.WAITING)
        .order_by(trials.c.number)
        .limit(1)
        .with_for_update(skip_locked=True)
    )
    with storage.engine.begin() as connection:
        while (trial_id := connection.execute(first_waiting).scalar()) is not None:
            started = datetime.now(UTC).replace(tzinfo=None)  # Optuna stores naive UTC
            claim = (
                update(trials)
                .where(trials.c.trial_id == trial_id, trials.c.state == TrialState.WAITING)
                .values(state=TrialState.RUNNING, datetime_start=started)
            )
            if connection.execute(claim).rowcount == 1:
                return trial_id
    return None


# The databases whose upsert :func:`set_user_attrs` writes in one statement.
UPSERTS = {"postgresql": postgresql_insert, "sqlite": sqlite_insert}


def set_user_attrs(storage: RDBStorage, trial_id: int, attrs: dict[str, Any]) -> None:
    """User attributes of a trial still running, written in one transaction: its state checked
    and every attribute upserted in one statement (Optuna's ``set_trial_user_attr`` takes a
    transaction and three statements for each). Raises as Optuna does for a finished trial."""
    insert = UPSERTS.get(storage.engine.name)
    if insert is None:
        for key, value in attrs.items():
            storage.set_trial_user_attr(trial_id, key, value)
        return
    trials, table = TrialModel.__table__, TrialUserAttributeModel.__table__
    rows = [{"trial_id": trial_id, "key": k, "value_json": json.dumps(v)} for k, v in attrs.items()]
    upsert = insert(table).values(rows)
    upsert = upsert.on_conflict_do_update(
        index_elements=[table.c.trial_id, table.c.key], set_={"value_json": upsert.excluded.value_json}
    )
    with storage.engine.begin() as connection:
        state = connection.execute(
            select(trials.c.state).where(trials.c.trial_id == trial_id).with_for_update()
        ).scalar_one()
        storage.check_trial_is_updatable(trial_id, state)
        connection.execute(upsert)


__all__ = ["JOURNAL_OPERATIONS", "LOCK_FILE_SUFFIX", "claim_first_waiting", "set_user_attrs", "storage_id"]

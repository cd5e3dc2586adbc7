"""Starting a study's work: one process's run of the worker loop (``run_study``), the stores and
queues made once before N workers share them (``prepare``), and a new study's data read and checked
before any store exists."""

from __future__ import annotations

from contextlib import suppress

from optuna.trial import TrialState

from ablate.drive.driver import Driver, RunSummary
from ablate.drive.execution import (
    TaskData,
)
from ablate.drive.ledger import (
    key_of,
)
from ablate.drive.reporter import Reporter
from ablate.drive.reuse import Donors
from ablate.drive.stores import Stores
from ablate.study.load import Study
from ablate.training.memory import frozen_before_trials


def run_study(
    study: Study,
    stores: Stores,
    reporter: Reporter | None = None,
    retry_failed: bool = False,
    wait_for_others: bool = True,
    donors: Donors | None = None,
) -> RunSummary:
    """Train every planned (variant, seed) not yet complete (searching first when the study
    has a ``search:`` section), or copy it from a donor (``donors``); returns what this
    process did."""
    data = read_data_first(study, stores)
    with stores.worker() as worker_id, frozen_before_trials(trains_here=not study.task.runs_trials):
        driver = Driver(study, stores, reporter, retry_failed, worker_id=worker_id, donors=donors, data=data)
        try:
            summary = driver.run(wait_for_others=wait_for_others)
        except BaseException as exc:
            with suppress(Exception):  # what stopped the run is what the caller hears of
                driver.close_study(stopped_by=exc)
            raise
        driver.close_study()
        return summary


def prepare(study: Study, stores: Stores) -> None:
    """Create the stores and fill the queues once, before N workers start on them (MLflow's
    and Optuna's first-use schema creation must not race); read the data if a trial is left."""
    read = read_data_first(study, stores) is not None
    driver = Driver(study, stores)
    with stores.queue_lock():
        driver.sync()
    complete = {key_of(t) for t in driver.final.trials(TrialState.COMPLETE)}
    if not read and not set(driver.planned) <= complete:
        # Read once here: a bad data file is one line from this process, not one from every worker
        # (which then read the parsed data from the cache instead of each parsing it at once).
        study.task.load()


def read_data_first(study: Study, stores: Stores) -> TaskData | None:
    """A study that never ran reads and checks its data (the preflight included) before any
    store is created: bad data stops it (one line, exit 2) with nothing left behind, and no
    store's schema is created for a run that cannot train. A started study opens its stores
    first (None here): with every trial complete, it never reads the data."""
    if stores.started():
        return None
    data = TaskData(study)
    data.get()
    return data

"""What a report places the variants against, kept with the study's MLflow run: the task's
trivial baselines and its evaluation protocol (:meth:`~ablate.tasks.Task.reference`), stored as
the artifact :data:`~ablate.tasks.BASELINES_ARTIFACT` once the data are loaded, so that a report
rebuilt from the tracking store (or from trial files, ``--reuse``) shows them without the data."""

from __future__ import annotations

import json
import warnings
from typing import TYPE_CHECKING, Any

from ablate.errors import first_line
from ablate.tasks import BASELINES_ARTIFACT
from ablate.tracking.store import Tracker

if TYPE_CHECKING:
    from ablate.study.load import Study


def record_reference(tracker: Tracker, run_id: str, study: Study, data: Any) -> dict | None:
    """The task's baselines and protocol on ``data``, stored with the study's run ``run_id``
    (None, with a warning, when they cannot be computed: never worth a trial)."""
    try:
        reference = study.task.reference(data, study.metrics)
        tracker.attach_text(run_id, json.dumps(reference), BASELINES_ARTIFACT)  # kept even when empty:
        return reference  # a report need not read the data again to find none
    except Exception as exc:  # noqa: BLE001 - a baseline is never worth a trial
        warnings.warn(f"no trivial baselines recorded: {first_line(exc)}", stacklevel=2)
        return None


def fill_reference(tracking_uri: str, study: Study | None, meta: dict) -> None:
    """``meta["reference"]`` for a store that holds none (a study whose data were never loaded in
    it, such as one rebuilt from trial files, or one run before baselines were kept): the study's
    data loaded now, the reference computed and stored with its run. Nothing without a study file,
    for a task that trains its own model, or when the data cannot be read (a warning says so)."""
    if "reference" in meta or study is None or study.task.runs_trials:
        return
    tracker = Tracker(tracking_uri, study.name, create=False)
    parent = tracker.parent_run()
    if parent is None:
        return
    try:
        data = study.task.load()
    except Exception as exc:  # noqa: BLE001 - the report is written without baselines
        warnings.warn(
            f"no trivial baselines in the report: the data cannot be read ({first_line(exc)})", stacklevel=2
        )
        return
    reference = record_reference(tracker, parent.info.run_id, study, data)
    if reference is not None:
        meta["reference"] = reference

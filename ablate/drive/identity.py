"""Data identity: what the data files hold, by content, and the stop when finished trials were
trained on other data than they hold now — with the command that trains on the new data apart.

The fingerprint covers the task's options as written, not the data's content, so each trial also
records the digest of its data (:data:`~.ledger.DATA_DIGEST`). Trials made on two versions of a
file never share a study: the new data get a study and output folder of their own (:func:`apart`),
the earlier trials and their report stay as they were, and each report describes its own data.
"""

from __future__ import annotations

import shlex
from collections import Counter
from pathlib import Path

from optuna.trial import FrozenTrial, TrialState

from ablate.drive.ledger import DATA_DIGEST, key_of
from ablate.errors import AblateError
from ablate.study.load import Study


def data_digest(study: Study) -> str | None:
    """:meth:`~ablate.tasks.Task.data_digest`, a file that cannot be read named in one line."""
    try:
        return study.task.data_digest()
    except OSError as exc:
        raise AblateError(f"{study.path}: task.data: cannot read: {exc}") from None


def check_data(
    trials: list[FrozenTrial], study: Study, digest: str | None, output: Path, queue: str | None = None
) -> None:
    """Stop when finished trials (of the final queue, or of the search queue ``queue``, in the
    output folder ``output``) were trained on other data than the data files hold now (the file was
    replaced or edited since): their numbers and new ones would share one report. The line says
    how to go on: the command that trains on these data apart (:func:`apart`), or the earlier file
    put back. Trials recorded before digests were (no attribute) are taken as trained on these data."""
    if digest is None:
        return
    other = Counter(
        seen
        for t in trials
        if t.state == TrialState.COMPLETE and key_of(t) and (seen := t.user_attrs.get(DATA_DIGEST)) != digest
    )
    other.pop(None, None)
    if other:
        earlier = ", ".join(f"{n} on data {d}" for d, n in sorted(other.items()))
        place = f"search study '{queue}' in {output}" if queue else str(output)
        raise AblateError(
            f"{place} holds finished trials trained on other data than task.data holds now ({earlier}; "
            f"the data are now {digest}): the data file changed since; to train on these data in a study "
            f"and folder of their own, the earlier trials and their report kept apart: "
            f"{apart(study, output, digest)}; or put the earlier file back to go on"
        )


def apart(study: Study, output: Path, digest: str) -> str:
    """The ``ablate run`` command that trains ``study`` on the data of ``digest`` as a study of its
    own: its overrides, its name and output folder suffixed with the digest's first 8 characters
    (the name too, so that a shared tracking or Optuna store keeps the two apart as well)."""
    suffix = digest[:8]
    kept = [o for o in study.overrides if o.lstrip("+~").split("=", 1)[0].strip() != "name"]
    named = f"name={study.name[:91]}-{suffix}"  # names are at most 100 characters
    return shlex.join(["ablate", "run", str(study.path), *kept, named, "--output", f"{output}-{suffix}"])

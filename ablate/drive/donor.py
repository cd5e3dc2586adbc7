"""One finished trial elsewhere that a study may copy instead of training it (a donor): the
interface of a stored or filed trial (:mod:`.reuse`), and what looks one up."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import defaultdict
from collections.abc import Sequence
from typing import Any, Protocol

from ablate.drive.ledger import fingerprint_of
from ablate.errors import first_line, warn
from ablate.tracking.names import REUSED_TAG, flat_params
from ablate.tracking.provenance import PREFIX as CONDITIONS_PREFIX
from ablate.tracking.store import Tracker
from ablate.training.trainer import TrialResult


class Donor(ABC):
    """One finished trial elsewhere."""

    @property
    @abstractmethod
    def source(self) -> str:
        """``<study> in <store or folder>, run <id>``: where the numbers were made."""

    @abstractmethod
    def read(self) -> tuple[TrialResult, dict[str, str]]:
        """The trial's result (curves included) and its carried tags, read whole."""

    @property
    @abstractmethod
    def data_digest(self) -> str | None:
        """The digest of the data it was trained on; None where it was not recorded."""

    @property
    @abstractmethod
    def filed_as(self) -> str:
        """The fingerprint it was trained under, which names it."""

    @abstractmethod
    def settings(self) -> dict[str, Any] | None:
        """What it was trained with, as its record keeps it (:func:`~.ledger.trained_with`); None
        for a record made before records kept it."""

    def settings_problem(
        self, filed_as: str, wanted: Sequence[str], ours: dict[str, Any] | None
    ) -> str | None:
        """Why its own settings say it is not the trial it is filed as (``filed_as``: the fingerprint
        its name or tag gives, one of ``wanted``, this study's trial's), or None; where they differ
        from this study's (``ours``) the first difference is named."""
        own = self.settings()
        if own is None:  # an older record: its name, seed, parameter count and numbers are checked
            return None
        if not isinstance(own, dict):
            return f"its settings are a {type(own).__name__}, not a mapping"
        recomputed = fingerprint_of(own)
        if recomputed == filed_as and recomputed in wanted:
            return None
        where = f" ({_difference(own, ours)})" if ours is not None else ""
        return f"its own settings hash to {recomputed}, not {filed_as} it is filed as{where}"

    def copy_into(self, tracker: Tracker, run_id: str, parameters: int | None = None) -> TrialResult | None:
        """Log the donor's per-epoch curves and carried tags into ``run_id``; return its result (its
        step-0 metrics, per-unit frame and costs) for the caller to finish the run with. A donor
        that cannot be read whole, or whose model has another parameter count than this trial's
        (``parameters``: another model under this fingerprint's name), is skipped with a warning
        (None: train the trial), before anything is written."""
        try:
            result, tags = self.read()
            if parameters is not None and result.params and result.params != parameters:
                raise ValueError(
                    f"its model has {result.params:,} parameters, this trial's {parameters:,} (another model)"
                )
        except Exception as exc:  # noqa: BLE001 - an unreadable donor costs a training, never the study
            warn(f"not reused ({self.source}): {first_line(exc)}; training it instead")
            return None
        epochs: dict[int, dict[str, float]] = defaultdict(dict)
        for epoch, key, value in result.curves:
            epochs[epoch][key] = value
        for epoch in sorted(epochs):
            tracker.log_metrics(run_id, epochs[epoch], step=epoch)
        # The run was opened with this process's conditions: a copy ran under its donor's (carried
        # where the donor recorded them; an older record did not, and then none are claimed).
        own = {tag for tag in tracker.provenance.keys() - tags.keys() if tag.startswith(CONDITIONS_PREFIX)}
        tracker.set_tags(run_id, {**tags, REUSED_TAG: self.source}, removed=sorted(own))
        return result


class Finder(Protocol):
    """What finds a donor: :class:`.reuse.Donors` (its sources), or a test's stand-in."""

    def find(
        self,
        fingerprints: Sequence[str],
        seed: int,
        data_digest: str | None = None,
        settings: dict[str, Any] | None = None,
    ) -> Donor | None: ...


def _difference(own: dict[str, Any], ours: dict[str, Any]) -> str:
    """The first setting where a donor's own settings differ from this trial's, and how many more."""
    mine, theirs = flat_params(own), flat_params(ours)
    keys = [k for k in sorted(mine.keys() | theirs.keys()) if mine.get(k) != theirs.get(k)]
    if not keys:
        return "the same settings as this trial's"
    first = keys[0]
    more = f", and {len(keys) - 1} more" if len(keys) > 1 else ""
    return f"{first} {mine.get(first, 'unset')} there, {theirs.get(first, 'unset')} here{more}"

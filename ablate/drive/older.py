"""Trials trained under an earlier version of a kind they use, copied so that a report is written
again with today's statistics from the trials already made (``ablate run --reuse DIR
--reuse-older-kinds``).

A kind's ``version`` goes up when what it trains changes (issue 37's float64 times moved
``ams``, ``time_interval``, ``rel_time`` and ``log_time_gap`` to version 2), and a trial trained
before then no longer counts as trained with today's settings: ``--reuse`` alone trains it again,
as it should when the trial is to stand beside new ones. A report rebuilt from such trials needs
them as they were: each is copied under the fingerprint it was trained with, tagged with the
versions it was trained under (:data:`~.ledger.OLDER_KINDS_TAG`), named in the report's Methods,
and written back to a trial file under its own fingerprint, never under today's. A trial with no
such record is never trained beside them (today's version would sit next to the older one in one
comparison): the run stops in one line.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ablate.drive.donor import Donor, Finder
from ablate.drive.ledger import LEGACY_VERSION, fingerprint_of, fingerprints, legacy_fingerprint, trained_with
from ablate.errors import AblateError, warn
from ablate.registry import COMPONENT_SLOTS
from ablate.tracking.names import OLDER_FINGERPRINT_TAG, OLDER_KINDS_TAG

if TYPE_CHECKING:  # pragma: no cover
    from ablate.study.load import Study
    from ablate.training.trainer import TrialResult


def older_fingerprints(study: Study, variant: str) -> dict[str, str]:
    """Every fingerprint a trial of ``variant`` had while some of its kinds were at an earlier
    version, each with what it says of them (``ams v1 (now v2)``): the settings' form for every
    combination of earlier versions, then the text-based legacy form, made when every kind was at
    version 1. Empty where no kind the trial uses was ever bumped."""
    settings = trained_with(study, variant)
    bumped = [entry for entry in _kinds(settings) if entry["version"] > LEGACY_VERSION]
    found: dict[str, str] = {}
    for versions in itertools.product(*(range(LEGACY_VERSION, e["version"] + 1) for e in bumped)):
        if all(v == e["version"] for v, e in zip(versions, bumped, strict=True)):
            continue  # today's versions: the trial's own fingerprint
        earlier = copy.deepcopy(settings)
        for entry, version in zip(_kinds(earlier), _versions(settings, bumped, versions), strict=True):
            entry["version"] = version
        pairs = zip(bumped, versions, strict=True)
        said = [f"{e['kind']} v{v} (now v{e['version']})" for e, v in pairs if v < e["version"]]
        found.setdefault(fingerprint_of(earlier), ", ".join(dict.fromkeys(said)))
    if bumped:
        every = dict.fromkeys(f"{e['kind']} v{LEGACY_VERSION} (now v{e['version']})" for e in bumped)
        found.setdefault(legacy_fingerprint(study, variant), ", ".join(every))
    return found


def _kinds(settings: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The kind entries (``{"kind", "version", "options"}``) of a trial's settings, in order."""
    for slot in COMPONENT_SLOTS:
        yield from settings["model"][slot]
    yield settings["task"]


def _versions(settings: dict[str, Any], bumped: list[dict[str, Any]], versions: tuple[int, ...]) -> list[int]:
    """The version of each kind entry of ``settings`` with the ``bumped`` ones at ``versions``."""
    chosen = {id(entry): version for entry, version in zip(bumped, versions, strict=True)}
    return [chosen.get(id(entry), entry["version"]) for entry in _kinds(settings)]


@dataclass(frozen=True)
class OlderDonor(Donor):
    """A donor found under one of :func:`older_fingerprints`: read as it is, tagged with the
    versions it was trained under and the fingerprint it was filed as."""

    donor: Donor
    versions: str

    @property
    def filed_as(self) -> str:
        return self.donor.filed_as

    @property
    def source(self) -> str:
        return self.donor.source

    @property
    def data_digest(self) -> str | None:
        return self.donor.data_digest

    def settings(self) -> dict[str, Any] | None:
        return self.donor.settings()

    def read(self) -> tuple[TrialResult, dict[str, str]]:
        result, tags = self.donor.read()
        return result, {**tags, OLDER_KINDS_TAG: self.versions, OLDER_FINGERPRINT_TAG: self.filed_as}


def find_with_older(donors: Finder, study: Study, variant: str, seed: int, data_digest: str | None) -> Donor:
    """The donor :meth:`~.reuse.Donors.find` gives for a trial of ``variant`` under its own
    fingerprints or, failing them, under :func:`older_fingerprints` (wrapped: :class:`OlderDonor`);
    an error where there is neither."""
    current = fingerprints(study, variant)
    older = older_fingerprints(study, variant)
    found = donors.find((*current, *older), seed, data_digest, trained_with(study, variant))
    if found is None:
        raise no_older_donor(variant, seed, older)
    if found.filed_as in current:
        return found
    warn(f"reused {variant} seed {seed} as trained under {older[found.filed_as]} ({found.source})")
    return OlderDonor(found, older[found.filed_as])


def no_older_donor(variant: str, seed: int, older: dict[str, str]) -> AblateError:
    """The one line a run stops with where ``--reuse-older-kinds`` finds nothing to copy."""
    versions = ", ".join(dict.fromkeys(older.values())) or "no earlier version of its kinds"
    return AblateError(
        f"{variant} seed {seed}: no finished trial to copy under --reuse-older-kinds ({versions}); it trains "
        "nothing, since a trial trained now would sit beside older ones in one comparison. Give the folder "
        "that holds it, cap a sequential study at the seeds recorded (seeds.max=N), or drop the flag to train"
    )


__all__ = ["OlderDonor", "find_with_older", "no_older_donor", "older_fingerprints"]

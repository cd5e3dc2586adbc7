"""Finished trials taken from elsewhere instead of trained again (``--reuse``), and trials written
out as files that outlive their store (``ablate report --trials DIR``).

A trial's numbers depend on what its fingerprint covers (model, training, task, metrics) and on
its seed, not on the study around it, so two studies sharing a variant — FuXi-α's ablation, whose
full model is ``hstu_fuxi_ml1m``'s ``fuxi-alpha`` — need not train it twice. A donor is a finished
trial with this trial's fingerprint and seed, either a run in another study's tracking store or a
trial file (:data:`TRIAL_SUFFIX`) written from one; its curves, best-epoch metrics, per-unit test
results, costs and provenance are copied into this study's run, tagged :data:`REUSED_TAG` with
where they came from. Search trials are never reused.

A donor is checked before anything of it is copied: the fingerprint and seed its record holds
against the name it was found by, its numbers for being finite, and — a record made since trial
runs keep them (:data:`~ablate.tracking.names.TRAINED_WITH`) — the fingerprint recomputed from the settings it
was trained with against that name and this study's trial; an older record without them, its
parameter count against this trial's model. A donor that fails one is refused in one line and the
trial trained.

Trial files are what keeps finished trials when the machine holding the store is lost: gzipped
JSON, one per trial, small enough to commit beside the report.
"""

from __future__ import annotations

import gzip
import json
import math
import re
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from ablate.drive.donor import Donor
from ablate.drive.ledger import fingerprints as fingerprints_of
from ablate.drive.ledger import trained_with
from ablate.drive.older import find_with_older
from ablate.errors import AblateError, first_line, parse_json, warn
from ablate.tracking.names import OLDER_FINGERPRINT_TAG, OLDER_KINDS_TAG, REUSED_TAG, ROLE, TRAINED_WITH
from ablate.tracking.provenance import PREFIX as CONDITIONS_PREFIX
from ablate.tracking.store import (
    PROVENANCE_TAGS,
    Tracker,
    default_uri,
    open_client,
    read_units,
    tracking_problem,
    trial_metrics,
)
from ablate.training.trainer import PRECISION_TAG, TrialResult

if TYPE_CHECKING:  # pragma: no cover
    from ablate.study.load import Study

# A donor's tags that say how its numbers were made (code, resumption, batch size, kind versions), carried.
CARRIED_TAGS = (*PROVENANCE_TAGS, "ablate.oom_retry", "ablate.resumed_from_epoch", "ablate.data_digest")
CARRIED_TAGS += (OLDER_KINDS_TAG, OLDER_FINGERPRINT_TAG, PRECISION_TAG)


def carried(tags: dict[str, str]) -> dict[str, str]:
    """The tags of a donor's run that travel with its numbers: :data:`CARRIED_TAGS` and the
    conditions it trained under (``ablate.env.*``: threads, CPU, fast paths), which are the
    donor's, not those of the process that copies it."""
    return {t: tags[t] for t in sorted(tags) if t in CARRIED_TAGS or t.startswith(CONDITIONS_PREFIX)}


TRIAL_SUFFIX = ".trial.json.gz"  # <variant>-seed<k>-<fingerprint>.trial.json.gz
TRIAL_FORMAT = 1
RUN_SEPARATOR = ", run "  # a donor's source ends with it and the run that trained it


@dataclass(frozen=True)
class StoredTrial(Donor):
    """A finished trial run in a tracking store."""

    client: Any  # an MlflowClient on the store
    uri: str
    experiment: str  # the study's name
    run: Any  # its mlflow Run

    @property
    def source(self) -> str:
        return f"{self.experiment} in {self.uri}{RUN_SEPARATOR}{self.run.info.run_id}"

    @property
    def data_digest(self) -> str | None:
        return self.run.data.tags.get("ablate.data_digest")

    @property
    def filed_as(self) -> str:
        tags = self.run.data.tags
        return tags.get(OLDER_FINGERPRINT_TAG, tags["ablate.fingerprint"])

    def settings(self) -> dict[str, Any] | None:
        run_id = self.run.info.run_id
        if OLDER_FINGERPRINT_TAG in self.run.data.tags:  # its artifact holds today's settings, not its own
            return None
        if not any(item.path == TRAINED_WITH for item in self.client.list_artifacts(run_id)):
            return None
        with tempfile.TemporaryDirectory() as tmp:
            return json.loads(Path(self.client.download_artifacts(run_id, TRAINED_WITH, tmp)).read_text())

    def read(self) -> tuple[TrialResult, dict[str, str]]:
        final, curves = trial_metrics(self.client, self.run)
        return _result(final, curves, read_units(self.client, self.run)), carried(self.run.data.tags)

    def write(self, folder: Path) -> Path | None:
        """This trial as a trial file in ``folder`` (what ``--reuse folder`` reads); None where a
        file there already holds this fingerprint and seed from another run — typically the donor
        a copied trial came from (under its own study's variant name, perhaps), which must keep naming
        the run that trained it — and is kept; so is a donor's file named with its legacy
        fingerprint (:func:`~.ledger.legacy_fingerprint`)."""
        tags = self.run.data.tags
        seed, filed_as = int(tags["seed"]), self.filed_as
        trial = _file_tail(seed, filed_as)
        path = folder / (re.sub(r"[^\w.-]", "_", tags["variant"]) + trial)
        if any(_run_in(other) not in (None, self.run.info.run_id) for other in folder.glob(f"*{trial}")):
            return None
        # The donor's file may be named with the fingerprint an older ablate gave it.
        donor = tags[REUSED_TAG].rpartition(RUN_SEPARATOR)[2] if REUSED_TAG in tags else None
        if donor and any(_run_in(other) == donor for other in folder.glob(f"*{_file_tail(seed, '*')}")):
            return None
        result, carried = self.read()
        record = {
            "format": TRIAL_FORMAT,
            "study": self.experiment,
            "run_id": self.run.info.run_id,
            "variant": tags["variant"],
            "seed": int(tags["seed"]),
            "fingerprint": filed_as,
            # Where it was trained: a trial copied into this store names the run it was copied from.
            "trained_in": tags.get(REUSED_TAG, self.source),
            "tags": carried,
            "final": {**result.summary, **result.costs()},
            "curves": result.curves,
            "per_unit": result.per_unit.to_dict(orient="split", index=False),
        }
        settings = self.settings()
        if settings is not None:  # what the fingerprint hashes: a reuse recomputes it
            record["trained_with"] = settings
        folder.mkdir(parents=True, exist_ok=True)
        # Python's float repr: every value reads back exactly. No time stamp in the gzip header:
        # writing an unchanged trial again gives the same bytes (a clean git diff).
        with open(path, "wb") as raw, gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0) as packed:
            packed.write(json.dumps(record).encode())
        return path


@dataclass(frozen=True)
class FiledTrial(Donor):
    """A trial file."""

    path: Path
    record: dict[str, Any]

    @property
    def source(self) -> str:
        return f"{self.record['study']} in {_shown(self.path.parent)}{RUN_SEPARATOR}{self.record['run_id']}"

    @property
    def data_digest(self) -> str | None:
        return self.record.get("tags", {}).get("ablate.data_digest")

    @property
    def filed_as(self) -> str:
        return self.record["fingerprint"]

    def settings(self) -> dict[str, Any] | None:
        return self.record.get("trained_with")

    def read(self) -> tuple[TrialResult, dict[str, str]]:
        split = self.record["per_unit"]
        per_unit = pd.DataFrame(split["data"], columns=split["columns"])
        curves = [(int(epoch), key, value) for epoch, key, value in self.record["curves"]]
        return _result(self.record["final"], curves, per_unit), dict(self.record["tags"])


def _result(final: dict[str, float], curves: list, per_unit: pd.DataFrame) -> TrialResult:
    """A donor's numbers as a result, each checked to be a finite number: a record edited by hand
    or damaged (a string, a NaN, an infinity) is refused, never copied into a report."""
    for key, value in [*final.items(), *((f"{key} at epoch {epoch}", v) for epoch, key, v in curves)]:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ValueError(f"{key} is {value!r}, not a finite number")
    metrics = per_unit.drop(columns="unit", errors="ignore")
    if not metrics.empty and not (metrics.apply(pd.to_numeric, errors="coerce").notna().all().all()):
        raise ValueError("its per-unit test results hold values that are not numbers")
    return TrialResult(
        summary={k: v for k, v in final.items() if k.startswith(("valid.", "test."))},
        per_unit=per_unit,
        curves=curves,
        params=int(final.get("params", 0)),
        tokens_per_s=final.get("tokens_per_s", 0.0),
        peak_memory_mb=final.get("peak_memory_mb", 0.0),
        wall_s=final.get("wall_s", 0.0),
        cpu_s=final.get("cpu_s", 0.0),
        train_gflop=final.get("train_gflop"),
        epochs=int(final.get("epochs", 0)),
        best_epoch=int(final.get("best_epoch", 0)),
    )


class Donors:
    """The places ``--reuse`` names (study output folders, tracking URIs, folders of trial
    files), searched in the order given."""

    def __init__(self, sources: Sequence[str | Path] = (), older_kinds: bool = False):
        if older_kinds and not sources:
            raise AblateError("--reuse-older-kinds copies from the places --reuse names: give one")
        self.sources = [_checked(s) for s in sources]  # as handed on to worker processes
        self.older_kinds = older_kinds  # also trials trained under earlier kind versions, and train none
        self._clients: dict[str, Any] = {}

    def __bool__(self) -> bool:
        return bool(self.sources)

    def find_for(self, study: Study, variant: str, seed: int, data_digest: str | None = None) -> Donor | None:
        """:meth:`find` for a final trial of ``variant`` in ``study`` (its fingerprints and settings);
        with ``older_kinds``, :func:`.older.find_with_older`."""
        if not self.sources:
            return None
        if self.older_kinds:
            return find_with_older(self, study, variant, seed, data_digest)
        return self.find(fingerprints_of(study, variant), seed, data_digest, trained_with(study, variant))

    def find(
        self,
        fingerprints: Sequence[str],
        seed: int,
        data_digest: str | None = None,
        settings: dict[str, Any] | None = None,
    ) -> Donor | None:
        """The first finished trial with one of these fingerprints (the trial's current one first,
        then those older stores and trial files carry: :func:`~.ledger.fingerprints`) and this
        seed that passes the checks (:func:`_refusal`; ``settings``: this trial's, to name how a
        refused one differs), or None. A candidate refused is named in one line; the search goes on."""
        for source in self.sources:
            try:
                for fingerprint in fingerprints:
                    for found in self._candidates(source, fingerprint, seed):
                        problem = _refusal(found, fingerprint, fingerprints, data_digest, settings)
                        if problem is None:
                            return found
                        warn(f"not reused ({found.source}): {problem}")
            except Exception as exc:  # noqa: BLE001 - a place gone unreadable costs a training, not the study
                warn(f"--reuse {source} not searched: {first_line(exc)}")
        return None

    def _candidates(self, source: str, fingerprint: str, seed: int) -> Iterator[Donor]:
        if "://" in source:
            yield from self._in_store(source, fingerprint, seed)
        else:
            yield from self._in_folder(Path(source), fingerprint, seed)

    def _in_store(self, uri: str, fingerprint: str, seed: int) -> list[Donor]:
        client = self._clients.setdefault(uri, open_client(uri))
        names = {e.experiment_id: e.name for e in client.search_experiments()}
        runs: list[Any] = []
        for tag in ("ablate.fingerprint", OLDER_FINGERPRINT_TAG):  # a copy under older kinds: by the latter
            wanted = (
                f"tags.`{tag}` = '{fingerprint}' and tags.seed = '{seed}'"
                f" and tags.`{ROLE}` = 'trial' and attributes.status = 'FINISHED'"
            )
            runs += (
                client.search_runs(
                    list(names), filter_string=wanted, max_results=10, order_by=["attributes.start_time ASC"]
                )
                if names
                else []
            )
        trained_as = [r for r in runs if r.data.tags.get(OLDER_FINGERPRINT_TAG, fingerprint) == fingerprint]
        return [StoredTrial(client, uri, names[run.info.experiment_id], run) for run in trained_as]

    @staticmethod
    def _in_folder(folder: Path, fingerprint: str, seed: int) -> Iterator[Donor]:
        for path in sorted(folder.glob(f"*{_file_tail(seed, fingerprint)}")):
            try:
                with gzip.open(path, "rt", encoding="utf-8") as handle:
                    record = parse_json(handle.read())
                if not isinstance(record, dict):
                    raise ValueError(f"a JSON {type(record).__name__}, not a trial's record")
            except (OSError, EOFError, ValueError) as exc:  # not gzip, cut short, not JSON, too deep
                warn(f"not reused: {path.name} cannot be read ({first_line(exc)}); training it instead")
                continue
            if record.get("format") != TRIAL_FORMAT:
                raise AblateError(f"{path}: trial file format {record.get('format')}, not {TRIAL_FORMAT}")
            # A file's name is what the search matched; its record says what was trained. A file
            # renamed (or a record edited) to pass for another model or seed is never copied.
            said = (record.get("fingerprint"), record.get("seed"))
            if said != (fingerprint, seed):
                warn(
                    f"not reused: {path.name} holds fingerprint {said[0]} seed {said[1]}, its name says "
                    f"{fingerprint} seed {seed} (renamed or altered)"
                )
                continue
            yield FiledTrial(path, record)


def _refusal(
    donor: Donor,
    filed_as: str,
    wanted: Sequence[str],
    data_digest: str | None,
    settings: dict[str, Any] | None,
) -> str | None:
    """Why ``donor``, found under fingerprint ``filed_as`` (one of this trial's, ``wanted``), is not
    this trial's to copy, or None: trained on other data (``data_digest``; a donor recorded before
    digests were is taken as trained on these), or settings of its own that hash to another
    fingerprint (:meth:`Donor.settings_problem`). Its numbers are checked as it is read."""
    other = donor.data_digest
    if other is not None and data_digest is not None and other != data_digest:
        return f"trained on other data ({other}, these are {data_digest})"
    try:
        problem = donor.settings_problem(filed_as, wanted, settings)
    except Exception as exc:  # noqa: BLE001 - a damaged record costs a training, never the study
        problem = f"its settings cannot be read: {first_line(exc)}"
    return None if problem is None else f"{problem}; training it instead"


def write_trials(tracking_uri: str, experiment: str, folder: Path) -> tuple[list[Path], int]:
    """Every finished trial of the study ``experiment`` as a trial file in ``folder``: the files
    written, and how many trials were left out because ``folder`` holds them from another run."""
    tracker = Tracker(tracking_uri, experiment, create=False)
    paths = [
        StoredTrial(tracker.client, tracking_uri, experiment, run).write(folder)
        for run in tracker.trial_runs(status="FINISHED")
    ]
    return [p for p in paths if p is not None], paths.count(None)


def _shown(folder: Path) -> Path:
    """``folder`` as a report names it: relative to the working folder where it lies below it
    (``reports/hstu_fuxi_ml1m/trials``), so a committed report reads the same on another machine."""
    try:
        return folder.resolve().relative_to(Path.cwd().resolve())
    except ValueError:  # elsewhere: the whole path is the only name it has
        return folder


def _file_tail(seed: int, fingerprint: str) -> str:
    """What a trial file's name ends with, after its variant's name."""
    return f"-seed{seed}-{fingerprint}{TRIAL_SUFFIX}"


def _run_in(path: Path) -> str | None:
    """The run a trial file was written from; None where there is no readable file."""
    try:
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            return json.load(handle)["run_id"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _checked(source: str | Path) -> str:
    """A ``--reuse`` place as workers are handed it: a tracking URI (a study's output folder
    becomes its ``mlflow.db``'s), or a folder of trial files; anything else is refused in one line."""
    text = str(source)
    if "://" in text:
        if problem := tracking_problem(text):
            raise AblateError(f"--reuse {text}: {problem}")
        # MLflow would create an empty database for a mistyped path and every trial would train.
        database = Path(text.removeprefix("sqlite:///")) if text.startswith("sqlite:///") else None
        if database is not None and not database.is_file():
            raise AblateError(f"--reuse {text}: no such database file ({database})")
        return text
    folder = Path(text)
    if (folder / "mlflow.db").is_file():
        return default_uri(folder)
    if folder.is_dir() and any(folder.glob(f"*{TRIAL_SUFFIX}")):
        return str(folder.resolve())
    raise AblateError(f"--reuse {text}: no finished trials there (no mlflow.db, no *{TRIAL_SUFFIX} files)")


__all__ = ["TRIAL_SUFFIX", "Donor", "Donors", "FiledTrial", "StoredTrial", "write_trials"]

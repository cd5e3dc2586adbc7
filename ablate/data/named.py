"""``task.data`` spelt by name: a data set (or several, one study each) named in a study file, resolved to
its files here (the mirror or the download cache, fetched when asked) and merged under the task's
data settings."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ablate.data.catalog import LEGACY_PREFIX, Dataset, lookup
from ablate.data.download import locate
from ablate.errors import DataError

if TYPE_CHECKING:
    from ablate.schema import Locator


@dataclass(frozen=True)
class NamedData:
    """``task.data`` spelt by name: the entry, the settings the study wrote beside the name, and
    the file (or folder) its path names on this machine."""

    dataset: Dataset
    written: dict[str, Any] = field(default_factory=dict)
    local: Path = Path()
    entries: tuple[Any, ...] = ()  # task.data lists several: each entry as written (this is the first)

    def options(self) -> dict[str, Any]:
        """The ``task.data`` mapping the task validates: the loader settings, the study's own
        over them, and the path of the files here."""
        return {**self.dataset.data, **self.written, "path": str(self.local)}

    def spelt_by_name(self, options: dict[str, Any]) -> dict[str, Any]:
        """The task's options as dumped for a fingerprint, its data named instead of placed: where
        the files sit on this machine (mirror or cache) does not change the numbers."""
        data = options.get("data")
        if not isinstance(data, dict):
            return options
        return {**options, "data": {**data, "path": f"data set {self.dataset.name}"}}

    def spelt_as_before(self, task: dict[str, Any]) -> dict[str, Any]:
        """The study file's task mapping with ``data`` as study files spelt this data set before
        names (:data:`LEGACY_PREFIX` and its mirror path): what the text-based fingerprint of the
        trials recorded then was computed from."""
        return {
            **task,
            "data": {**self.dataset.data, **self.written, "path": LEGACY_PREFIX + self.dataset.path},
        }


def entries_of(raw_data: Any) -> list[Any] | None:
    """The entries of ``task.data`` when it lists several data sets, else None."""
    return list(raw_data) if isinstance(raw_data, list) else None


def label_of(entry: Any) -> str | None:
    """The name an entry of ``task.data`` gives, or None (a path of the user's own)."""
    if isinstance(entry, str):
        return entry
    return entry.get("name") if isinstance(entry, dict) and isinstance(entry.get("name"), str) else None


def entry_override(entry: Any) -> str:
    """The ``task.data=…`` override that picks one entry of a list (JSON is YAML's flow style)."""
    return "task.data=" + json.dumps(entry)


def named_data(
    where: Locator, raw_task: dict[str, Any], check_files: bool
) -> tuple[NamedData | None, dict[str, Any]]:
    """``task.data`` of a study file read for names: the named data set the study trains on (None
    for a path of its own; a list's entries in its ``entries``: the study stands for its first entry
    until :mod:`ablate.commands.across` loads one study per entry), and the task mapping with ``data`` as
    the task reads it. Every problem names the key; a data set not here is a ``DataError`` saying
    how to get it."""
    raw = raw_task.get("data")
    entries = entries_of(raw)
    labels: list[str] = []
    if entries is not None:
        if not entries:
            raise where.error(("task", "data"), "an empty list: name at least one data set")
        for i, entry in enumerate(entries):
            label = label_of(entry)
            if label is None:
                raise where.error(
                    ("task", "data", i), "a list of data sets holds names (ml-100k or {name: ml-100k, ...})"
                )
            if label in labels:
                raise where.error(("task", "data", i), f"data set '{label}' is listed twice")
            labels.append(label)
        raw = entries[0]
    name = label_of(raw)
    if name is None:
        return None, raw_task
    key = ("task", "data") if entries is None else ("task", "data", 0)
    try:
        dataset = lookup(name)
    except ValueError as exc:
        raise where.error(key if isinstance(raw, str) else (*key, "name"), str(exc)) from None
    written = {k: v for k, v in raw.items() if k != "name"} if isinstance(raw, dict) else {}
    if "path" in written:
        raise where.error(
            (*key, "path"), f"data set '{name}' has its own files: give a name or a path, not both"
        )
    try:
        local = locate(dataset, fetch=check_files)
    except DataError as exc:
        raise DataError(f"{where.path}: task.data: {exc}") from None
    named = NamedData(dataset, written, local, tuple(entries or ()))
    return named, {**raw_task, "data": named.options()}

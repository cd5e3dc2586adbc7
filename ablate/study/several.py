"""A study over several data sets (``task.data: [beauty, sports, video]``) as one study per data
set: the study file with ``task.data=<entry>`` and ``name=<study>.<data set>`` as overrides, each
with its own output folder under the study's. What runs, reports and shows them is
:mod:`ablate.commands.across`."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from ablate.data.named import entry_override, label_of
from ablate.errors import AblateError
from ablate.study.load import Study, load_study


def several(study: Study) -> bool:
    """Whether the study lists several data sets."""
    return study.dataset is not None and len(study.dataset.entries) > 1


def one_dataset(study: Study, command: str) -> None:
    """Refuse, in one line, a study over several data sets where ``command`` takes one study."""
    if several(study):
        first = shlex.join(dataset_overrides(study, study.dataset.entries[0])[len(study.overrides) :])
        raise AblateError(
            f"task.data lists data sets: {command} takes one data set's study (`{first}` for the first; "
            f"`ablate run` runs them all)"
        )


def dataset_overrides(study: Study, entry: Any) -> list[str]:
    """The overrides that make the study file one data set's study."""
    return [*study.overrides, entry_override(entry), f"name={study.name}.{label_of(entry)}"]


def per_dataset(study: Study, check_files: bool = True) -> dict[str, Study]:
    """Data set → its study (loaded with :func:`dataset_overrides`)."""
    entries = study.dataset.entries if study.dataset is not None else ()
    return {label_of(e): load_study(study.path, check_files, dataset_overrides(study, e)) for e in entries}


def each_study(study: Study, output: Path | None) -> list[tuple[Study, Path | None]]:
    """The study and its ``--output``; for one over several data sets, each data set's."""
    if not several(study):
        return [(study, output)]
    subs = per_dataset(study, False).items()
    return [(sub, data_set_folders(study, label, output, None)[0]) for label, sub in subs]


def data_set_folders(
    study: Study, label: str, output: Path | None, reports: Path | None
) -> tuple[Path | None, Path | None]:
    """A data set's --output (under the study's --output or ``output:``, each its own folder) and
    --reports (under the study's)."""
    base = output or study.spec.output
    return (Path(base) / label if base else None), (reports / study.name if reports else None)

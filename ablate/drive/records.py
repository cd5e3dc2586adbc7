"""What a study's MLflow parent run records of the study itself: its tags, its parameters, and the
resolved study file (overrides applied, defaults filled in) as an artifact."""

from __future__ import annotations

from typing import TYPE_CHECKING

import yaml

if TYPE_CHECKING:  # pragma: no cover
    from ablate.study.load import Study


def study_tags(study: Study) -> dict[str, str]:
    return {
        "ablate.study": study.name,
        "ablate.task": study.task.kind_name(),
        "ablate.report_settings": study.report_settings_json(),
    }


def study_params(study: Study) -> dict[str, object]:
    spec = study.spec.model_dump(mode="json", include={"seeds", "task", "metrics"})
    return {"study_file": str(study.path), **spec}  # flattened by the tracker: task.kind, seeds.initial, …


def resolved_yaml(study: Study) -> str:
    """The validated study (overrides applied, defaults filled in) as YAML: what ran."""
    return yaml.safe_dump(study.spec.model_dump(mode="json"), sort_keys=False, allow_unicode=True)

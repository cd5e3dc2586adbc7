"""What a study's runs hold in MLflow and under which names: roles and tags, artifact paths, metric
and parameter keys (MLflow's character rules and size limits applied). Shared by the store that
writes them and by everything that reads them back."""

from __future__ import annotations

import json
import re
from typing import Any

ROLE = "ablate.role"
PARENT = "mlflow.parentRunId"
UNITS_ARTIFACT = "units/test.csv"
NO_UNITS_TAG = "ablate.no_units"  # a trial run whose task has no per-unit results: no artifact stored
TRAINED_WITH = "trained_with.json"  # a trial run's settings as its fingerprint hashes them (JSON)
STUDY_ARTIFACT = "study.resolved.yaml"  # the validated study, overrides applied
REPORT_FOLDER = "report"  # where the parent run keeps the written report
REPORT_FILES = ("md", "html", "csv", "comparisons", "tex")  # of write_report's paths
DATA_SUMMARY = "ablate.data_summary"  # a parent-run tag: the task's data summary as JSON
REUSED_TAG = "ablate.reused_from"  # a trial copied from another store: "<study> in <uri>, run <id>"
# A finished trial's validation metrics of its restored best state, logged under their own keys
# (``best.valid.ndcg_at_10``) so that each ``valid.*`` history holds exactly the per-epoch curve.
BEST_PREFIX = "best."
CURVE_PREFIXES = ("valid.", "train.")  # keys logged per epoch (step = epoch)
DATA_ARTIFACTS = "data"  # the parent run's folder for the task's data files (Task.artifacts)
# The most portable limits: older servers cap a parameter value at 500 characters, and MLflow
# takes at most 100 parameters per batch; keys keep word characters, '.', '-' and ' ' (MLflow also
# takes '/', but as a path that must not resolve elsewhere).
PARAM_VALUE_CHARS, PARAMS_PER_BATCH = 500, 100
_KEY_UNSAFE = re.compile(r"[^\w.\- ]")
# A trial copied though trained under earlier versions of its kinds (``--reuse-older-kinds``,
# :mod:`ablate.drive.older`): "ams v1 (now v2)", and the fingerprint it was trained under, which
# names its file.
OLDER_KINDS_TAG, OLDER_FINGERPRINT_TAG = "ablate.older_kinds", "ablate.older_fingerprint"


def to_mlflow(key: str) -> str:
    """MLflow metric names allow no '@': ``valid.ndcg@10`` is stored as ``valid.ndcg_at_10``."""
    return key.replace("@", "_at_")


def from_mlflow(key: str) -> str:
    return key.replace("_at_", "@")


def flat_params(params: dict[str, Any]) -> dict[str, str]:
    """Nested settings as MLflow parameters with plain values: ``{"model": {"attention": {"heads":
    2}}}`` → ``{"model.attention.heads": "2"}``; a list of mappings by position (``model.bias.0.kind``),
    other lists and non-strings as JSON (``[0.9, 0.98]``, ``true``), strings as they are."""
    flat: dict[str, str] = {}

    def walk(key: str, value: Any) -> None:
        if isinstance(value, dict) and value:
            for k, v in value.items():
                walk(f"{key}.{k}", v)
        elif isinstance(value, (list, tuple)) and value and all(isinstance(v, dict) for v in value):
            for i, v in enumerate(value):
                walk(f"{key}.{i}", v)
        else:
            text = value if isinstance(value, str) else json.dumps(value, default=str)
            if len(text) > PARAM_VALUE_CHARS:
                text = text[: PARAM_VALUE_CHARS - 1] + "…"
            flat[_KEY_UNSAFE.sub("_", to_mlflow(key))[:250]] = text

    for key, value in params.items():
        walk(key, value)
    return flat

"""Runs ablate did not make, read: a CSV file, a folder of JSON / YAML result files or an MLflow
experiment, one row per run, with where each row came from (``_from``: ``file:line``, a result
file, an MLflow run) so that a value no report can use is named where it was written. A server
that does not answer, a pipe or a device in place of a file is refused, not waited on."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pandas as pd

from ablate.errors import AblateError, first_line
from ablate.study.file import parse_yaml
from ablate.tasks import data_file_problem

MLFLOW_SCHEMES = ("sqlite:", "http:", "https:", "file:", "postgresql:", "mysql:", "databricks")
# Seconds an MLflow server has to answer, once (MLflow's default retries for minutes).
SERVER_TIMEOUT_S = 10
# Where each run was read: not a parameter (a leading "_" keeps it out of the groups' keys).
FROM = "_from"
_DECIMAL_COMMA = re.compile(r"\s*[-+]?\d+,\d+\s*")


def read_runs(source: str, experiment: str | None) -> pd.DataFrame:
    """One row per run, its parameters and metrics as columns, from a tracking URI (with
    ``experiment``), a CSV file or a folder of JSON / YAML result files."""
    if experiment is not None or source.startswith(MLFLOW_SCHEMES):
        if experiment is None:
            raise AblateError(f"{source} is a tracking URI: --experiment names the experiment to compare")
        return _mlflow_runs(source, experiment)
    path = Path(source)
    if path.is_dir():
        return _result_files(path)
    expected = "expected a CSV file of runs, a folder of result files or a tracking URI with --experiment"
    if not path.exists() and not path.is_symlink():
        raise AblateError(f"{source}: no such file or folder ({expected})")
    if problem := data_file_problem(path):  # a symbolic link loop or to nothing, a pipe
        raise AblateError(f"{source}: {problem.split(': ')[0]} ({expected})")
    try:
        runs = pd.read_csv(path, sep=None, engine="python")  # comma, tab or semicolon
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, OSError) as exc:
        raise AblateError(f"{path}: not a CSV file of runs ({first_line(exc)})") from None
    return runs.assign(**{FROM: [f"{path}:{i + 2}" for i in range(len(runs))]})  # line 1: the header


def _mlflow_runs(uri: str, experiment: str) -> pd.DataFrame:
    # Read when MLflow's client is imported; a user's own setting wins.
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(SERVER_TIMEOUT_S))
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():
        raise AblateError(f"no tracking store at {uri.removeprefix('sqlite:///')}")  # MLflow would make one
    try:
        client = MlflowClient(tracking_uri=uri)
        found = client.get_experiment_by_name(experiment)
        if found is None:
            names = ", ".join(e.name for e in client.search_experiments()) or "none"
            raise AblateError(f"--experiment {experiment}: no such experiment in {uri}; experiments: {names}")
        rows, token = [], None
        while True:
            page = client.search_runs(
                [found.experiment_id], "attributes.status = 'FINISHED'", max_results=1000, page_token=token
            )
            ids = [{"run_id": r.info.run_id, FROM: f"run {r.info.run_id}"} for r in page]
            rows += [{**r.data.params, **r.data.metrics, **i} for r, i in zip(page, ids, strict=True)]
            token = page.token
            if not token:
                return pd.DataFrame(rows)
    except (MlflowException, OSError) as exc:
        raise AblateError(f"{uri}: the tracking store did not answer ({first_line(exc)[:200]})") from None


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict:
    keys = [key for key, _ in pairs]
    if twice := sorted({key for key in keys if keys.count(key) > 1}):
        raise ValueError(f"key {twice[0]!r} given twice")
    return dict(pairs)


def _result_files(folder: Path) -> pd.DataFrame:
    records = []
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in (".json", ".yaml", ".yml"))
    for path in files:
        if problem := data_file_problem(path):  # a pipe would block the read
            raise AblateError(f"{path}: {problem.split(': ')[0]}")
        try:
            text = path.read_text(encoding="utf-8")
            if path.suffix.lower() == ".json":
                record = json.loads(text, object_pairs_hook=_no_duplicates)
            else:
                record, _ = parse_yaml(path, text)  # duplicate keys and alias bombs refused
        except AblateError as exc:  # it names the file, line and key
            said = str(exc).replace("not a valid study file", "not a readable result file")
            raise AblateError(said) from None
        except Exception as exc:  # noqa: BLE001 - any parser's refusal (deep nesting: RecursionError)
            raise AblateError(f"{path}: not a readable result file ({first_line(exc)})") from None
        if not isinstance(record, dict):
            raise AblateError(
                f"{path}: expected a mapping of parameters and metrics, got {type(record).__name__}"
            )
        records.append({**record, FROM: str(path)})
    if not records:
        raise AblateError(f"{folder}: no result files (*.json, *.yaml, *.yml) in it")
    return pd.json_normalize(records)  # nested keys joined with dots: params.lr, metrics.acc


def metric_values(runs: pd.DataFrame, column: str, what: str) -> pd.Series:
    """The metric ``column`` as finite numbers; a run without one, with text (a decimal comma
    named as such), NaN or an infinity is one line naming where it was read."""
    values = pd.to_numeric(runs[column], errors="coerce")
    unusable = ~np.isfinite(values.to_numpy(float))
    if unusable.any():
        at = runs.index[unusable][0]
        raw, value = runs[column][at], values[at]
        where = runs[FROM][at] if FROM in runs else f"run {at}"
        if pd.isna(raw):
            said = "has no value (empty, NaN or not recorded): remove the run or give its value"
        elif isinstance(raw, str) and _DECIMAL_COMMA.fullmatch(raw):
            said = f"is {raw!r}, a decimal comma: export the file with decimal points"
        elif pd.isna(value):
            said = f"is {raw!r}, not a number"
        else:
            said = f"is {value}, not a finite number: remove the run or give its value"
        raise AblateError(f"{where}: {what} ({column}) {said}")
    return values

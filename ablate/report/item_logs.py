"""Per-unit scores read from evaluation logs, one row per (model, seed, unit): a long table (CSV,
Parquet, JSON lines), lm-eval-harness ``--log_samples`` output (its ``samples_<task>_*.jsonl`` and
the ``results_*.json`` beside them) and inspect-ai logs (``.eval`` / ``.json``, through inspect-ai's
own ``read_eval_log``: units by sample id, epochs averaged per unit). Each row keeps where it was
read (``_from``: ``file:line``, a sample) so that a bad score is named where it was written.

A log of one model is labelled by its model name, or by the ``NAME=PATH`` the user wrote."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

import numpy as np
import pandas as pd

from ablate.errors import AblateError, first_line, parse_json
from ablate.margins import family_of
from ablate.schema import Vocabulary
from ablate.tasks import data_file_problem

FROM = "_from"  # where a row was read
SHOWN = 5  # items named in a message before "…"
# The long table's columns: each role and the names it may go by (the first is the one written).
COLUMN_ROLES: Vocabulary[tuple[str, ...]] = Vocabulary(
    "per-unit column",
    {
        "variant": ("model", "run", "variant"),
        "seed": ("seed",),
        "unit": ("unit", "item", "unit_id", "sample_id", "doc_id"),
        "cluster": ("cluster",),
        "weight": ("weight",),
        "task": ("task",),
    },
)
REQUIRED_ROLES = ("variant", "unit")


def first_few(items) -> str:
    """``n`` items named: the first few, then how many more."""
    items = list(items)
    shown = ", ".join(map(str, items[:SHOWN]))
    return shown + (f", … ({len(items) - SHOWN} more)" if len(items) > SHOWN else "")


def _json_lines(path: Path) -> list[tuple[int, dict]]:
    """(line number, record) of a JSON-lines file; a line that is not a JSON object (a file cut
    off mid-record) is named."""
    records = []
    with path.open(encoding="utf-8") as text:
        for number, line in enumerate(text, start=1):
            if not line.strip():
                continue
            try:
                record = parse_json(line)
            except json.JSONDecodeError as exc:
                cut = " (the file ends there: truncated?)" if not line.endswith("\n") else ""
                raise AblateError(f"{path}:{number}: not a JSON record{cut}: {exc.msg}") from None
            if not isinstance(record, dict):
                raise AblateError(f"{path}:{number}: a JSON line per unit must be an object")
            records.append((number, record))
    if not records:
        raise AblateError(f"{path}: no records")
    return records


def _long_table(path: Path, metric: str, label: str | None) -> pd.DataFrame:
    """model (run), seed, unit, score (the metric's column, or ``score``), cluster, weight, task."""
    if label is not None:
        raise AblateError(
            f"{label}={path}: a table names its models in its model column; NAME= names a log's"
        )
    try:
        if path.suffix == ".parquet":
            table = pd.read_parquet(path)
            lines = [f"{path}: row {i + 1}" for i in range(len(table))]
        elif path.suffix in (".jsonl", ".json"):
            numbered = _json_lines(path)
            table = pd.DataFrame([r for _, r in numbered])
            lines = [f"{path}:{n}" for n, _ in numbered]
        else:
            # a cell as written ("n/a" named in a message), an empty one missing
            table = pd.read_csv(path, sep=None, engine="python", keep_default_na=False, na_values=[""])
            lines = [f"{path}:{i + 2}" for i in range(len(table))]  # line 1: the header
    except (ValueError, OSError, UnicodeDecodeError, ImportError) as exc:
        raise AblateError(f"{path}: not a table of per-unit scores ({first_line(exc)})") from None
    columns = {}
    for role, names in COLUMN_ROLES.items():
        found = [c for c in table.columns if str(c).lower() in names]
        if len(found) > 1:
            raise AblateError(f"{path}: columns {', '.join(found)} all name the {role}; keep one")
        if found:
            columns[role] = found[0]
    score = metric if metric in table.columns else "score" if "score" in table.columns else None
    missing = [COLUMN_ROLES[r][0] for r in REQUIRED_ROLES if r not in columns] + ([] if score else [metric])
    if missing:
        raise AblateError(
            f"{path}: no column {', '.join(missing)} (a per-unit table has model or run, seed, unit, "
            f"{metric} or score, optional cluster and weight); columns: {', '.join(map(str, table.columns))}"
        )
    out = pd.DataFrame({role: table[c] for role, c in columns.items()})
    out["variant"] = out["variant"].astype(str)
    out["unit"] = out["unit"].astype(str)
    out["seed"] = out["seed"] if "seed" in out else 0
    return out.assign(score=table[score], **{FROM: lines})


def _lm_eval(path: Path, metric: str, label: str | None) -> pd.DataFrame:
    """lm-eval-harness samples: one ``samples_<task>_<time>.jsonl`` (or the one in a folder);
    units by ``doc_id``, the model named by the ``results_*.json`` beside it."""
    files = sorted(path.rglob("samples_*.jsonl")) if path.is_dir() else [path]
    tasks = sorted({f.name.removeprefix("samples_").rsplit("_", 1)[0] for f in files})
    if len(tasks) > 1:
        raise AblateError(
            f"{path}: samples of {len(tasks)} tasks ({first_few(tasks)}); compare one task at a time: "
            "name its samples_<task>_*.jsonl file"
        )
    if len(files) != 1:
        found = first_few(f.name for f in files) if files else "none"
        raise AblateError(f"{path}: expected one samples_<task>_*.jsonl file; found {found}")
    samples = files[0]
    results = sorted(samples.parent.glob("results_*.json"))
    try:
        written = parse_json(results[-1].read_text(encoding="utf-8")) if results else {}
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise AblateError(f"{results[-1]}: not lm-eval's results file ({first_line(exc)})") from None
    if not isinstance(written, dict):
        raise AblateError(f"{results[-1]}: not lm-eval's results file (not a JSON object)")
    version = written.get("lm_eval_version", "unknown")
    rows = []
    for number, record in _json_lines(samples):
        absent = [k for k in ("doc_id", metric) if k not in record]
        if absent:
            known = ", ".join(k for k in record.get("metrics", []) if k in record) or "none"
            raise AblateError(
                f"{samples}:{number}: no {' or '.join(absent)} in the record (written by lm-eval "
                f"{version}, read as lm-eval {_installed('lm-eval')} writes; its per-item metrics: {known})"
            )
        rows.append((str(record["doc_id"]), record[metric], f"{samples}:{number}"))
    name = label or written.get("model_name") or samples.parent.name
    frame = pd.DataFrame(rows, columns=["unit", "score", FROM])
    return frame.assign(variant=name, seed=0, task=tasks[0])


def _installed(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "(not installed)"


def _inspect(path: Path, metric: str, label: str | None) -> pd.DataFrame:
    """An inspect-ai log through its own reader: units by sample id, each epoch a repeat (their
    mean is the unit's score); ``metric`` names the scorer."""
    try:
        from inspect_ai.log import read_eval_log
        from inspect_ai.scorer import value_to_float
    except ImportError:
        raise AblateError(
            f"{path}: reading inspect-ai logs needs pip install 'ablate-studies[inspect]'"
        ) from None
    try:
        log = read_eval_log(str(path))
    except Exception as exc:  # its reader's own errors: a cut or foreign file, another format version
        raise AblateError(
            f"{path}: inspect-ai {_installed('inspect-ai')} cannot read it as a log ({first_line(exc)[:200]})"
        ) from None
    if log.status != "success" or not log.samples:
        raise AblateError(
            f"{path}: the evaluation's status is {log.status!r} with {len(log.samples or [])} samples"
        )
    to_float, rows = value_to_float(), []
    for sample in log.samples:
        score = (sample.scores or {}).get(metric)
        where = f"{path}: sample {sample.id} epoch {sample.epoch}"
        if score is None:
            scorers = ", ".join(sample.scores or {}) or "none"
            raise AblateError(f"{where}: no score {metric!r}; its scorers: {scorers}")
        value = score.value if isinstance(score.value, int | float) else to_float(score.value)
        rows.append((str(sample.id), sample.epoch, value, where))
    frame = pd.DataFrame(rows, columns=["unit", "epoch", "score", FROM])
    frame = frame.assign(variant=label or log.eval.model, seed=0, task=log.eval.task)
    return frame


# How a file is read, by its name; a folder holds lm-eval samples.
LOG_FORMATS: Vocabulary[Callable[[Path, str, str | None], pd.DataFrame]] = Vocabulary(
    "per-unit log format",
    {
        "long table": _long_table,
        "lm-eval-harness samples": _lm_eval,
        "inspect-ai log": _inspect,
    },
)


def log_format(path: Path) -> str:
    if path.is_dir() or path.name.startswith("samples_"):
        return "lm-eval-harness samples"
    if path.suffix == ".eval":
        return "inspect-ai log"
    if path.suffix == ".json":  # an inspect-ai JSON log is one object with its "eval"
        with path.open("rb") as head:
            return "inspect-ai log" if b'"eval"' in head.read(4096) else "long table"
    return "long table"


def _label(source: str) -> tuple[str | None, Path]:
    """``NAME=PATH`` (a log's model named) or ``PATH``."""
    if "=" in source and not Path(source).exists():
        name, _, path = source.partition("=")
        return name, Path(path)
    return None, Path(source)


def read_items(sources: list[str], metric: str) -> tuple[pd.DataFrame, list[str]]:
    """The sources' per-unit scores as one frame (``variant``, ``seed``, ``unit``, ``score``, ``_from``
    and ``task``, ``cluster``, ``weight``, ``epoch`` where given) and one line per source saying
    how it was read. A model named by two sources, several tasks, a score that is not a number, or
    outside [0, 1] for an accuracy-like metric: one line naming the file and the rows."""
    frames, read = [], []
    for source in sources:
        label, path = _label(source)
        expected = "expected a per-unit table or an evaluation log"
        if not path.exists() and not path.is_symlink():
            raise AblateError(f"{path}: no such file or folder ({expected})")
        if problem := data_file_problem(path):  # a symbolic link loop or to nothing, a pipe
            raise AblateError(f"{path}: {problem.split(': ')[0]} ({expected})")
        kind = log_format(path)
        frame = LOG_FORMATS[kind](path, metric, label)
        frame["_source"] = str(path)
        names = sorted(frame["variant"].unique())
        epochs = f", {frame['epoch'].nunique()} epochs each (their mean per unit)" if "epoch" in frame else ""
        read.append(f"{path}: {kind}, {len(frame)} rows, {first_few(names)}{epochs}")
        frames.append(frame)
    frame = pd.concat(frames, ignore_index=True)
    owners = frame.groupby("variant")["_source"].unique()
    for name, files in owners.items():
        if len(files) > 1:
            raise AblateError(
                f"{files[0]} and {files[1]} both hold model {name!r}: label each log, NAME=PATH"
            )
    if "task" in frame and frame["task"].nunique() > 1:
        tasks = frame.groupby("task")["_source"].first()
        said = first_few(f"{t} ({f})" for t, f in tasks.items())
        raise AblateError(f"mixed tasks: {said}; compare one task at a time")
    return _checked_scores(_checked_keys(frame), metric), read


def _checked_keys(frame: pd.DataFrame) -> pd.DataFrame:
    """Every row with its seed (a whole number), unit, and where given its cluster and a positive
    weight: a row without one would fall out of the pairing unseen."""
    seeds = pd.to_numeric(frame["seed"], errors="coerce")
    weights = pd.to_numeric(frame["weight"], errors="coerce") if "weight" in frame else None
    problems = {
        "no seed, or not a whole number": seeds.isna() | (seeds % 1 != 0),
        "no unit id": frame["unit"].isna() | (frame["unit"].astype(str).str.strip() == ""),
    }
    if "cluster" in frame:
        problems["no cluster"] = frame["cluster"].isna()
    if weights is not None:
        problems["a weight that is not a positive number"] = ~(weights > 0) | ~np.isfinite(weights.fillna(0))
    for what, bad in problems.items():
        if bad.any():
            raise AblateError(f"{int(bad.sum())} row(s) with {what}: {first_few(frame.loc[bad, FROM])}")
    frame = frame.assign(seed=seeds.astype(int))
    return frame if weights is None else frame.assign(weight=weights.astype(float))


def _checked_scores(frame: pd.DataFrame, metric: str) -> pd.DataFrame:
    scores = pd.to_numeric(frame["score"].map(_number), errors="coerce")
    bad = frame.loc[scores.isna() | ~np.isfinite(scores.fillna(0.0)), FROM]
    if len(bad):
        values = frame.loc[bad.index, "score"]
        said = first_few(f"{w} ({v!r})" for w, v in zip(bad, values, strict=True))
        raise AblateError(f"{len(bad)} score(s) of {metric} are not finite numbers: {said}")
    if family_of(metric) == "accuracy-like":
        out = frame.loc[(scores < 0) | (scores > 1), FROM]
        if len(out):
            said = first_few(f"{w} ({v:g})" for w, v in zip(out, scores[out.index], strict=True))
            raise AblateError(f"{len(out)} score(s) of {metric} outside [0, 1]: {said}")
    frame = frame.assign(score=scores.astype(float))
    if "epoch" in frame:  # inspect-ai's repeats: the unit's score is their mean
        keys = [c for c in ("variant", "seed", "unit", "task", "_source") if c in frame]
        frame = frame.groupby(keys, sort=False).agg(score=("score", "mean"), **{FROM: (FROM, "first")})
        frame = frame.reset_index()
    return frame


def _number(value):
    """A score as a float where it is one (bool and numeric text included), else NaN."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return math.nan
    return math.nan

"""A validated study: the study file's components resolved against the registry, variants
expanded (named patches and the factorial grid), compatibility with the task checked.

Every problem becomes a :class:`~ablate.errors.StudyError` whose one-line message names the
file, the line and the key path (:mod:`ablate.studyfile`).
"""

from __future__ import annotations

import copy
import itertools
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from .components import BuildContext, Component, Connection
from .errors import DataError, StudyError
from .search import SEARCH_ROOTS, check_search
from .spec import BASE, ComponentSpec, ModelSpec, StudySpec, TrainSpec
from .studyfile import Bare, Locator, lookup, parse, validate_options
from .tasks import Task


# Placements whose attention sub-layer takes keys / values from the un-normalised stream.
SOURCE_PLACEMENTS = frozenset({"pre_skip_kv"})


def placement_problem(placement: str, attention: type, connection: type) -> str | None:
    """Why ``placement`` cannot go with these attention / connection kinds, or None. A
    placement that hands the attention a separate key / value source needs a kind that takes
    one and a single-stream connection (whose branch input is its own input)."""
    if placement not in SOURCE_PLACEMENTS:
        return None
    if not attention.takes_source:
        return (f"{placement!r} takes the attention's keys and values from the un-normalised stream, "
                f"which attention kind '{attention.kind_name()}' does not support (softmax does); "
                f"use placement 'pre_skip'")
    if connection.stem.__func__ is not Connection.stem.__func__:  # its own stem: a stream layout
        return (f"{placement!r} needs a single-stream connection (residual), but connection kind "
                f"'{connection.kind_name()}' keeps several streams; use placement 'pre_skip'")
    return None


# ---------------------------------------------------------------------------------------
# Resolved (registry-checked) form


@dataclass(frozen=True)
class Part:
    """One resolved component: its class and validated options."""

    slot: str
    cls: type[Component]
    options: Any

    @property
    def label(self) -> str:
        return self.cls.describe(self.options)


@dataclass(frozen=True)
class Variant:
    name: str
    spec: ModelSpec
    attention: Part
    ffn: Part
    norm: Part
    connection: Part
    bias: tuple[Part, ...]

    def components(self) -> dict[str, str]:
        """Slot -> label, for tags and the report's 'differs' column."""
        return {
            "attention": self.attention.label,
            "ffn": self.ffn.label,
            "norm": f"{self.norm.label} ({self.spec.norm.placement})",
            "connection": self.connection.label,
            "bias": "+".join(p.label for p in self.bias) or "none",
            "shape": f"d={self.spec.dim},L={self.spec.blocks},p={self.spec.dropout}",
        }

    def differs_from(self, other: "Variant") -> str:
        mine, theirs = self.components(), other.components()
        diffs = [f"{k}: {mine[k]}" for k in mine if mine[k] != theirs[k]]
        return "; ".join(diffs) if diffs else "—"


@dataclass
class Study:
    spec: StudySpec
    path: Path
    task: Task
    variants: dict[str, Variant]  # base first
    loss: BaseModel
    metrics: list[str] = field(default_factory=list)  # primary first

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def base_dir(self) -> Path:
        return self.path.parent

    def output_dir(self, override: str | Path | None = None) -> Path:
        chosen = override or self.spec.output or Path("runs") / self.name
        return Path(chosen).resolve()

    def report_settings(self) -> dict[str, Any]:
        """What the report needs from the study file (stored with the study in MLflow, so a
        report can be rebuilt from the tracking store alone)."""
        rep = self.spec.report
        return {
            "study": self.name, "primary": self.metrics[0], "metrics": self.metrics,
            "baseline": rep.baseline, "alpha": rep.alpha, "correction": rep.correction,
            "bootstrap": rep.bootstrap, "ci": rep.ci, "calibration": rep.calibration,
            "higher_is_better": {m: self.task.metric_higher_is_better(m) for m in self.metrics},
            "variants": list(self.variants),
        }

    def report_settings_json(self) -> str:
        """:meth:`report_settings` as the JSON text stored with the study in MLflow."""
        return json.dumps(self.report_settings())

    def with_params(self, variant: str, params: dict[str, Any]) -> tuple["Study", Variant]:
        """This study with ``params`` (dotted ``model.*`` / ``train.*`` keys) applied to
        ``variant`` and to the training settings. Raises :class:`StudyError` naming the key."""
        model = self.variants[variant].spec.model_dump()
        train = self.spec.train.model_dump()
        for dotted, value in params.items():
            root, *path = dotted.split(".")
            if root not in SEARCH_ROOTS or not path:
                raise StudyError(f"{dotted}: not a model.* or train.* key")
            _set_dotted({"model": model, "train": train}[root], path, value)
        where = Bare(self.path, {})
        try:
            train_spec = TrainSpec.model_validate(train)
        except ValidationError as exc:
            raise where.pydantic(exc, ("train",)) from None
        try:
            loss = type(self.loss).model_validate(train_spec.loss)
        except ValidationError as exc:
            raise where.pydantic(exc, ("train", "loss")) from None
        resolved = _resolve_variant(where, variant, model, ("model",), self.task)
        spec = self.spec.model_copy(update={"train": train_spec})
        changed = replace(self, spec=spec, loss=loss, variants={**self.variants, variant: resolved})
        return changed, resolved

    def build_context(self, variant: Variant, max_len: int) -> BuildContext:
        return BuildContext(
            dim=variant.spec.dim,
            dropout=variant.spec.dropout,
            max_len=max_len,
            ordered=self.task.ordered,
            features=self.task.features(),
            values_width=self.task.values_width(),
        )


# ---------------------------------------------------------------------------------------


def load_study(path: str | Path, check_files: bool = True) -> Study:
    """Parse and fully validate a study file. Raises :class:`StudyError` / :class:`DataError`."""
    path = Path(path)
    if not path.is_file():
        raise StudyError(f"{path}: study file not found")
    text = path.read_text()
    raw, lines = parse(path, text)
    where = Locator(path, lines)
    try:
        spec = StudySpec.model_validate(raw)
    except ValidationError as exc:
        raise where.pydantic(exc, ()) from None

    task_cls = lookup(where, ("task", "kind"), "task", spec.task.kind)
    task_options = validate_options(where, ("task",), task_cls, {k: v for k, v in raw["task"].items() if k != "kind"})
    task: Task = task_cls(task_options, path.parent.resolve())

    try:
        loss = task_cls.LossOptions.model_validate(spec.train.loss)
    except ValidationError as exc:
        raise where.pydantic(exc, ("train", "loss")) from None

    metrics = [spec.metrics.primary.lower()] + [m.lower() for m in spec.metrics.also]
    for i, metric in enumerate(metrics):
        problem = task.check_metric(metric)
        if problem:
            key = ("metrics", "primary") if i == 0 else ("metrics", "also", i - 1)
            raise where.error(key, problem)

    variants = {BASE: _resolve_variant(where, BASE, raw.get("model", {}), ("model",), task)}
    for name, patch in _expand(where, spec).items():
        if name == BASE:
            raise where.error(("variants", name), f"'{BASE}' is the name of the base model; rename the variant")
        merged = _patch(raw.get("model", {}), patch)
        variants[name] = _resolve_variant(where, name, merged, ("variants", name), task, patch)

    if spec.report.baseline not in variants:
        raise where.error(
            ("report", "baseline"),
            f"baseline '{spec.report.baseline}' is not a variant (variants: {', '.join(variants)})",
        )
    study = Study(spec=spec, path=path.resolve(), task=task, variants=variants, loss=loss, metrics=metrics)
    check_search(where, study)
    if check_files:
        problem = task.check_files()
        if problem:
            raise DataError(f"{path}: task.data: {problem}")
    return study



def _resolve_variant(
    where: Locator, name: str, raw_model: dict, key: tuple, task: Task, patch: dict | None = None
) -> Variant:
    # Keys the patch does not touch are reported at their place in the base model.
    base_key = ("model",)
    try:
        spec = ModelSpec.model_validate(raw_model)
    except ValidationError as exc:
        raise where.pydantic(exc, key, base_key) from None

    def part(slot: str, comp: ComponentSpec, sub: tuple) -> Part:
        cls = lookup(where, key + sub + ("kind",), slot, comp.kind)
        opts = validate_options(where, key + sub, cls, comp.options(), base_key + sub)
        return Part(slot, cls, opts)

    parts = dict(
        attention=part("attention", spec.attention, ("attention",)),
        ffn=part("ffn", spec.ffn, ("ffn",)),
        norm=part("norm", spec.norm, ("norm",)),
        connection=part("connection", spec.connection, ("connection",)),
        bias=tuple(part("bias", b, ("bias", i)) for i, b in enumerate(spec.bias)),
    )
    for sub, p in [(("attention",), parts["attention"]), (("ffn",), parts["ffn"]), (("norm",), parts["norm"]),
                   (("connection",), parts["connection"])] + [(("bias", i), b) for i, b in enumerate(parts["bias"])]:
        problem = incompatibility(p, task.kind_name(), task.features(), task.ordered)
        if problem:
            raise where.error(key + sub + ("kind",), problem, base_key + sub)
    problem = placement_problem(spec.norm.placement, parts["attention"].cls, parts["connection"].cls)
    if problem:
        raise where.error(key + ("norm", "placement"), problem, base_key + ("norm", "placement"))
    return Variant(name=name, spec=spec, **parts)


def incompatibility(part: Part, task: str, features: frozenset[str], ordered: bool) -> str | None:
    """Why ``part`` cannot run on this task's tokens (naming both sides), or None."""
    kind = f"{part.slot} kind '{part.cls.kind_name()}'"
    missing = set(part.cls.requirements(part.options)) - set(features)
    if missing:
        return (f"{kind} needs {', '.join(sorted(missing))}, but task '{task}' with these data options "
                f"provides {', '.join(sorted(features)) or 'no side information'}")
    if part.cls.ordered_only and not ordered:
        return f"{kind} needs ordered tokens (sequences), but task '{task}' has unordered tokens"
    if part.cls.unordered_only and ordered:
        return f"{kind} works on unordered token sets, but task '{task}' has ordered tokens used causally"
    return None


def _patch(base: dict, patch: dict) -> dict:
    """Deep-merge a variant's patch into the base model. A component whose ``kind``
    changes is replaced whole (the old kind's options would not fit the new kind);
    lists are replaced."""
    out = copy.deepcopy(base)
    for key, value in patch.items():
        old = out.get(key)
        if isinstance(value, dict) and isinstance(old, dict) and value.get("kind", old.get("kind")) == old.get("kind"):
            out[key] = _patch(old, value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _expand(where: Locator, spec: StudySpec) -> dict[str, dict]:
    """Named variants, then the factorial grid (``{"attention.heads": [1, 2], ...}``)."""
    variants = dict(spec.variants)
    if not spec.grid:
        return variants
    keys = list(spec.grid)
    for key in keys:
        if not spec.grid[key]:
            raise where.error(("grid", key), "a grid axis needs at least one value")
    for values in itertools.product(*(spec.grid[k] for k in keys)):
        patch: dict = {}
        for dotted, value in zip(keys, values):
            node = patch
            parts = dotted.split(".")
            for p in parts[:-1]:
                node = node.setdefault(p, {})
            node[parts[-1]] = value
        name = ",".join(f"{k}={v}" for k, v in zip(keys, values))
        if name in variants:
            raise where.error(("grid",), f"grid variant '{name}' clashes with a named variant")
        variants[name] = patch
    return variants



def _set_dotted(node: dict, path: list[str], value: Any) -> None:
    for part in path[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            raise StudyError(f"{'.'.join(path)}: '{part}' holds no keys")
        node = child
    if path[-1] == "kind":  # a new kind starts from its own defaults (as a variant patch does)
        node.clear()
    node[path[-1]] = value



"""Study files: parse (YAML or TOML), validate against the registry, expand variants.

Every problem becomes a :class:`StudyError` whose one-line message names the file, the line
(where the file format gives one) and the key path, e.g.::

    studies/x.yaml:12: model.attention.kind: unknown attention kind 'sofmax'; did you mean 'softmax'? ...
"""

from __future__ import annotations

import copy
import itertools
import re
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import torch
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from . import registry
from .components import BuildContext, Component, Connection
from .errors import AblateError, DataError, StudyError
from .tasks import Task

BASE = "base"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ComponentSpec(BaseModel):
    """``{kind: NAME, **options}``; the options are validated by the kind's own model."""

    model_config = ConfigDict(extra="allow")
    kind: str

    def options(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


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


class NormSpec(ComponentSpec):
    # A block option, not one of the norm kind's.
    placement: Literal["pre", "post", "pre_skip", "pre_skip_kv"] = "pre"

    def options(self) -> dict[str, Any]:
        return {k: v for k, v in super().options().items() if k != "placement"}


class ModelSpec(_Strict):
    dim: int = Field(64, gt=0)
    blocks: int = Field(2, ge=0)
    dropout: float = Field(0.2, ge=0.0, lt=1.0)
    attention: ComponentSpec = ComponentSpec(kind="softmax")
    ffn: ComponentSpec = ComponentSpec(kind="pointwise")
    norm: NormSpec = NormSpec(kind="layernorm")
    connection: ComponentSpec = ComponentSpec(kind="residual")
    bias: list[ComponentSpec] = [ComponentSpec(kind="abs_pos")]
    # Weights of the blocks' linear layers: each kind's own initialisation (``default``: PyTorch's
    # for nn.Linear) or Xavier-normal for all of them (SASRec's released code).
    init: Literal["default", "xavier_normal"] = "default"


class TaskSpec(BaseModel):
    model_config = ConfigDict(extra="allow")
    kind: str


class TrainSpec(_Strict):
    epochs: int = Field(20, gt=0)
    batch_size: int = Field(128, gt=0)
    # Rows per evaluation forward; unset: 64 on CPU, where each torch thread evaluates its own
    # batches (ablate.tasks.evaluation_streams) and 64 rows of a d ≈ 50 model stay in a core's
    # cache, 512 on a GPU. ML-1M full ranking: 0.98–1.22× (median ≈ 1.13×) as fast as one
    # two-threaded stream of 128 rows, 1.05–1.6× of 512 (benchmarks/RESULTS.md, session 8).
    eval_batch_size: int | None = Field(None, gt=0)
    lr: float = Field(1e-3, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    optimizer: Literal["adam", "adamw"] = "adam"
    betas: tuple[float, float] = (0.9, 0.98)
    grad_clip: float | None = Field(None, gt=0)
    # Stop when the primary validation metric has not improved for this many evaluations.
    patience: int | None = Field(None, gt=0)
    eval_every: int = Field(1, gt=0)
    loss: dict[str, Any] = {}
    device: str = "auto"
    # Training steps under bf16 autocast (weights and optimizer stay fp32; evaluation is fp32):
    # ``auto`` = bf16 on CUDA, fp32 elsewhere; ``bf16`` on CPU uses AMX / AVX-512-BF16 if present.
    precision: Literal["auto", "fp32", "bf16"] = "auto"

    def eval_rows(self, device: torch.device) -> int:
        """Rows per evaluation forward on ``device``."""
        if self.eval_batch_size is not None:
            return self.eval_batch_size
        return 64 if torch.device(device).type == "cpu" else 512

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        if v not in ("auto", "cpu") and not re.fullmatch(r"cuda(:\d+)?|mps", v):
            raise ValueError("expected 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'")
        return v


class FloatRange(_Strict):
    type: Literal["float"]
    low: float
    high: float
    log: bool = False
    step: float | None = Field(None, gt=0)


class IntRange(_Strict):
    type: Literal["int"]
    low: int
    high: int
    log: bool = False
    step: int = Field(1, gt=0)


class Categorical(_Strict):
    type: Literal["categorical"]
    choices: list[Any]


Dimension = Annotated[Union[FloatRange, IntRange, Categorical], Field(discriminator="type")]
SEARCH_ROOTS = ("model", "train")


class SearchSpec(_Strict):
    """Hyper-parameter search per variant, before the seeds are trained (``trials: 0``: none)."""

    trials: int = Field(0, ge=0)  # budget PER VARIANT: every variant gets the same number of trials
    space: dict[str, Dimension] = {}  # dotted keys under model.* / train.*
    sampler: Literal["tpe", "random", "grid"] = "tpe"
    pruner: Literal["none", "median", "hyperband"] = "none"
    seed: int | None = None  # training seed of search trials; default: the study's first seed

    @property
    def enabled(self) -> bool:
        return bool(self.space)


class MetricsSpec(_Strict):
    primary: str
    also: list[str] = []


class ReportSpec(_Strict):
    baseline: str = BASE
    alpha: float = Field(0.05, gt=0, lt=1)
    correction: Literal["holm", "fdr_bh"] = "holm"
    bootstrap: int = Field(10_000, ge=100)
    # Interval for Δ: smoothed studentized bootstrap (calibrated for 3–5 seeds), plain, or percentile.
    ci: Literal["smoothed-bootstrap-t", "bootstrap-t", "percentile"] = "smoothed-bootstrap-t"
    # Null comparisons simulated at report time for the calibration section (0: skip).
    calibration: int = Field(200, ge=0)


class StudySpec(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    description: str = ""
    task: TaskSpec
    model: ModelSpec = ModelSpec()
    variants: dict[str, dict[str, Any]] = {}
    grid: dict[str, list[Any]] = {}
    train: TrainSpec = TrainSpec()
    search: SearchSpec = SearchSpec()
    # Scale each variant's declared width knob (the slot's ``width_option``) so its backbone
    # has the base's parameter count within 2%; ``true`` means the ffn slot.
    match_params: bool | Literal["attention", "ffn", "norm", "connection"] = False
    seeds: list[int] = Field([0], min_length=1)
    metrics: MetricsSpec
    report: ReportSpec = ReportSpec()
    # Where the Optuna and MLflow stores live; default runs/<name> under the working dir.
    output: str | None = None

    @field_validator("seeds")
    @classmethod
    def _unique_seeds(cls, v: list[int]) -> list[int]:
        if len(set(v)) != len(v):
            raise ValueError("seeds must be distinct")
        return v


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
        where = _Bare(self.path, {})
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
    raw, lines = _parse(path, text)
    where = _Locator(path, lines)
    try:
        spec = StudySpec.model_validate(raw)
    except ValidationError as exc:
        raise where.pydantic(exc, ()) from None

    task_cls = _lookup(where, ("task", "kind"), "task", spec.task.kind)
    task_options = _options(where, ("task",), task_cls, {k: v for k, v in raw["task"].items() if k != "kind"})
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
    _check_search(where, study)
    if check_files:
        problem = task.check_files()
        if problem:
            raise DataError(f"{path}: task.data: {problem}")
    return study


def _parse(path: Path, text: str) -> tuple[dict, dict[tuple, int]]:
    try:
        if path.suffix.lower() == ".toml":
            return tomllib.loads(text), {}
        raw = yaml.safe_load(text)
        lines = _yaml_lines(text)
    except (yaml.YAMLError, tomllib.TOMLDecodeError) as exc:
        mark = getattr(exc, "problem_mark", None)
        loc = f":{mark.line + 1}" if mark is not None else ""
        first = str(exc).strip().splitlines()[0]
        raise StudyError(f"{path}{loc}: not valid {path.suffix.lstrip('.').upper() or 'YAML'}: {first}") from None
    if not isinstance(raw, dict):
        raise StudyError(f"{path}: a study file must be a mapping of keys (name, task, model, ...)")
    return raw, lines


def _yaml_lines(text: str) -> dict[tuple, int]:
    """Key path -> 1-based line of the key, from the YAML node tree."""
    lines: dict[tuple, int] = {}

    def walk(node: yaml.Node, path: tuple) -> None:
        lines.setdefault(path, node.start_mark.line + 1)
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                sub = path + (key.value,)
                lines[sub] = key.start_mark.line + 1
                walk(value, sub)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                walk(item, path + (i,))

    root = yaml.compose(text)
    if root is not None:
        walk(root, ())
    return lines


class _Locator:
    """Turns key paths into 'file:line: a.b.c: message' lines."""

    def __init__(self, path: Path, lines: dict[tuple, int]):
        self.path, self.lines = path, lines

    def error(self, key: tuple, message: str, fallback: tuple | None = None) -> StudyError:
        line = self._line(key) or (self._line(fallback) if fallback else None)
        loc = f"{self.path}:{line}" if line else f"{self.path}"
        dotted = ".".join(str(k) for k in key)
        return StudyError(f"{loc}: {dotted}: {message}" if dotted else f"{loc}: {message}")

    def _line(self, key: tuple) -> int | None:
        for n in range(len(key), 0, -1):
            if key[:n] in self.lines:
                return self.lines[key[:n]]
        return None

    def pydantic(self, exc: ValidationError, prefix: tuple, fallback: tuple | None = None) -> StudyError:
        err = exc.errors()[0]
        more = len(exc.errors()) - 1
        key = prefix + tuple(err["loc"])
        msg = _pydantic_message(err)
        if more:
            msg += f" (and {more} more problem{'s' if more > 1 else ''})"
        return self.error(key, msg, fallback + tuple(err["loc"]) if fallback else None)


def _pydantic_message(err: dict) -> str:
    kind = err["type"]
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "missing":
        return "required key is missing"
    given = err.get("input")
    shown = repr(given) if not isinstance(given, dict) else "a mapping"
    return f"{err['msg']} (got {shown})"


def _lookup(where: _Locator, key: tuple, slot: str, kind: str) -> type:
    try:
        return registry.get(slot, kind)
    except registry.UnknownKind as exc:
        raise where.error(key, str(exc)) from None
    except AblateError as exc:
        raise where.error(key, str(exc)) from None


def _options(where: _Locator, key: tuple, cls: type, raw: dict, fallback: tuple | None = None) -> Any:
    try:
        return cls.Options.model_validate(raw)
    except ValidationError as exc:
        raise where.pydantic(exc, key, fallback) from None


def _resolve_variant(
    where: _Locator, name: str, raw_model: dict, key: tuple, task: Task, patch: dict | None = None
) -> Variant:
    # Keys the patch does not touch are reported at their place in the base model.
    base_key = ("model",)
    try:
        spec = ModelSpec.model_validate(raw_model)
    except ValidationError as exc:
        raise where.pydantic(exc, key, base_key) from None

    def part(slot: str, comp: ComponentSpec, sub: tuple) -> Part:
        cls = _lookup(where, key + sub + ("kind",), slot, comp.kind)
        opts = _options(where, key + sub, cls, comp.options(), base_key + sub)
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


def _expand(where: _Locator, spec: StudySpec) -> dict[str, dict]:
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


class _Bare(_Locator):
    """Errors naming only the key path (for keys applied after loading, e.g. search values)."""

    def error(self, key: tuple, message: str, fallback: tuple | None = None) -> StudyError:
        return StudyError(f"{'.'.join(str(k) for k in key)}: {message}")


def _set_dotted(node: dict, path: list[str], value: Any) -> None:
    for part in path[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            raise StudyError(f"{'.'.join(path)}: '{part}' holds no keys")
        node = child
    if path[-1] == "kind":  # a new kind starts from its own defaults (as a variant patch does)
        node.clear()
    node[path[-1]] = value


def search_values(dim: Any) -> list[Any]:
    """Values that must all be valid for a dimension: both bounds, or every choice."""
    return list(dim.choices) if isinstance(dim, Categorical) else [dim.low, dim.high]


def grid_points(dim: Any) -> list[Any]:
    """Every value a grid search visits on one dimension (ranges need a step)."""
    if isinstance(dim, Categorical):
        return list(dim.choices)
    if isinstance(dim, IntRange):
        return list(range(dim.low, dim.high + 1, dim.step))
    count = int(round((dim.high - dim.low) / dim.step)) + 1
    return [dim.low + i * dim.step for i in range(count) if dim.low + i * dim.step <= dim.high + 1e-12]


def _check_search(where: _Locator, study: Study) -> None:
    """Bad search spaces fail here, before any training: unknown keys, empty categoricals,
    inverted ranges, log ranges reaching 0, values a variant cannot take, a missing budget."""
    search = study.spec.search
    for key, dim in search.space.items():
        at = ("search", "space", key)
        root = key.split(".")[0]
        if root not in SEARCH_ROOTS or "." not in key:
            raise where.error(at, f"search keys are dotted model.* or train.* keys (e.g. train.lr, "
                                  f"model.ffn.mult), got '{key}'")
        if isinstance(dim, Categorical):
            if not dim.choices:
                raise where.error(at, "an empty categorical: give at least one choice")
        else:
            if dim.low > dim.high:
                raise where.error(at, f"low ({dim.low}) is above high ({dim.high})")
            if dim.log and dim.low <= 0:
                raise where.error(at, f"a log range needs bounds > 0 (got low={dim.low})")
            if isinstance(dim, FloatRange) and dim.log and dim.step is not None:
                raise where.error(at, "a log range takes no step")
            if search.sampler == "grid" and isinstance(dim, FloatRange) and dim.step is None:
                raise where.error(at, "grid search over a float range needs a step")
        if study.spec.match_params and key.startswith(f"model.{_matched_slot(study)}."):
            raise where.error(at, "this key is the knob match_params scales; search another key or drop match_params")
        for name in study.variants:
            for value in search_values(dim):
                try:
                    study.with_params(name, {key: value})
                except StudyError as exc:
                    raise where.error(at, f"{value!r} does not fit variant '{name}' ({exc})") from None
    if search.space and search.trials == 0 and search.sampler != "grid":
        raise where.error(("search", "trials"), "a search space needs a trial budget per variant (trials: N)")
    if search.trials and not search.space:
        raise where.error(("search", "space"), "search.trials is set but no space is given")


def _matched_slot(study: Study) -> str:
    chosen = study.spec.match_params
    return "ffn" if chosen is True else str(chosen)

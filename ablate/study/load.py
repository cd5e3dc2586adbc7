"""A validated study: the study file's components resolved against the registry, variants
expanded (named patches and the factorial grid), compatibility with the task checked.

Every problem becomes a :class:`~ablate.errors.StudyError` whose one-line message names the
file, the line and the key path (:mod:`ablate.study.file`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from ablate.components import BuildContext
from ablate.data.named import NamedData, named_data
from ablate.errors import DataError, StudyError
from ablate.model.variant import Variant
from ablate.registry import COMPONENT_SLOTS
from ablate.schema import Bare, Locator, line_of
from ablate.stats import ReportSettings
from ablate.study.file import lookup, read_study, validate_options
from ablate.study.overrides import OverriddenLocator, apply_overrides, configuration_name, parse_overrides
from ablate.study.resolve import BASE_KEY, check_size, re_resolve, resolve_variant, unknown_kinds
from ablate.study.search import SEARCH_ROOTS
from ablate.study.spec import BASE, StudySpec, TrainSpec
from ablate.study.variants import expand, patched
from ablate.tasks import Task


@dataclass
class Study:
    spec: StudySpec
    path: Path
    task: Task
    variants: dict[str, Variant]  # base first
    loss: BaseModel
    metrics: list[str] = field(default_factory=list)  # primary first
    overrides: tuple[str, ...] = ()  # the `key=value` overrides applied to the file, as given
    # Variant → where its problems are reported: the locator and its key (``("variants", name)``).
    located: dict[str, tuple[Locator, tuple]] = field(default_factory=dict)
    dataset: NamedData | None = None  # task.data by name (several listed: `labels`, ablate.commands.across)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def base_dir(self) -> Path:
        return self.path.parent

    def output_dir(self, override: str | Path | None = None) -> Path:
        chosen = override or self.spec.output or Path("runs") / self.name
        return Path(chosen).resolve()

    def locate(self, variant: str) -> tuple[Locator, tuple]:
        """Where a problem of ``variant`` is reported: its locator and key in the study file."""
        return self.located.get(variant) or (Bare(self.path, {}), ("model",))

    def report_settings(self) -> ReportSettings:
        """What the report needs: the study file's ``report:`` section filled in with the study's
        name, metrics and their directions, and variants (stored with the study in MLflow, so a
        report can be rebuilt from the tracking store alone)."""
        return ReportSettings.model_validate(
            {
                **self.spec.report.model_dump(),
                "study": self.name,
                "primary": self.metrics[0],
                "metrics": self.metrics,
                "variants": list(self.variants),
                "higher_is_better": {m: self.task.metric_higher_is_better(m) for m in self.metrics},
                "margins": {m: self.task.default_margin(m) for m in self.metrics},
                "sequential": self.spec.sequential,
                "duplicates": duplicate_variants(self),
                "grid": self.spec.grid,
            }
        )

    def report_settings_json(self) -> str:
        """:meth:`report_settings` as the JSON text stored with the study in MLflow."""
        return self.report_settings().model_dump_json()

    def with_params(self, variant: str, params: dict[str, Any]) -> tuple[Study, Variant]:
        """This study with ``params`` (dotted ``model.*`` / ``train.*`` keys) applied to
        ``variant`` and to the training settings. Raises :class:`StudyError` naming the key.

        Called for every parameter-matching probe and search value, so only what the keys can
        change is validated again: the training settings (and the loss, for ``train.loss.*``),
        the model settings and the slots whose settings changed; the rest was valid already."""
        old = self.variants[variant]
        model = old.spec.model_dump()
        train = self.spec.train.model_dump()
        touched: set[tuple[str, str]] = set()  # (root, first key under it)
        for dotted, value in params.items():
            root, *path = dotted.split(".")
            if root not in SEARCH_ROOTS or not path:
                raise StudyError(f"{dotted}: not a model.* or train.* key")
            _set_dotted({"model": model, "train": train}[root], path, value)
            touched.add((root, path[0]))
        where = Bare(self.path, {})
        spec, loss, resolved = self.spec, self.loss, old
        if any(root == "train" for root, _ in touched):
            try:
                train_spec = TrainSpec.model_validate(train)
            except ValidationError as exc:
                raise where.pydantic(exc, ("train",)) from None
            if ("train", "loss") in touched:
                try:
                    loss = type(self.loss).model_validate(train_spec.loss)
                except ValidationError as exc:
                    raise where.pydantic(exc, ("train", "loss")) from None
            spec = self.spec.model_copy(update={"train": train_spec})
        if any(root == "model" for root, _ in touched):
            resolved = re_resolve(where, old, model, ("model",), self.task)
        if resolved is not old or ("train", "batch_size") in touched:
            check_size(where, ("model",), self.task, spec.train.batch_size, resolved)
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


def duplicate_variants(study: Study) -> dict[str, str]:
    """Variant → the first variant (the baseline before all) configured exactly like it: the same
    resolved components (a default spelt out counts as the default) and model settings, under the
    study's one training setup, so it trains the same models and its comparison tests nothing."""

    def configuration(variant: Variant) -> tuple:
        shape = variant.spec.model_dump(exclude=set(COMPONENT_SLOTS))
        parts = tuple(variant.parts(slot) for slot in COMPONENT_SLOTS)
        return shape, variant.spec.norm.placement, parts

    # The report's baseline first: a variant like it is the one left untested, never the baseline.
    baseline = study.spec.report.baseline
    names = [baseline, *(name for name in study.variants if name != baseline)]
    seen: list[tuple[str, tuple]] = []
    duplicates = {}
    for name in names:
        mine = configuration(study.variants[name])
        first = next((other for other, theirs in seen if theirs == mine), None)
        if first is None:
            seen.append((name, mine))
        else:
            duplicates[name] = first
    return duplicates


def duplicate_warnings(study: Study) -> list[str]:
    """One line per variant configured exactly like another (:func:`duplicate_variants`)."""
    return [
        f"variant '{name}' is configured exactly like '{first}': it trains the same models; "
        f"its comparison is not tested"
        for name, first in duplicate_variants(study).items()
    ]


# ---------------------------------------------------------------------------------------


# Task options that became training options: an old study file gets told where they went.
MOVED_KEYS = {"micro_batches": "train.micro_batches"}
MOVED_KEYS_WHY = "how a batch's loss is stepped belongs to training; the task only says how to cut a batch"


def load_study(path: str | Path, check_files: bool = True, overrides: Iterable[str] = ()) -> Study:
    """Parse and fully validate a study file, with ``key=value`` overrides (:mod:`ablate.study.overrides`)
    applied first. Raises :class:`StudyError` / :class:`DataError`."""
    path = Path(path)
    raw, lines = read_study(path)
    given = parse_overrides(overrides)
    raw = apply_overrides(raw, given)
    if isinstance(raw.get("name"), str) and not any(o.key == ("name",) for o in given):
        # Overrides that change what trials train make a study of their own: its own name (MLflow
        # experiment, Optuna queue) and output folder, so it never meets the study file's trials.
        named = configuration_name(raw["name"], [o.text for o in given])
        if (
            named != raw["name"]
            and isinstance(raw.get("output"), str)
            and not any(o.key == ("output",) for o in given)
        ):
            raw["output"] = raw["output"].rstrip("/") + named.removeprefix(raw["name"])
        raw["name"] = named
    where = OverriddenLocator(path, lines, given) if given else Locator(path, lines)
    try:
        spec = StudySpec.model_validate(raw)
    except ValidationError as exc:
        problems = [*str(where.pydantic(exc, ())).splitlines(), *unknown_kinds(where, raw)]
        raise StudyError("\n".join(sorted(dict.fromkeys(problems), key=line_of))) from None

    task_cls = lookup(where, ("task", "kind"), "task", spec.task.kind)
    raw_task = {k: v for k, v in raw["task"].items() if k != "kind"}
    for key, now in MOVED_KEYS.items():
        if key in raw_task:
            raise where.error(("task", key), f"moved to {now}: {MOVED_KEYS_WHY}")
    named, raw_task = named_data(where, raw_task, check_files)
    task_options = validate_options(where, ("task",), task_cls, raw_task)
    task: Task = task_cls(task_options, path.parent.resolve())
    problem = task.options_problem()
    if problem is not None:
        raise where.error(("task", *problem[0]), problem[1])

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

    if spec.train.micro_batches > 1 and not task.splits_batches:
        raise where.error(
            ("train", "micro_batches"),
            f"the {task.kind_name()} task trains whole batches only (it cannot cut a batch into "
            f"micro-batches): leave it at 1",
        )

    located = {BASE: (where, BASE_KEY)}
    variants = {BASE: resolve_variant(where, BASE, raw.get("model", {}), BASE_KEY, task)}
    for name, (patch, at) in expand(where, spec).items():
        if name == BASE:
            raise where.error(
                ("variants", name), f"'{BASE}' is the name of the base model; rename the variant"
            )
        merged = patched(raw.get("model", {}), patch)
        located[name] = (at, ("variants", name))
        variants[name] = resolve_variant(at, name, merged, ("variants", name), task)
    for name, variant in variants.items():
        check_size(*located[name], task, spec.train.batch_size, variant)

    if spec.report.baseline not in variants:
        raise where.error(
            ("report", "baseline"),
            f"baseline '{spec.report.baseline}' is not a variant (variants: {', '.join(variants)})",
        )
    if problem := spec.report.combination_problem(spec.sequential is not None):
        raise where.error(("report", problem[0]), problem[1])
    study = Study(
        spec=spec,
        path=path.resolve(),
        task=task,
        variants=variants,
        loss=loss,
        metrics=metrics,
        overrides=tuple(o.text for o in given),
        located=located,
        dataset=named,
    )
    check_search(where, study)
    if check_files and (problem := task.check_files()):
        raise DataError(f"{path}: task.data: {problem}")
    return study


def _set_dotted(node: dict, path: list[str], value: Any) -> None:
    for part in path[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            raise StudyError(f"{'.'.join(path)}: '{part}' holds no keys")
        node = child
    if path[-1] == "kind":  # a new kind starts from its own defaults (as a variant patch does)
        node.clear()
    node[path[-1]] = value


def check_search(where: Locator, study: Study) -> None:
    """Bad search spaces fail here, before any training: unknown keys, empty categoricals,
    inverted ranges, log ranges reaching 0, values a variant cannot take, a missing budget."""
    search = study.spec.search
    for key, dim in search.space.items():
        at = ("search", "space", key)
        root = key.split(".")[0]
        if root not in SEARCH_ROOTS or "." not in key:
            raise where.error(
                at,
                f"search keys are dotted model.* or train.* keys (e.g. train.lr, "
                f"model.ffn.mult), got '{key}'",
            )
        problem = dim.check(grid=search.grid)
        if problem:
            raise where.error(at, problem)
        if study.spec.match_params and key.startswith(f"model.{study.spec.matched_slot()}."):
            raise where.error(
                at, "this key is the knob match_params scales; search another key or drop match_params"
            )
        for name in study.variants:
            for value in dim.values():
                try:
                    study.with_params(name, {key: value})
                except StudyError as exc:
                    raise where.error(at, f"{value!r} does not fit variant '{name}' ({exc})") from None
    if search.space and search.trials == 0 and not search.grid:
        raise where.error(("search", "trials"), "a search space needs a trial budget per variant (trials: N)")
    if search.trials and not search.space:
        raise where.error(("search", "space"), "search.trials is set but no space is given")

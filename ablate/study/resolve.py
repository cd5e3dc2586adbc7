"""A variant's ``model:`` settings resolved: each slot's kind looked up in the registry and its options
validated, every part checked against the task's tokens and the norm placement, the model built on the
meta device to refuse shapes and sizes no machine trains. Each problem names its key and line."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from pydantic import ValidationError

from ablate.components import BuildContext
from ablate.errors import StudyError
from ablate.model.blocks import PLACEMENTS
from ablate.model.spec import ComponentSpec, ModelSpec
from ablate.model.variant import Part, Variant
from ablate.registry import COMPONENT_SLOTS
from ablate.schema import Locator
from ablate.study import sizes
from ablate.study.file import lookup, validate_options
from ablate.study.sizes import NOMINAL_TOKENS
from ablate.tasks import Task


def placement_problem(placement: str, attention: type, connection: type) -> str | None:
    """Why ``placement`` cannot go with these attention / connection kinds, or None. A
    placement that hands the attention a separate key / value source needs a kind that takes
    one and a single-stream connection (whose branch input is its own input)."""
    if not PLACEMENTS[placement].mix.gives_source:
        return None
    if not attention.takes_source:
        return (
            f"{placement!r} takes the attention's keys and values from the un-normalised stream, "
            f"which attention kind '{attention.kind_name()}' does not support (softmax does); "
            f"use placement 'pre_skip'"
        )
    if not connection.single_stream:
        return (
            f"{placement!r} needs a single-stream connection (residual), but connection kind "
            f"'{connection.kind_name()}' keeps several streams; use placement 'pre_skip'"
        )
    return None


# Keys a variant's patch does not touch are reported at their place in the base model.
BASE_KEY = ("model",)


# A change to any of these slots can make the norm placement unfit (:func:`placement_problem`).
PLACEMENT_SLOTS = frozenset({"norm", "attention", "connection"})


def resolve_variant(where: Locator, name: str, raw_model: dict, key: tuple, task: Task) -> Variant:
    spec = _model_spec(where, raw_model, key)
    if spec.config and not task.runs_trials:
        why = "model.config is read by a task that trains its own model (e.g. task kind 'function')"
        raise where.error(key + ("config",), f"the {task.kind_name()} task trains ablate's model: {why}")
    parts = _resolve_slots(where, spec, key, task, COMPONENT_SLOTS)
    _check_placement(where, spec, key, parts["attention"], parts["connection"])
    return Variant(name=name, spec=spec, **parts)


def re_resolve(where: Locator, old: Variant, raw_model: dict, key: tuple, task: Task) -> Variant:
    """``old`` with its model settings replaced by ``raw_model``: only the slots whose settings
    changed are resolved and checked again (the others were valid for this task already)."""
    spec = _model_spec(where, raw_model, key)
    before, after = old.spec.model_dump(), spec.model_dump()
    changed = [slot for slot in COMPONENT_SLOTS if not _identical(before[slot], after[slot])]
    parts = _resolve_slots(where, spec, key, task, changed)
    variant = replace(old, spec=spec, **parts)
    if PLACEMENT_SLOTS.intersection(changed):
        _check_placement(where, spec, key, variant.attention, variant.connection)
    return variant


def _model_spec(where: Locator, raw_model: dict, key: tuple) -> ModelSpec:
    try:
        return ModelSpec.model_validate(raw_model)
    except ValidationError as exc:
        raise where.pydantic(exc, key, BASE_KEY) from None


def _slot_components(spec: ModelSpec, slot: str) -> list[tuple[tuple, ComponentSpec]]:
    """(key path under ``model``, settings) of each component a slot holds."""
    held = getattr(spec, slot)
    if isinstance(held, list):
        return [((slot, i), comp) for i, comp in enumerate(held)]
    return [((slot,), held)]


def _resolve_slots(
    where: Locator, spec: ModelSpec, key: tuple, task: Task, slots: Iterable[str]
) -> dict[str, Any]:
    """Slot -> its resolved :class:`Part` (a tuple of them for a list slot), for ``slots``: every
    kind looked up and its options validated, then each checked against the task."""
    resolved: dict[str, tuple[Part, ...]] = {}
    for slot in slots:
        parts = []
        for sub, comp in _slot_components(spec, slot):
            cls = lookup(where, key + sub + ("kind",), slot, comp.kind)
            options = validate_options(where, key + sub, cls, comp.options(), BASE_KEY + sub)
            parts.append(Part(slot, cls, options))
        resolved[slot] = tuple(parts)
    for slot, parts in resolved.items():
        for (sub, _), part in zip(_slot_components(spec, slot), parts, strict=True):
            problem = incompatibility(part, task.kind_name(), task.features(), task.ordered)
            problem = problem or task.incompatibility(part.slot, part.cls, part.options)
            if problem:
                raise where.error(key + sub + ("kind",), problem, BASE_KEY + sub)
    # A list slot (bias) holds the tuple, the others their one part.
    return {
        slot: parts if isinstance(getattr(spec, slot), list) else parts[0] for slot, parts in resolved.items()
    }


def check_size(where: Locator, key: tuple, task: Task, batch_size: int, variant: Variant) -> None:
    """Every component of ``variant`` built on the meta device (:func:`ablate.study.sizes.check`): a
    shape its constructor refuses, or a model past the memory limit, fails here naming the key.
    The data's tokens per row are not known yet: :data:`~ablate.study.sizes.NOMINAL_TOKENS` stand in."""
    ctx = BuildContext(
        dim=variant.spec.dim,
        dropout=variant.spec.dropout,
        max_len=NOMINAL_TOKENS,
        ordered=task.ordered,
        features=task.features(),
        values_width=task.values_width(),
    )
    sizes.check(where, key, variant, ctx, batch_size)


def _check_placement(where: Locator, spec: ModelSpec, key: tuple, attention: Part, connection: Part) -> None:
    problem = placement_problem(spec.norm.placement, attention.cls, connection.cls)
    if problem:
        raise where.error(key + ("norm", "placement"), problem, BASE_KEY + ("norm", "placement"))


def _identical(a: Any, b: Any) -> bool:
    """Equal, with the same types throughout: ``2 == 2.0``, but a kind's options may keep them apart."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_identical(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_identical(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def incompatibility(part: Part, task: str, features: frozenset[str], ordered: bool) -> str | None:
    """Why ``part`` cannot run on this task's tokens (naming both sides), or None."""
    kind = f"{part.slot} kind '{part.cls.kind_name()}'"
    missing = set(part.cls.requirements(part.options)) - set(features)
    if missing:
        return (
            f"{kind} needs {', '.join(sorted(missing))}, but task '{task}' with these data options "
            f"provides {', '.join(sorted(features)) or 'no side information'}"
        )
    if part.cls.ordered_only and not ordered:
        return f"{kind} needs ordered tokens (sequences), but task '{task}' has unordered tokens"
    if part.cls.unordered_only and ordered:
        return f"{kind} works on unordered token sets, but task '{task}' has ordered tokens used causally"
    return None


def unknown_kinds(where: Locator, raw: dict) -> list[str]:
    """Each kind the study file names that no plugin registers, one line each (the model's slots,
    each variant's, the task's): said beside the schema's problems, so that one ``validate`` names
    every one of them instead of the next call naming the next."""
    named: list[tuple[tuple, str, Any]] = [(("task", "kind"), "task", (raw.get("task") or {}).get("kind"))]
    patches = [(("model",), raw.get("model"))]
    patches += [(("variants", v), p) for v, p in (raw.get("variants") or {}).items() if isinstance(v, str)]
    for at, patch in patches:
        for slot in COMPONENT_SLOTS if isinstance(patch, dict) else ():
            held = patch.get(slot)
            listed = held if isinstance(held, list) else [held]
            for i, item in enumerate(listed):
                sub = (slot, i) if isinstance(held, list) else (slot,)
                if isinstance(item, dict) and isinstance(item.get("kind"), str):
                    named.append((at + sub + ("kind",), slot, item["kind"]))
    found = []
    for key, slot, kind in named:
        if isinstance(kind, str):
            try:
                lookup(where, key, slot, kind)
            except StudyError as exc:
                found.append(str(exc))
    return found

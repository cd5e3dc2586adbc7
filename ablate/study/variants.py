"""A study's variants before they are resolved: each named variant's and each grid point's
patch over the base model, and where a problem in it is reported (a grid point's at the grid
axis that set the key)."""

from __future__ import annotations

import copy
import itertools

from ablate.errors import StudyError
from ablate.registry import COMPONENT_SLOTS
from ablate.schema import Locator
from ablate.study.spec import StudySpec


def patched(base: dict, patch: dict) -> dict:
    """Deep-merge a variant's patch into the base model. A component whose ``kind``
    changes is replaced whole (the old kind's options would not fit the new kind);
    lists are replaced."""
    out = copy.deepcopy(base)
    for key, value in patch.items():
        old = out.get(key)
        both_mappings = isinstance(value, dict) and isinstance(old, dict)
        if both_mappings and value.get("kind", old.get("kind")) == old.get("kind"):
            out[key] = patched(old, value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def flattened(config: dict, prefix: str = "") -> dict[str, object]:
    """A nested mapping's leaves by dotted key (``{"optim": {"lr": 0.1}}`` → ``{"optim.lr": 0.1}``)."""
    leaves: dict[str, object] = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            leaves.update(flattened(value, f"{prefix}{key}."))
        else:
            leaves[f"{prefix}{key}"] = value
    return leaves


def config_differences(mine: dict, theirs: dict) -> list[str]:
    """``config.<key>: <value>`` for each leaf of ``model.config`` where ``mine`` differs from
    ``theirs`` (``unset`` for a leaf only ``theirs`` has): the report's 'differs' column."""
    a, b = flattened(mine), flattened(theirs)
    keys = dict.fromkeys([*a, *b])
    return [f"config.{k}: {a.get(k, 'unset')}" for k in keys if (k in a, a.get(k)) != (k in b, b.get(k))]


def _resolved(variant) -> dict[str, object]:
    """A resolved variant (:class:`ablate.study.load.Variant`) as flat settings: each slot → its
    kinds, ``slot.option`` → every option's value (defaults filled in; a bias list's as
    ``bias.<kind>.option``), and the model's own settings (``dim``, ``norm.placement``, …)."""
    found: dict[str, object] = {}
    for slot in COMPONENT_SLOTS:
        parts, listed = variant.parts(slot), isinstance(getattr(variant, slot), tuple)  # bias: a list
        found[slot] = "+".join(p.cls.kind_name() for p in parts) or "none"
        for p in parts:
            at = f"{slot}.{p.cls.kind_name()}" if listed else slot
            found |= {f"{at}.{k}": v for k, v in p.options.model_dump().items()}
    own = variant.spec.model_dump(exclude={*COMPONENT_SLOTS, "config"})
    return found | own | {"norm.placement": variant.spec.norm.placement}


def variant_differences(mine, theirs) -> str:
    """What the report's 'differs' column says of ``mine`` against ``theirs`` (resolved
    variants): a component of another kind as its label (``attention: linear(rank=8)``), an option
    or model setting that changed as ``attention.heads: 4→1`` (the baseline's value first), then
    ``model.config``'s changed leaves; ``—`` when nothing differs."""
    a, b = _resolved(mine), _resolved(theirs)
    labels = {slot: "+".join(p.label for p in mine.parts(slot)) or "none" for slot in COMPONENT_SLOTS}
    found = []
    for key in dict.fromkeys([*a, *b]):
        slot = key.split(".")[0]
        if a.get(key) == b.get(key) or (key != slot and slot in labels and a[slot] != b[slot]):
            continue  # the same, or an option of a component whose kind changed (said by its label)
        found.append(f"{key}: {labels[key]}" if key in labels else f"{key}: {b.get(key)}→{a.get(key)}")
    found += config_differences(mine.spec.config, theirs.spec.config)
    return "; ".join(found) if found else "—"


def expand(where: Locator, spec: StudySpec) -> dict[str, tuple[dict, Locator]]:
    """Named variants, then the factorial grid (``{"attention.heads": [1, 2], ...}``): each
    variant's patch and where its problems are reported (a grid point's at its grid axis)."""
    variants = {name: (patch, where) for name, patch in spec.variants.items()}
    if not spec.grid:
        return variants
    keys = list(spec.grid)
    for key in keys:
        if not spec.grid[key]:
            raise where.error(("grid", key), "a grid axis needs at least one value")
    for values in itertools.product(*(spec.grid[k] for k in keys)):
        patch: dict = {}
        for dotted, value in zip(keys, values, strict=True):
            node = patch
            parts = dotted.split(".")
            for p in parts[:-1]:
                node = node.setdefault(p, {})
            node[parts[-1]] = value
        name = ",".join(f"{k}={v}" for k, v in zip(keys, values, strict=True))
        if name in variants:
            raise where.error(("grid",), f"grid variant '{name}' clashes with a named variant")
        variants[name] = (patch, GridPoint(where, name, keys))
    return variants


class GridPoint(Locator):
    """Where a grid point's problems are reported: at the grid axis that set the key (its line in
    ``grid:``, the axis as the key path), naming the point; a key no axis set (a combination with
    the base model's settings) at the point's only axis, or at ``grid`` when it has several."""

    def __init__(self, where: Locator, name: str, axes: list[str]):
        super().__init__(where.path, where.lines)
        self.where, self.name, self.axes = where, name, axes

    def error(self, key: tuple, message: str, fallback: tuple | None = None) -> StudyError:
        inner = ".".join(str(k) for k in key[2:])  # under ("variants", name)
        # The axis that set this key, or one that set a key inside it (a component's option).
        axis = next(
            (a for a in self.axes if f"{inner}.".startswith(f"{a}.") or a.startswith(f"{inner}.")), None
        )
        if axis is None:
            axis = self.axes[0] if len(self.axes) == 1 else None
            message = f"model.{inner}: {message}" if inner else message
        rest = inner[len(axis) + 1 :].split(".") if axis and inner.startswith(f"{axis}.") else []
        at = ("grid", axis, *rest) if axis else ("grid",)
        return self.where.error(at, f"grid point '{self.name}': {message}")

"""A study's variants before they are resolved: each named variant's and each grid point's
patch over the base model, and where a problem in it is reported (a grid point's at the grid
axis that set the key)."""

from __future__ import annotations

import copy
import itertools

from ablate.errors import StudyError
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

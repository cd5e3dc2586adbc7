"""A resolved variant: each slot's kind (its class, looked up in the registry) with its validated
options, and the model's shape; what the builder assembles and the report's 'differs' column reads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ablate.components import Component
from ablate.model.spec import ModelSpec
from ablate.registry import COMPONENT_SLOTS


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

    def parts(self, slot: str) -> tuple[Part, ...]:
        """The slot's resolved components: one, or the bias list."""
        held = getattr(self, slot)
        return held if isinstance(held, tuple) else (held,)

    def components(self) -> dict[str, str]:
        """Slot -> label, for tags and the report's 'differs' column."""
        labels = {slot: "+".join(p.label for p in self.parts(slot)) or "none" for slot in COMPONENT_SLOTS}
        labels["norm"] += f" ({self.spec.norm.placement})"
        return {**labels, "shape": f"d={self.spec.dim},L={self.spec.blocks},p={self.spec.dropout}"}

    def differs_from(self, other: Variant) -> str:
        return variant_differences(self, other)


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


def _resolved(variant: Variant) -> dict[str, object]:
    """A resolved variant (:class:`Variant`) as flat settings: each slot → its
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


def variant_differences(mine: Variant, theirs: Variant) -> str:
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

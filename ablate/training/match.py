"""Parameter matching (``match_params``): scale one width knob of a variant so its backbone
has the baseline's parameter count within 2%.

The knob is whatever option the slot's kind declares as ``width_option`` (an FFN's hidden
width or multiplier); the core never names a kind. Backbone parameters are compared, not the
task's embedding and head, which every variant shares.
"""

from __future__ import annotations

from dataclasses import dataclass

from ablate.errors import AblateError, StudyError
from ablate.model.build import build_backbone, count_parameters
from ablate.model.variant import Variant
from ablate.study.load import Study

TOLERANCE = 0.02
_LARGEST = 2**20


@dataclass(frozen=True)
class Matched:
    params: int  # backbone parameters after matching
    base_params: int  # the baseline's backbone parameters (the target)
    before: int  # this variant's backbone parameters before matching
    knob: str | None = None  # dotted key scaled, e.g. model.ffn.mult; None when already within 2%
    value: float | int | None = None

    def record(self) -> dict[str, object]:
        out = {
            "match.params": self.params,
            "match.base_params": self.base_params,
            "match.before": self.before,
        }
        if self.knob:
            out[f"match.{self.knob}"] = self.value
        return out


def backbone_params(study: Study, variant: Variant, max_len: int) -> int:
    return count_parameters(build_backbone(variant, study.build_context(variant, max_len)))


def match(
    study: Study, name: str, max_len: int, base: Variant | None = None
) -> tuple[Study, Variant, Matched]:
    """``study`` with variant ``name`` scaled to the baseline's parameter count.
    Raises :class:`AblateError` when the variant has no knob or cannot come within 2%."""
    base = base or study.variants[study.spec.report.baseline]
    target = backbone_params(study, base, max_len)
    variant = study.variants[name]
    before = backbone_params(study, variant, max_len)
    if abs(before - target) <= TOLERANCE * target:
        return study, variant, Matched(before, target, before)
    slot = study.spec.matched_slot()
    part = getattr(variant, slot)
    option = part.cls.width_option
    if option is None:
        raise AblateError(
            f"match_params: variant '{name}' has {before:,} backbone parameters against "
            f"{target:,} for '{base.name}' and its {slot} kind '{part.cls.kind_name()}' "
            f"declares no width option to scale"
        )
    knob = f"model.{slot}.{option}"
    current = getattr(part.options, option)
    integer = current is None or isinstance(current, int)

    probes: dict[float, tuple[Study, Variant, int]] = {}

    def probe(value: float) -> tuple[Study, Variant, int]:
        """The study with the knob at ``value`` and the variant's backbone parameters; remembered,
        as the bisection's ends are counted again when the best one is picked."""
        if value not in probes:
            try:
                changed, v = study.with_params(name, {knob: value})
            except StudyError as exc:
                raise AblateError(f"match_params: variant '{name}': {exc}") from None
            probes[value] = changed, v, backbone_params(changed, v, max_len)
        return probes[value]

    def count(value: float) -> int:
        return probe(value)[2]

    low, high = (1, 2) if integer else (1.0 / max(variant.spec.dim, 1), 1.0)
    while count(high) < target:  # parameters grow with the knob: find a bracket
        if high >= _LARGEST:
            raise AblateError(
                f"match_params: variant '{name}' cannot reach {target:,} parameters by scaling {knob}"
            )
        high *= 2
    for _ in range(60):  # smallest value whose count reaches the target
        if (high - low <= 1) if integer else (high - low <= 1e-6 * high):
            break
        mid = (low + high) // 2 if integer else (low + high) / 2
        low, high = (low, mid) if count(mid) >= target else (mid, high)
    best = min((low, high), key=lambda v: abs(count(v) - target))
    if integer:
        best = int(best)
    else:
        best = float(f"{best:.6g}")
    changed, scaled, params = probe(best)
    if abs(params - target) > TOLERANCE * target:
        raise AblateError(
            f"match_params: variant '{name}' comes no closer than {params:,} parameters to "
            f"{target:,} ('{base.name}') by scaling {knob} (best {best}); more than 2% apart"
        )
    return changed, scaled, Matched(params, target, before, knob, best)

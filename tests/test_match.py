"""Parameter matching (``match_params``): a variant's width knob scaled to the baseline's count."""

from __future__ import annotations

import pytest

from ablate.errors import AblateError
from ablate.study.load import load_study
from ablate.study.spec import BASE
from ablate.training.match import Matched, backbone_params, match

MAX_LEN = 16


@pytest.mark.parametrize(
    "ffn, knob",
    [
        ({"kind": "mlp", "mult": 4}, "model.ffn.mult"),  # a float knob
        ({"kind": "swiglu"}, "model.ffn.hidden"),  # an integer knob
    ],
)
def test_variant_is_matched_within_two_percent(write_study, ffn, knob):
    study = load_study(write_study({"match_params": True}, replace={"variants": {"wide": {"ffn": ffn}}}))
    target = backbone_params(study, study.variants[BASE], MAX_LEN)
    before = backbone_params(study, study.variants["wide"], MAX_LEN)
    assert abs(before - target) > 0.02 * target  # a case that needs matching

    original = study.variants["wide"]
    changed, scaled, matched = match(study, "wide", MAX_LEN)
    assert matched.knob == knob and (matched.base_params, matched.before) == (target, before)
    assert abs(matched.params - target) <= 0.02 * target
    assert getattr(scaled.ffn.options, knob.rsplit(".", 1)[1]) == matched.value
    assert changed.variants["wide"] is scaled and changed.variants[BASE] is study.variants[BASE]
    assert backbone_params(changed, scaled, MAX_LEN) == matched.params
    assert study.variants["wide"] is original  # the study it was given is unchanged


def test_kind_without_a_width_option_is_an_error(write_study):
    # The base's MLP is wider than the variant's pointwise FFN, which has no knob to widen it.
    study = load_study(
        write_study(
            {"match_params": True, "model": {"ffn": {"kind": "mlp", "mult": 4}}},
            replace={"variants": {"narrow": {"ffn": {"kind": "pointwise"}}}},
        )
    )
    target = backbone_params(study, study.variants[BASE], MAX_LEN)
    before = backbone_params(study, study.variants["narrow"], MAX_LEN)
    with pytest.raises(AblateError) as exc:
        match(study, "narrow", MAX_LEN)
    assert str(exc.value) == (
        f"match_params: variant 'narrow' has {before:,} backbone parameters against "
        f"{target:,} for 'base' and its ffn kind 'pointwise' declares no width option "
        f"to scale"
    )


def test_variant_already_within_two_percent_is_left_alone(write_study):
    # Two heads split the same projections: the same parameter count.
    study = load_study(
        write_study({"match_params": True}, replace={"variants": {"heads": {"attention": {"heads": 2}}}})
    )
    changed, variant, matched = match(study, "heads", MAX_LEN)
    assert changed is study and variant is study.variants["heads"]
    params = backbone_params(study, study.variants[BASE], MAX_LEN)
    assert matched == Matched(params, params, params)
    assert matched.record() == {"match.params": params, "match.base_params": params, "match.before": params}


def test_record_names_the_scaled_knob():
    matched = Matched(params=1010, base_params=1000, before=2000, knob="model.ffn.hidden", value=24)
    assert matched.record() == {
        "match.params": 1010,
        "match.base_params": 1000,
        "match.before": 2000,
        "match.model.ffn.hidden": 24,
    }

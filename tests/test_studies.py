"""Every ready study in studies/ validates against the real data in ../shared/data."""

from __future__ import annotations

from pathlib import Path

import pytest

from ablate.study.load import load_study
from ablate.study.spec import BASE

STUDIES = sorted((Path(__file__).resolve().parents[1] / "studies").glob("*.yaml"))
# Reproduction records: one published configuration and one seed, compared with a paper, not
# with variants.
REPRODUCTIONS = {"sasrec_ml1m"}


def test_there_are_seed_system_studies():
    names = {p.stem for p in STUDIES}
    assert {
        "quickstart",
        "sasrec",
        "tisasrec",
        "sasrec_mhc",
        "tisasrec_mhc",
        "hstu",
        "fuxi_alpha",
        "minimind_ffn",
    } <= names


@pytest.mark.parametrize("path", STUDIES, ids=[p.stem for p in STUDIES])
def test_study_validates_with_its_data(path):
    study = load_study(path)  # also checks that the data file exists
    assert BASE in study.variants
    if path.stem not in REPRODUCTIONS:
        assert len(study.variants) >= 2 and len(study.spec.seed_list) >= 3


def test_fuxi_alpha_switches_off_each_ams_channel():
    study = load_study(next(p for p in STUDIES if p.stem == "fuxi_alpha"))
    for channel in ("semantic", "positional", "temporal"):
        variant = study.variants[f"no-{channel}"]
        assert getattr(variant.attention.options, channel) is False
        assert variant.attention.cls.kind_name() == "ams"

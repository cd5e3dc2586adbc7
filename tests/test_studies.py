"""Every ready study in studies/ validates against the real data it names (where they are here:
the data mirror or the download cache, tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ablate.data import catalog as datasets
from ablate.data import named
from ablate.study.load import load_study
from ablate.study.spec import BASE

STUDIES = sorted((Path(__file__).resolve().parents[1] / "studies").glob("*.yaml"))


def named_data(path: Path) -> list[str]:
    """The data sets a study file names in ``task.data`` (one, or a list of them)."""
    data = yaml.safe_load(path.read_text())["task"].get("data")
    names = [named.label_of(entry) for entry in named.entries_of(data) or [data]]
    return [name for name in names if name]


def with_its_data(path: Path):
    return pytest.param(path, marks=pytest.mark.data(*named_data(path)), id=path.stem)


# Studies of one variant: a reproduction record (one published configuration and one seed,
# compared with a paper), and a training change no variant can make (paired by seed with another
# study's `base`).
REPRODUCTIONS = {"sasrec_ml1m", "tisasrec_authors_l2_ml1m"}


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


@pytest.mark.parametrize("path", [with_its_data(p) for p in STUDIES])
def test_study_validates_with_its_data(path):
    study = load_study(path)  # also checks that the data file exists
    assert BASE in study.variants
    if study.dataset is not None:  # read from the mirror or the cache, never from beside the clone
        assert Path(study.task.data_path()).is_relative_to(datasets.root())
    if path.stem not in REPRODUCTIONS:
        assert len(study.variants) >= 2 and len(study.spec.seed_list) >= 3


@pytest.mark.data("ml-100k")
def test_fuxi_alpha_switches_off_each_ams_channel():
    study = load_study(next(p for p in STUDIES if p.stem == "fuxi_alpha"))
    for channel in ("semantic", "positional", "temporal"):
        variant = study.variants[f"no-{channel}"]
        assert getattr(variant.attention.options, channel) is False
        assert variant.attention.cls.kind_name() == "ams"

"""A trial record keeps the settings its fingerprint hashes (issue 40, item 3): ``--reuse``
recomputes the fingerprint from them and compares it with the name the record is filed under and
this study's trial's. A file renamed to another model's fingerprint, or whose settings were edited
under the fingerprint it kept, is refused in one line (the trial is trained); an intact one is
reused; a record made before records kept settings is checked as before (name, seed, numbers)."""

from __future__ import annotations

import copy
import gzip
import json
import re
from pathlib import Path

import pytest

from ablate.drive.ledger import fingerprint, fingerprint_of, fingerprints, trained_with
from ablate.drive.reuse import TRIAL_SUFFIX, Donors, FiledTrial
from ablate.study.load import load_study

REPO = Path(__file__).resolve().parents[1]
TRIALS = REPO / "reports" / "quickstart_grid" / "trials"  # named by the current fingerprint
CELL = "norm.placement=post,ffn.kind=swiglu"  # a grid cell: another model than the base


@pytest.fixture(scope="module")
def grid():
    return load_study(REPO / "studies" / "quickstart_grid.yaml", check_files=False)


def _committed(variant: str, seed: int) -> tuple[Path, dict]:
    stem = re.sub(r"[^\w.-]", "_", variant)
    (path,) = TRIALS.glob(f"{stem}-seed{seed}-*{TRIAL_SUFFIX}")
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return path, json.load(handle)


def _file(folder: Path, variant: str, seed: int, record: dict) -> Path:
    path = folder / f"{variant}-seed{seed}-{record['fingerprint']}{TRIAL_SUFFIX}"
    path.write_bytes(gzip.compress(json.dumps(record).encode()))
    return path


def _with_settings(study, variant: str, seed: int) -> dict:
    """The committed trial's record as ablate now writes it: with the settings it was trained with."""
    _, record = _committed(variant, seed)
    assert record["fingerprint"] == fingerprint(study, variant)
    return {**record, "trained_with": json.loads(json.dumps(trained_with(study, variant), default=str))}


def test_settings_read_back_hash_to_the_fingerprint(grid):
    """As a record keeps them (JSON, read back), every variant's settings give its fingerprint."""
    for variant in grid.variants:
        kept = json.loads(json.dumps(trained_with(grid, variant), sort_keys=True, default=str))
        assert fingerprint_of(kept) == fingerprint(grid, variant), variant
    assert len({fingerprint(grid, v) for v in grid.variants}) == len(grid.variants)


def test_an_intact_record_with_its_settings_is_reused(grid, tmp_path, capsys):
    path = _file(tmp_path, "base", 0, _with_settings(grid, "base", 0))
    found = Donors([tmp_path]).find_for(grid, "base", 0)
    assert isinstance(found, FiledTrial) and found.path == path
    assert capsys.readouterr().err == ""
    result, _ = found.read()
    assert result.summary["test.ndcg@10"] == _committed("base", 0)[1]["final"]["test.ndcg@10"]


def test_a_record_whose_settings_were_edited_under_its_fingerprint_is_refused(grid, tmp_path, capsys):
    record = _with_settings(grid, "base", 0)
    edited = copy.deepcopy(record)
    (attention,) = edited["trained_with"]["model"]["attention"]
    assert attention["options"]["heads"] == 1
    attention["options"]["heads"] = 2  # the fingerprint and the name kept
    _file(tmp_path, "base", 0, edited)
    assert Donors([tmp_path]).find_for(grid, "base", 0) is None
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    recomputed = fingerprint_of(edited["trained_with"])
    assert err[0].startswith("warning: not reused (quickstart_grid in ")
    assert f"its own settings hash to {recomputed}, not {record['fingerprint']} it is filed as" in err[0]
    assert "(model.attention.0.options.heads 2 there, 1 here)" in err[0]
    assert err[0].endswith("; training it instead")


def test_a_renamed_record_whose_settings_are_another_models_is_refused(grid, tmp_path, capsys):
    """The issue's case, with name and record both rewritten: a grid cell's trial (SwiGLU,
    post-norm) filed as the base's. Its settings still hash to the cell's fingerprint."""
    record = _with_settings(grid, CELL, 1)
    base = fingerprint(grid, "base")
    forged = {**record, "variant": "base", "fingerprint": base}
    _file(tmp_path, "base", 1, forged)
    assert Donors([tmp_path]).find_for(grid, "base", 1) is None
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert f"its own settings hash to {fingerprint(grid, CELL)}, not {base} it is filed as" in err[0]
    # the first setting that differs (sorted by key), and a count of the rest (its options, placement)
    assert re.search(r"\(model\.ffn\.0\.kind swiglu there, pointwise here, and \d+ more\)", err[0])
    # Beside it, the base's own intact file is found: a refused candidate does not end the search.
    kept = _file(tmp_path, "base-copy", 1, _with_settings(grid, "base", 1))
    assert Donors([tmp_path]).find_for(grid, "base", 1).path == kept


def test_settings_that_are_not_a_mapping_are_refused(grid, tmp_path, capsys):
    _file(tmp_path, "base", 2, {**_with_settings(grid, "base", 2), "trained_with": ["model"]})
    assert Donors([tmp_path]).find_for(grid, "base", 2) is None
    assert "its settings are a list, not a mapping; training it instead" in capsys.readouterr().err


def test_an_older_record_without_settings_is_still_reused(grid, tmp_path):
    """The committed files predate records with settings: found as before, by name and seed."""
    donors = Donors([TRIALS])
    for variant in grid.variants:
        for seed in (0, 1, 2):
            found = donors.find_for(grid, variant, seed)
            assert found is not None and found.settings() is None, (variant, seed)
            assert found.path == _committed(variant, seed)[0]
    assert donors.find(fingerprints(grid, "base"), 0) is not None  # without this trial's settings too

"""``--reuse`` trusts no file (issue 40, item 3): a trial file renamed to pass for another model or
seed is never copied, a record with a metric that is not a finite number is refused (the trial is
trained instead, one warning line), and a reuse source that does not exist is an error — never an
empty database created in its place."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from ablate.drive.reuse import TRIAL_SUFFIX, Donors, FiledTrial
from ablate.errors import AblateError

REPO = Path(__file__).resolve().parents[1]
# A real trial file (committed beside its report): fuxi_alpha_ml1m's base, seed 3.
REAL = REPO / "reports" / "fuxi_alpha_ml1m" / "trials" / f"base-seed3-f532881595a4821f{TRIAL_SUFFIX}"


def _record(path: Path) -> dict:
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return json.load(handle)


def _write(path: Path, record: dict) -> Path:
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        json.dump(record, handle)
    return path


def test_a_real_trial_file_is_found_and_read(tmp_path):
    shutil.copy(REAL, tmp_path)
    donor = Donors([tmp_path]).find(["f532881595a4821f"], 3)
    assert isinstance(donor, FiledTrial)
    result, _ = donor.read()
    assert result.summary["test.ndcg@10"] == _record(REAL)["final"]["test.ndcg@10"]


@pytest.mark.parametrize("renamed", ["base-seed3-0123456789abcdef", "base-seed4-f532881595a4821f"])
def test_a_renamed_trial_file_is_never_copied(tmp_path, capsys, renamed):
    shutil.copy(REAL, tmp_path / f"{renamed}{TRIAL_SUFFIX}")
    fingerprint, seed = renamed.rsplit("-", 1)[1], int(renamed.split("-seed")[1].split("-")[0])
    assert Donors([tmp_path]).find([fingerprint], seed) is None
    err = capsys.readouterr().err
    assert "holds fingerprint f532881595a4821f seed 3" in err and "(renamed or altered)" in err


@pytest.mark.parametrize("value", ["0.25", float("nan"), float("inf"), True, None])
def test_a_record_whose_metric_is_not_a_finite_number_is_refused(tmp_path, value):
    record = _record(REAL)
    record["final"]["test.ndcg@10"] = value
    path = _write(tmp_path / REAL.name, record)
    donor = Donors([tmp_path]).find(["f532881595a4821f"], 3)
    assert donor is not None and donor.path == path
    with pytest.raises(ValueError, match="test.ndcg@10 is .*, not a finite number"):
        donor.read()


def test_a_curve_point_that_is_not_a_number_is_refused(tmp_path):
    record = _record(REAL)
    epoch, key, _ = record["curves"][0]
    record["curves"][0] = [epoch, key, "high"]
    donor = FiledTrial(_write(tmp_path / REAL.name, record), record)
    with pytest.raises(ValueError, match=f"{key} at epoch {epoch} is 'high'"):
        donor.read()


def test_an_unreadable_donor_costs_a_training_with_one_line(tmp_path, capsys):
    record = _record(REAL)
    record["final"]["test.hr@10"] = "lots"
    donor = FiledTrial(_write(tmp_path / REAL.name, record), record)
    assert donor.copy_into(tracker=None, run_id="unused") is None  # nothing written: refused first
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not reused" in err[0] and "training it instead" in err[0]


def test_a_reuse_database_that_does_not_exist_is_an_error_not_created(tmp_path):
    typo = tmp_path / "typo.db"
    with pytest.raises(AblateError, match=r"--reuse sqlite:///.*typo\.db: no such database file"):
        Donors([f"sqlite:///{typo}"])
    assert not typo.exists()


def test_a_donor_trained_on_other_data_is_not_copied(tmp_path, capsys):
    record = _record(REAL)
    record["tags"]["ablate.data_digest"] = "aaaa"
    _write(tmp_path / REAL.name, record)
    donors = Donors([tmp_path])
    assert donors.find(["f532881595a4821f"], 3, data_digest="bbbb") is None
    assert "trained on other data (aaaa, these are bbbb)" in capsys.readouterr().err
    assert donors.find(["f532881595a4821f"], 3, data_digest="aaaa") is not None
    assert donors.find(["f532881595a4821f"], 3) is not None  # synthetic data: no digest to compare


def test_a_donor_of_another_model_size_is_trained_instead(tmp_path, capsys):
    """The issue's case: a dim-32 trial renamed (name and record) to a dim-16 fingerprint. Its
    parameter count is not this trial's model's: refused with one line, nothing written."""
    record = _record(REAL)
    assert record["final"]["params"] == 251956  # FuXi-α as fuxi_alpha_ml1m builds it
    donor = FiledTrial(_write(tmp_path / REAL.name, record), record)
    assert donor.copy_into(tracker=None, run_id="unused", parameters=8480) is None
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "its model has 251,956 parameters, this trial's 8,480 (another model)" in err[0]

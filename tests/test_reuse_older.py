"""`ablate run --reuse DIR --reuse-older-kinds`: a report written again with today's statistics
from trials trained before one of their kinds' versions went up — copied under the fingerprint
they were trained with, named as such in results and Methods, written back under that fingerprint
(never today's), and nothing trained beside them."""

from __future__ import annotations

import gzip
import json
import re

import pytest
import yaml
from tiny_study import tiny_spec

import ablate
from ablate import registry
from ablate.commands.workers import worker_command
from ablate.drive import Stores, write_trials
from ablate.drive.ledger import fingerprint, legacy_fingerprint
from ablate.drive.older import OlderDonor, older_fingerprints
from ablate.drive.reuse import TRIAL_SUFFIX, Donors
from ablate.study.load import load_study
from ablate.tracking.names import OLDER_FINGERPRINT_TAG, OLDER_KINDS_TAG
from ablate.tracking.results import load_results

FAST_REPORT = {"calibration": 0, "bootstrap": 200}  # the report's statistics are not under test
NAMED = rf"(.+)-seed(\d+)-([0-9a-f]{{16}}){re.escape(TRIAL_SUFFIX)}"


@pytest.fixture(scope="module")
def kept(tmp_path_factory):
    """The trial files of a finished two-variant study (base, mlp × seeds 0, 1), trained once for
    the module while the softmax attention kind was at its present version."""
    folder = tmp_path_factory.mktemp("older")
    spec = tiny_spec({"name": "donor", "report": FAST_REPORT})
    spec["output"] = str(folder / "runs" / "donor")
    (folder / "donor.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    ablate.run(folder / "donor.yaml", quiet=True)
    write_trials(f"sqlite:///{folder / 'runs/donor/mlflow.db'}", "donor", folder / "kept")
    return folder / "kept"


@pytest.fixture
def bumped(monkeypatch):
    """The softmax kind one version on, as after a change to what it trains: its version then."""
    softmax = registry.get("attention", "softmax")
    monkeypatch.setattr(softmax, "version", softmax.version + 1)
    return softmax.version


def _fingerprints(folder) -> set[str]:
    return {re.fullmatch(NAMED, p.name).group(3) for p in folder.glob(f"*{TRIAL_SUFFIX}")}


def test_older_fingerprints_are_those_trials_had_before_the_bump(write_study, monkeypatch):
    study_file = write_study({"report": FAST_REPORT})
    before = fingerprint(load_study(study_file, check_files=False), "base")
    softmax = registry.get("attention", "softmax")
    assert older_fingerprints(load_study(study_file, check_files=False), "base") == {}  # nothing bumped
    now = softmax.version + 1
    monkeypatch.setattr(softmax, "version", now)
    study = load_study(study_file, check_files=False)
    older = older_fingerprints(study, "base")
    assert fingerprint(study, "base") != before and fingerprint(study, "base") not in older
    said = f"softmax v{now - 1} (now v{now})"
    assert older[before] == said
    # the text-based fingerprint, made while every kind was at version 1
    assert older[legacy_fingerprint(study, "base")].startswith(f"softmax v1 (now v{now})")


def test_a_report_is_written_again_from_trials_of_an_older_kind(kept, bumped, write_study, cli, tmp_path):
    study_file = write_study({"name": "taker", "report": FAST_REPORT}, name="taker.yaml")
    study = load_study(study_file, check_files=False)
    assert Donors([kept]).find_for(study, "base", 0) is None  # --reuse alone trains them again
    donor = load_results(f"sqlite:///{kept.parent / 'runs/donor/mlflow.db'}", "donor").results
    code, _, err = cli("run", study_file, "--quiet", "--reuse", kept, "--reuse-older-kinds")
    assert code == 0, err
    said = f"softmax v{bumped - 1} (now v{bumped})"
    assert err.count(f"as trained under {said}") == 4, err
    got = load_results(f"sqlite:///{tmp_path / 'runs/taker/mlflow.db'}", "taker").results
    assert (got["trained_under"] == said).all() and got["reused_from"].notna().all() and len(got) == 4
    by_key = {(r["variant"], r["seed"]): r["test.ndcg@10"] for r in donor.to_dict("records")}
    assert {(r["variant"], r["seed"]): r["test.ndcg@10"] for r in got.to_dict("records")} == by_key
    report = (tmp_path / "runs/taker/report/report.md").read_text()
    assert "4 of them were trained under earlier versions of their kinds" in report
    assert f"base seeds 0, 1, mlp seeds 0, 1 under {said}" in report
    assert "the run that wrote this report trained nothing" in report

    # Written back, each file keeps the fingerprint its trial was trained under, not today's.
    code, _, err = cli("report", study_file, "--trials", tmp_path / "again")
    assert code == 0, err
    assert _fingerprints(tmp_path / "again") == _fingerprints(kept)
    assert fingerprint(study, "base") not in _fingerprints(tmp_path / "again")
    for path in (tmp_path / "again").glob(f"*{TRIAL_SUFFIX}"):
        record = json.loads(gzip.decompress(path.read_bytes()))
        assert "trained_with" not in record  # today's settings are not what it trained with
        assert record["tags"][OLDER_KINDS_TAG] == said and record["tags"][OLDER_FINGERPRINT_TAG]
    # Neither those files nor the rebuilt store pass for today's trials; with the flag they are found.
    for place in (tmp_path / "again", tmp_path / "runs/taker"):
        assert Donors([place]).find_for(study, "mlp", 1) is None
        found = Donors([place], older_kinds=True).find_for(study, "mlp", 1)
        assert isinstance(found, OlderDonor) and found.versions == said


def test_a_trial_with_nothing_to_copy_is_not_trained_beside_older_ones(
    kept, bumped, write_study, cli, tmp_path
):
    study_file = write_study({"name": "taker", "report": FAST_REPORT, "seeds": [0, 1, 2]}, name="taker.yaml")
    code, _, err = cli("run", study_file, "--quiet", "--reuse", kept, "--reuse-older-kinds")
    assert code == 2
    last = err.strip().splitlines()[-1]
    assert (
        last.startswith("error: ") and " seed 2: no finished trial to copy under --reuse-older-kinds " in last
    )
    assert "Traceback" not in err
    got = load_results(f"sqlite:///{tmp_path / 'runs/taker/mlflow.db'}", "taker").results
    assert got["trained_under"].notna().all()  # nothing trained under today's version


def test_the_flag_needs_a_place_and_reaches_the_workers(kept, write_study, cli):
    study_file = write_study({"report": FAST_REPORT})
    code, _, err = cli("run", study_file, "--reuse-older-kinds")
    assert (
        code == 2
        and err.strip() == "error: --reuse-older-kinds copies from the places --reuse names: give one"
    )
    study = load_study(study_file, check_files=False)
    command = worker_command(study, Stores.for_study(study), False, Donors([kept], older_kinds=True))
    assert command[-3:] == ["--reuse", str(kept.resolve()), "--reuse-older-kinds"]
    assert "--reuse-older-kinds" not in worker_command(study, Stores.for_study(study), False, Donors([kept]))

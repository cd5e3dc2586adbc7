"""Data identity (issue 40, item 1): each trial records a digest of the data it was trained on;
a data file changed under finished trials stops the next run before it trains anything, in one
line giving the command that trains on the new data apart (a study and output folder of their
own; the earlier trials and report kept as they were); a donor trained on other data is not copied."""

from __future__ import annotations

import shlex
from pathlib import Path

import optuna
import pandas as pd
import pytest
from optuna.trial import TrialState, create_trial

from ablate.drive.identity import check_data
from ablate.drive.ledger import DATA_DIGEST
from ablate.errors import AblateError
from ablate.study.load import load_study


def _ratings(path, shift: int = 0):
    """40 users × 8 rated items in MovieLens' u.data form; ``shift`` changes one rating's item."""
    lines = [
        f"{u}\t{(u * 7 + k * 3) % 30 + 1 + (shift if (u, k) == (1, 0) else 0)}\t4\t{1000 + 10 * k}"
        for u in range(1, 41)
        for k in range(8)
    ]
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.heavy
def test_a_data_file_changed_under_finished_trials_stops_the_run(cli, write_study, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    data = tmp_path / "u.data"
    _ratings(data)
    patch = {"train": {"epochs": 1}, "report": {"calibration": 0, "bootstrap": 100}}
    study = write_study(
        patch, replace={"task.data": {"format": "movielens", "path": str(data)}, "seeds": [0]}
    )
    code, _, err = cli("run", study, "--quiet")
    assert code == 0, err
    digest = load_study(study).task.data_digest()
    trials = _trials(tmp_path / "runs" / "tiny", "tiny")
    assert trials and {t.user_attrs[DATA_DIGEST] for t in trials} == {digest}
    report = (tmp_path / "runs" / "tiny" / "report" / "report.md").read_text()

    _ratings(data, shift=1)  # one item of one rating differs: another data set
    assert load_study(study).task.data_digest() != digest
    code, _, err = cli("run", study, "--quiet")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "trained on other data than task.data holds now" in err and f"on data {digest}" in err
    new = load_study(study).task.data_digest()
    out = tmp_path / "runs" / "tiny"
    command = f"ablate run {study} name=tiny-{new[:8]} --output {out}-{new[:8]}"
    assert f"the earlier trials and their report kept apart: {command}; or put the earlier file back" in err

    # That command, as given: the new data's trials in a study and folder of their own, the
    # earlier ones (and their report) untouched.
    code, _, err = cli(*shlex.split(command)[1:], "--quiet")
    assert code == 0, err
    apart = tmp_path / "runs" / f"tiny-{new[:8]}"
    made = _trials(apart, f"tiny-{new[:8]}")
    assert len(made) == 2 and {t.user_attrs[DATA_DIGEST] for t in made} == {new}
    assert len(pd.read_csv(apart / "report" / "results.csv")) == 2
    assert f"| data digest (SHA-256) | {new} |" in (apart / "report" / "report.md").read_text()
    assert [t.user_attrs[DATA_DIGEST] for t in _trials(out, "tiny")] == [digest, digest]
    assert (out / "report" / "report.md").read_text() == report

    _ratings(data)  # the earlier file back: the study goes on
    code, _, err = cli("run", study, "seeds=[0,1]", "--quiet")
    assert code == 0, err


def _trials(out: Path, name: str) -> list:
    journal = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(out / "optuna.journal"))
    )
    return optuna.load_study(study_name=name, storage=journal).trials


def test_trials_recorded_before_digests_count_as_trained_on_these_data(write_study, tmp_path):
    def done(**attrs):
        return create_trial(
            state=TrialState.COMPLETE, value=0.0, user_attrs={"variant": "base", "seed": 0, **attrs}
        )

    study = load_study(write_study(), overrides=["name=mine", "seeds=[0]"])
    here = tmp_path / "here"
    check_data([done(), done(data_digest="abc")], study, "abc", here)
    check_data([done(data_digest="old")], study, None, here)  # synthetic data: nothing to compare
    with pytest.raises(AblateError) as raised:
        now = "abcdef0123"
        check_data([done(data_digest="old"), done(data_digest=now)], study, now, here, "s.search.b")
    said = str(raised.value)
    assert said.startswith(f"search study 's.search.b' in {here} holds finished trials trained on other data")
    assert "(1 on data old; the data are now abcdef0123)" in said
    # The study's overrides kept, its name replaced: a study of its own
    assert f"ablate run {study.path} 'seeds=[0]' name=mine-abcdef01 --output {here}-abcdef01;" in said

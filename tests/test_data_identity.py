"""Data identity (issue 40, item 1): each trial records a digest of the data it was trained on;
a data file changed under finished trials stops the next run before it trains anything, in one
line; a donor trained on other data is not copied."""

from __future__ import annotations

import optuna
import pytest
from optuna.trial import TrialState, create_trial

from ablate.drive.ledger import DATA_DIGEST, check_data
from ablate.errors import AblateError
from ablate.study import load_study


def _ratings(path, shift: int = 0):
    """40 users × 8 rated items in MovieLens' u.data form; ``shift`` changes one rating's item."""
    lines = [
        f"{u}\t{(u * 7 + k * 3) % 30 + 1 + (shift if (u, k) == (1, 0) else 0)}\t4\t{1000 + 10 * k}"
        for u in range(1, 41)
        for k in range(8)
    ]
    path.write_text("\n".join(lines) + "\n")


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
    journal = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(tmp_path / "runs" / "tiny" / "optuna.journal"))
    )
    trials = optuna.load_study(study_name="tiny", storage=journal).trials
    assert trials and {t.user_attrs[DATA_DIGEST] for t in trials} == {digest}

    _ratings(data, shift=1)  # one item of one rating differs: another data set
    assert load_study(study).task.data_digest() != digest
    code, _, err = cli("run", study, "seeds=[0,1]", "--quiet")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "trained on other data than task.data holds now" in err and f"on data {digest}" in err
    assert "give a new --output folder" in err

    _ratings(data)  # the earlier file back: the study goes on
    code, _, err = cli("run", study, "seeds=[0,1]", "--quiet")
    assert code == 0, err


def test_trials_recorded_before_digests_count_as_trained_on_these_data():
    def done(**attrs):
        return create_trial(
            state=TrialState.COMPLETE, value=0.0, user_attrs={"variant": "base", "seed": 0, **attrs}
        )

    check_data([done(), done(data_digest="abc")], "abc", "here")
    check_data([done(data_digest="old")], None, "here")  # synthetic data: nothing to compare
    with pytest.raises(
        AblateError, match=r"here holds finished trials .*\(1 on data old; the data are now abc\)"
    ):
        check_data([done(data_digest="old"), done(data_digest="abc")], "abc", "here")

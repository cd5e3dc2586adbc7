"""A store lost beside the other (issue 40, item 4): caught at start in one line with the way
back, `status` saying what `run` says; a lost journal rebuilt from the tracking records
(`--rebuild-queue`), its finished trials kept, not retrained."""

from __future__ import annotations

import shutil


def test_a_lost_journal_or_tracking_store_is_one_line_and_the_journal_is_rebuilt(
    cli, write_study, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    study = write_study(
        {"train": {"epochs": 1}, "report": {"calibration": 0, "bootstrap": 100}}, replace={"seeds": [0]}
    )
    assert cli("run", study, "--quiet")[0] == 0
    output = tmp_path / "runs" / "tiny"
    kept = tmp_path / "kept"
    shutil.copytree(output, kept)

    (output / "optuna.journal").unlink()
    for command in (("run", study, "--quiet"), ("status", study)):
        code, _, err = cli(*command)
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert "optuna.journal is missing, but" in err and "holds 2 finished trial(s) of 'tiny'" in err
        assert "--rebuild-queue" in err
    code, out, err = cli("run", study, "--quiet", "--rebuild-queue")
    assert code == 0, err
    assert "rebuilt: 2 finished trial(s) of the queue from the tracking records" in err
    assert "resumed: 2 trial(s) were already complete and were not retrained" in err
    code, out, _ = cli("status", study)
    assert code == 0 and "2/2 trials done" in out and "finished" in out
    code, _, err = cli("run", study, "--quiet", "--rebuild-queue")
    assert code == 2 and "nothing to rebuild" in err

    shutil.rmtree(output)
    shutil.copytree(kept, output)
    (output / "mlflow.db").unlink()
    for command in (("run", study, "--quiet"), ("status", study)):
        code, _, err = cli(*command)
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert "mlflow.db is missing, but" in err and "holds 2 finished trial(s)" in err
    assert not (output / "mlflow.db").exists()  # nothing created in its place

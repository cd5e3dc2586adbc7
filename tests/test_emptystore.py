"""A new SQLite tracking store starts as a copy of an empty one MLflow migrated before
(ablate.tracking.emptystore): the copy is a working store, and a kept file that is not empty, not a
database, or in a folder others can write is never copied."""

from __future__ import annotations

import os
import sqlite3

import pytest
from mlflow import MlflowClient

from ablate.tracking import emptystore
from ablate.tracking.store import Tracker


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("ABLATE_CACHE_DIR", str(folder))
    monkeypatch.chdir(tmp_path)
    return folder


def _kept(cache):
    return next((cache / f"stores-{os.getuid()}").glob("mlflow-*-empty.db"))


def test_the_second_new_store_is_a_copy_that_mlflow_uses(cache, tmp_path):
    Tracker(f"sqlite:///{tmp_path / 'a' / 'mlflow.db'}", "first")
    kept = _kept(cache)
    assert emptystore._is_empty(kept)  # kept before the experiment was created in the first store
    second = tmp_path / "b" / "mlflow.db"
    second.parent.mkdir()
    assert emptystore.seed(second)
    tracker = Tracker(f"sqlite:///{second}", "second")
    run = tracker.client.create_run(tracker.experiment_id)
    tracker.client.log_metric(run.info.run_id, "x", 1.5)
    client = MlflowClient(tracking_uri=f"sqlite:///{second}")
    assert client.get_run(run.info.run_id).data.metrics == {"x": 1.5}
    assert [e.name for e in client.search_experiments()] == ["second", "Default"]
    # the Default experiment's folder is this working folder's, as MLflow would make it here
    assert client.get_experiment("0").artifact_location == str(tmp_path / "mlruns" / "0")
    assert not emptystore.seed(second)  # a store that exists is never replaced


def test_a_kept_store_holding_a_run_is_never_copied(cache, tmp_path):
    Tracker(f"sqlite:///{tmp_path / 'a' / 'mlflow.db'}", "first")
    kept = _kept(cache)
    with sqlite3.connect(kept) as connection:  # planted: a finished run someone put there
        connection.execute(
            "INSERT INTO experiments (experiment_id, name, lifecycle_stage) VALUES (7, 'x', 'active')"
        )
    connection.close()
    assert not emptystore._is_empty(kept)
    target = tmp_path / "b" / "mlflow.db"
    target.parent.mkdir()
    assert not emptystore.seed(target) and not target.exists()
    tracker = Tracker(f"sqlite:///{target}", "second")  # MLflow makes it; the kept one is replaced
    assert [e.name for e in tracker.client.search_experiments()] == ["second", "Default"]
    assert emptystore._is_empty(kept)


def test_junk_or_a_folder_others_can_write_is_never_copied(cache, tmp_path):
    Tracker(f"sqlite:///{tmp_path / 'a' / 'mlflow.db'}", "first")
    kept = _kept(cache)
    target = tmp_path / "b.db"
    kept.parent.chmod(0o777)
    assert not emptystore.seed(target) and not target.exists()
    kept.parent.chmod(0o700)
    kept.write_bytes(b"not a database")
    assert not emptystore.seed(target) and not target.exists()


def test_a_kept_store_with_a_trigger_or_another_schema_is_never_copied(cache, tmp_path):
    Tracker(f"sqlite:///{tmp_path / 'a' / 'mlflow.db'}", "first")
    kept = _kept(cache)
    assert kept.with_suffix(".schema").read_text().count("table\t") >= 20  # MLflow's tables, dumped
    pristine = kept.read_bytes()
    with sqlite3.connect(kept) as connection:  # planted: every metric logged reads 0.999
        connection.execute(
            "CREATE TRIGGER t AFTER INSERT ON metrics BEGIN UPDATE metrics SET value = 0.999; END"
        )
    connection.close()
    target = tmp_path / "b" / "mlflow.db"
    target.parent.mkdir()
    assert not emptystore.seed(target) and not target.exists()
    kept.write_bytes(pristine)
    with sqlite3.connect(kept) as connection:  # a table of its own: not the schema MLflow made
        connection.execute("CREATE TABLE extra (x)")
    connection.close()
    assert not emptystore.seed(target) and not target.exists()
    kept.write_bytes(pristine)
    assert emptystore.seed(target)


def test_a_store_cut_short_as_it_is_made_is_removed_and_the_error_is_one_line(cache, tmp_path, monkeypatch):
    from ablate.errors import RunFailed
    from ablate.tracking import store

    db = tmp_path / "a" / "mlflow.db"

    def half_built(tracking_uri):
        db.write_bytes(b"SQLite format 3\0" + bytes(100))  # the migration's first pages, then the limit
        raise OSError(27, "File too large")

    monkeypatch.setattr(store, "MlflowClient", half_built)
    with pytest.raises(
        RunFailed, match=r"^cannot open MLflow tracking store sqlite:///.*: .*File too large"
    ) as failed:
        Tracker(f"sqlite:///{db}", "first")
    assert failed.value.exit_code == 1  # the disk failed, not the input
    assert not db.exists()  # nothing left to block the next run
    monkeypatch.undo()
    monkeypatch.setenv("ABLATE_CACHE_DIR", str(cache))
    monkeypatch.chdir(tmp_path)
    Tracker(f"sqlite:///{db}", "first")  # the next run makes it
    assert db.stat().st_size > 0

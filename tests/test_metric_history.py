"""A trial's MLflow histories: each ``valid.*`` history is the per-epoch curve alone (the restored
best state's values are ``best.valid.*``), and stores written the old way (the best value as an
extra step-0 point) still read back the same."""

from __future__ import annotations

import pandas as pd
from mlflow.entities import Metric

from ablate.tracking.results import load_results
from ablate.tracking.store import Tracker, read_units, trial_metrics

UNITS = pd.DataFrame({"unit": [1], "ndcg@10": [0.4]})


def _trial(tracker: Tracker, parent: str, seed: int) -> str:
    return tracker.start_trial(parent, f"base-{seed}", {"variant": "base", "seed": str(seed)}, {})


def test_valid_histories_hold_the_curve_alone_and_the_best_state_is_read_back(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = Tracker(uri, "h", artifact_root=tmp_path / "artifacts")
    parent = tracker.study_run("h", {}, {})
    run = _trial(tracker, parent, 0)
    for epoch, value in ((1, 0.2), (2, 0.6), (3, 0.5)):
        tracker.log_metrics(run, {"valid.ndcg@10": value, "train.loss": 1.0 / epoch}, step=epoch)
    tracker.finish_trial(run, {"valid.ndcg@10": 0.6, "test.ndcg@10": 0.4, "wall_s": 1.0}, UNITS)

    history = tracker.client.get_metric_history(run, "valid.ndcg_at_10")
    assert sorted((m.step, m.value) for m in history) == [(1, 0.2), (2, 0.6), (3, 0.5)]
    assert [m.value for m in tracker.client.get_metric_history(run, "best.valid.ndcg_at_10")] == [0.6]

    final, curves = trial_metrics(tracker.client, tracker.client.get_run(run))
    assert final == {"valid.ndcg@10": 0.6, "test.ndcg@10": 0.4, "wall_s": 1.0}
    assert sorted(k for _, k, _ in curves) == ["train.loss"] * 3 + ["valid.ndcg@10"] * 3
    assert min(e for e, _, _ in curves) == 1

    loaded = load_results(uri, "h")
    assert loaded.results.iloc[0]["valid.ndcg@10"] == 0.6
    valid = loaded.curves[loaded.curves.metric == "valid.ndcg@10"]
    assert list(valid.sort_values("epoch").value) == [0.2, 0.6, 0.5]  # no fourth point


def test_a_store_written_with_the_step_0_point_reads_as_before(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = Tracker(uri, "old", artifact_root=tmp_path / "artifacts")
    parent = tracker.study_run("old", {}, {})
    run = _trial(tracker, parent, 0)
    points = [Metric("valid.ndcg_at_10", v, 0, step) for step, v in ((1, 0.7), (2, 0.3), (0, 0.7))]
    tracker.client.log_batch(run, metrics=[*points, Metric("test.ndcg_at_10", 0.5, 0, 0)])
    tracker.client.log_artifact(run, str(_units(tmp_path)), artifact_path="units")
    tracker.client.set_terminated(run, "FINISHED")

    final, curves = trial_metrics(tracker.client, tracker.client.get_run(run))
    assert final == {"valid.ndcg@10": 0.7, "test.ndcg@10": 0.5}  # the step-0 point, not the latest (0.3)
    assert sorted(curves) == [(1, "valid.ndcg@10", 0.7), (2, "valid.ndcg@10", 0.3)]
    loaded = load_results(uri, "old")
    assert loaded.results.iloc[0]["valid.ndcg@10"] == 0.7 and len(loaded.curves) == 2


def _units(tmp_path):
    path = tmp_path / "test.csv"
    UNITS.to_csv(path, index=False)
    return path


def test_a_local_stores_unit_table_is_read_where_it_lies_and_a_remote_ones_downloaded(tmp_path, monkeypatch):
    """read_units: a file:// artifact is read in place (MLflow's download copied it through a
    temporary folder, 50 ms a trial); any other artifact location is downloaded."""
    tracker = Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "u", artifact_root=tmp_path / "artifacts")
    run = _trial(tracker, tracker.study_run("u", {}, {}), 0)
    tracker.finish_trial(run, {"test.ndcg@10": 0.4}, UNITS)
    stored = tracker.client.get_run(run)
    downloads = []
    real = tracker.client.download_artifacts

    def counted(*args, **kwargs):
        downloads.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(tracker.client, "download_artifacts", counted, raising=False)
    pd.testing.assert_frame_equal(read_units(tracker.client, stored), UNITS)
    assert downloads == []
    monkeypatch.setattr(stored.info, "_artifact_uri", "mlflow-artifacts:/elsewhere", raising=False)
    assert stored.info.artifact_uri == "mlflow-artifacts:/elsewhere"
    # MLflow downloads from the location its store holds for the run: the table again.
    pd.testing.assert_frame_equal(read_units(tracker.client, stored), UNITS)
    assert len(downloads) == 1

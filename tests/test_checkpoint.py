"""Mid-trial checkpoints: a trial interrupted after epoch k continues from its last checkpoint and
ends exactly where the uninterrupted trial ends (same curves, metrics and weights)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
import torch
from mlflow import MlflowClient

from ablate import drive
from ablate.drive.execution import Job, checkpoint_path
from ablate.drive.ledger import key_of
from ablate.faults import KILL_ENV
from ablate.study.load import load_study
from ablate.training.trainer import CHECKPOINT_ENV, Checkpoint, checkpoint_summaries, train_trial

PATCH = {"train": {"epochs": 6, "eval_every": 2, "patience": 10}, "model": {"dropout": 0.3}}


class Interrupt(BaseException):
    """Stands for a worker dying after an epoch (not an Exception: nothing catches it)."""


def _train(study, data, checkpoint=None, stop_at=None, seen=None):
    def on_epoch(epoch, logged):
        if seen is not None:
            seen.append((epoch, dict(logged)))
        if epoch == stop_at:
            raise Interrupt

    return train_trial(
        study, study.variants["mlp"], 3, data, torch.device("cpu"), on_epoch=on_epoch, checkpoint=checkpoint
    )


def test_resumed_trial_equals_the_uninterrupted_one(write_study, tmp_path, monkeypatch):
    study = load_study(write_study(PATCH))
    data = study.task.load()
    states = []  # the last: the best weights, restored before the final evaluation
    real_load = torch.nn.Module.load_state_dict

    def capture(self, state, *args, **kwargs):
        states.append({k: v.clone() for k, v in state.items()})
        return real_load(self, state, *args, **kwargs)

    monkeypatch.setattr(torch.nn.Module, "load_state_dict", capture)
    whole = _train(study, data)
    whole_best = states[-1]

    checkpoint = Checkpoint(tmp_path / "ck" / "mlp-seed3.pt", signature="sig", every_s=0)
    with pytest.raises(Interrupt):
        _train(study, data, checkpoint, stop_at=5)  # epochs 1-4 saved, killed during epoch 5's callback
    assert checkpoint.path.is_file()
    assert torch.load(checkpoint.path, weights_only=True)["epoch"] == 4
    summary = checkpoint_summaries(checkpoint.path.parent)["mlp-seed3"]
    assert (summary["epoch"], summary["epochs"]) == (4, 6)

    seen: list = []
    states.clear()
    resumed = _train(study, data, checkpoint, seen=seen)
    assert resumed.resumed_from == 4 and resumed.epochs == 6
    assert not checkpoint.path.exists()  # removed once the trial has its result
    # The callback hears the restored epochs again (a new tracking run gets the whole curve).
    assert [e for e, _ in seen] == [1, 2, 3, 4, 5, 6]
    assert seen[1][1] == {k: v for e, k, v in whole.curves if e == 2}
    assert resumed.curves == whole.curves
    assert resumed.summary == whole.summary and resumed.best_epoch == whole.best_epoch
    assert resumed.per_unit.equals(whole.per_unit)
    assert resumed.tokens_per_s > 0 and resumed.wall_s > 0
    for key, value in whole_best.items():
        assert torch.equal(states[-1][key], value), key


def test_a_checkpoint_of_another_configuration_is_ignored(write_study, tmp_path):
    study = load_study(write_study(PATCH))
    data = study.task.load()
    checkpoint = Checkpoint(tmp_path / "mlp-seed3.pt", signature="one", every_s=0)
    with pytest.raises(Interrupt):
        _train(study, data, checkpoint, stop_at=3)
    other = Checkpoint(checkpoint.path, signature="two", every_s=0)
    assert other.load() is None and _train(study, data, other).resumed_from == 0
    checkpoint.path.write_bytes(b"torn write")
    assert checkpoint.load() is None


@pytest.mark.heavy
def test_killed_worker_resumes_mid_trial(write_study, tmp_path, cli, monkeypatch):
    """A real `ablate run` SIGKILLed after epoch 3 of its first trial: the rerun trains that
    trial from epoch 2's checkpoint, and the tracked result equals an uninterrupted study's. Only
    the killed run is a process of its own; the others run in this one (one torch thread in
    all three, so that their numbers can be equal)."""
    train = {**PATCH["train"], "threads": 1}
    patch = {**PATCH, "train": train, "seeds": [0], "report": {"calibration": 0, "bootstrap": 200}}
    monkeypatch.setenv(CHECKPOINT_ENV, "0")
    monkeypatch.chdir(tmp_path)
    results = {}
    for label, kill in (("whole", None), ("killed", "train@3")):
        study = write_study({**patch, "name": "tiny", "output": str(tmp_path / label)}, name=f"{label}.yaml")
        args = ["run", str(study), "--quiet", "--reports", str(tmp_path / f"reports-{label}")]
        if kill:
            proc = subprocess.run(
                [sys.executable, "-m", "ablate.commands.cli", *args],
                env={**os.environ, KILL_ENV: kill},
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
            assert (tmp_path / label / "checkpoints" / "base-seed0.pt").is_file()
            code, status, _ = cli("status", study)
            assert code == 0 and "checkpoint: base-seed0 at epoch 2/6" in status, status
        code, _, err = cli(*args)
        assert code == 0, err[-2000:]
        assert not list((tmp_path / label / "checkpoints").iterdir())  # removed once the trial finished
        client = MlflowClient(f"sqlite:///{tmp_path / label / 'mlflow.db'}")
        exp = client.get_experiment_by_name("tiny")
        runs = client.search_runs(
            [exp.experiment_id], "tags.`ablate.role` = 'trial' and attributes.status = 'FINISHED'"
        )
        results[label] = {r.data.tags["variant"]: r for r in runs}
    killed, whole = results["killed"], results["whole"]
    assert sorted(killed) == sorted(whole) == ["base", "mlp"]
    assert killed["base"].data.tags.get("ablate.resumed_from_epoch") == "2"
    assert "ablate.resumed_from_epoch" not in killed["mlp"].data.tags
    for variant in whole:
        for key in ("test.ndcg_at_10", "test.hr_at_10", "valid.ndcg_at_10", "best_epoch"):
            assert killed[variant].data.metrics[key] == whole[variant].data.metrics[key], (variant, key)
    client = MlflowClient(f"sqlite:///{tmp_path / 'killed' / 'mlflow.db'}")
    curve = client.get_metric_history(killed["base"].info.run_id, "train.loss")
    assert sorted(m.step for m in curve) == [1, 2, 3, 4, 5, 6]  # the whole curve in the new run


def test_bad_checkpoint_interval_is_one_line(cli, write_study, monkeypatch):
    monkeypatch.setenv(CHECKPOINT_ENV, "soon")
    code, _, err = cli("run", write_study(), "--quiet")
    assert code == 2 and "ABLATE_CHECKPOINT_S='soon'" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_a_resumed_study_takes_its_checkpointed_trials_first(write_study, tmp_path, monkeypatch):
    """Queued trials go in plan order, except that one an interrupted run left a checkpoint for
    is taken before the others (a resumed study finishes what it half-trained first)."""
    monkeypatch.chdir(tmp_path)
    study = load_study(write_study({"seeds": [0, 1]}))
    stores = drive.Stores.for_study(study)
    drive.prepare(study, stores)
    driver = drive.Driver(study, stores, worker_id="tester")
    queued = [key_of(t) for t in driver.final.trials()]
    assert len(queued) == 4
    half_trained = queued[2]
    path = checkpoint_path(stores.output_dir, Job(*half_trained))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")  # only its presence matters for the order
    taken = []
    while (popped := driver._next()) is not None:  # its first read finds the checkpoint
        queue, trial = popped
        taken.append(key_of(queue.stored(trial.number)))
        queue.study.tell(trial, 0.0)
    assert taken == [half_trained, *(key for key in queued if key != half_trained)]


def test_a_planted_checkpoint_cannot_run_code(tmp_path):
    """Checkpoints load with ``weights_only``: a pickle that would run a command on load is
    treated as foreign (the trial trains from scratch) and its code never runs."""
    import pickle

    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    path = tmp_path / "ck" / "base-seed1.pt"
    path.parent.mkdir()
    path.write_bytes(pickle.dumps({"signature": "sig", "epoch": 1, "payload": Payload()}))
    assert Checkpoint(path, signature="sig").load() is None
    assert not marker.exists()
    pickle.loads(path.read_bytes())  # the file is live: loaded unsafely, it does run
    assert marker.exists()

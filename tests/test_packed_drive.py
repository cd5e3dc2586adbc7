"""Packed trials through the driver (`train.pack`): a study trained in packs records every trial
as the study trained one trial at a time does — its own MLflow run, metrics, curves and Optuna
trial — and a worker SIGKILLed mid-pack resumes each member from its own checkpoint."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
import torch
from mlflow import MlflowClient

from ablate.drive.ledger import fingerprint
from ablate.drive.packing import PACK_TAG, pack_size
from ablate.faults import KILL_ENV
from ablate.study.load import load_study
from ablate.training.trainer import CHECKPOINT_ENV

# One torch thread: packed members take turns, bit for bit the trials alone at one thread.
PATCH = {
    "train": {"epochs": 4, "patience": 10, "threads": 1},
    "model": {"dropout": 0.3},
    "seeds": [0, 1, 2],
    "report": {"calibration": 0, "bootstrap": 200},
}
KEYS = ("test.ndcg_at_10", "test.hr_at_10", "valid.ndcg_at_10", "best_epoch", "epochs")


def _run(study, tmp_path, label, cli=None, env=None, expect=0):
    """``ablate run`` on ``study``: in this process through ``cli``, or with ``env`` in its own
    (the killed run)."""
    args = ["run", str(study), "--quiet", "--reports", str(tmp_path / f"reports-{label}")]
    if cli is not None:
        code, _, err = cli(*args)
        assert code == expect, err[-2000:]
        return
    proc = subprocess.run(
        [sys.executable, "-m", "ablate.commands.cli", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == expect, proc.stderr[-2000:]


def _trials(folder):
    client = MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")
    exp = client.get_experiment_by_name("tiny")
    runs = client.search_runs(
        [exp.experiment_id], "tags.`ablate.role` = 'trial' and attributes.status = 'FINISHED'"
    )
    return client, {(r.data.tags["variant"], int(r.data.tags["seed"])): r for r in runs}


def test_pack_size_follows_train_pack(write_study):
    study = load_study(write_study({"train": {"pack": "off"}}))
    assert pack_size(study, torch.device("cuda"), lambda: 8) == 1
    study = load_study(write_study({"train": {"pack": 3}}))
    assert pack_size(study, torch.device("cuda"), lambda: 8) == 3
    study = load_study(write_study({}))  # auto: measured on a GPU, alone on the CPU
    assert pack_size(study, torch.device("cuda"), lambda: 8) == 8
    assert pack_size(study, torch.device("cpu"), lambda: 8) == pack_size(study, torch.device("cuda")) == 1


def test_auto_asks_the_measurement_once_per_variant_and_packs_that_many(
    cli, write_study, tmp_path, monkeypatch
):
    """The driver's side of ``train.pack: auto`` on a GPU (the device check let through here):
    each variant measured once, for as many seeds as it plans; its trials packed that many at a
    time, each recorded as alone."""
    import ablate.drive.execution as execution
    from ablate.training.packsize import Timing

    asked = []

    def measured(study, variant, data, device, most):
        asked.append((variant.name, most))
        return 2, [Timing(1, 0.010, 0.0), Timing(2, 0.012, 0.0)]

    real = execution.pack_size
    monkeypatch.setattr(
        execution, "pack_size", lambda study, _device, measure: real(study, torch.device("cuda"), measure)
    )
    monkeypatch.setattr(execution, "measure_pack_size", measured)
    monkeypatch.chdir(tmp_path)
    study = write_study({**PATCH, "train": {"epochs": 2, "threads": 1}})
    code, _, err = cli("run", str(study), "--quiet")
    assert code == 0, err[-2000:]
    assert sorted(asked) == [("base", 3), ("mlp", 3)]
    assert "train.pack auto: base's seeds 2 a pack (member-steps/s 100 at 1, 167 at 2)" in err
    _, runs = _trials(tmp_path / "runs" / "tiny")
    packs = sorted(run.data.tags[PACK_TAG] for run in runs.values() if PACK_TAG in run.data.tags)
    assert packs == ["0,1", "0,1", "0,1", "0,1"], packs  # seed 2 of each variant alone


def test_pack_is_left_out_of_fingerprints(write_study):
    """How trials are scheduled is not what they train: a study may switch packing and resume."""
    prints = {fingerprint(load_study(write_study({"train": {"pack": p}})), "mlp") for p in ("auto", "off", 3)}
    assert len(prints) == 1


def test_a_bad_pack_is_one_line(cli, write_study):
    code, _, err = cli("validate", write_study({"train": {"pack": 0}}))
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "train.pack" in err and "expected auto, off or a number of trials ≥ 1, got 0" in err


@pytest.mark.heavy
def test_packed_study_records_each_trial_as_alone_and_resumes_after_kill(
    write_study, tmp_path, cli, monkeypatch
):
    monkeypatch.setenv(CHECKPOINT_ENV, "0")
    env = {**os.environ, CHECKPOINT_ENV: "0"}
    found = {}
    for label, pack, kill in (("alone", "off", None), ("killed", 3, "train@7")):
        patch = {**PATCH, "name": "tiny", "output": str(tmp_path / label)}
        patch["train"] = {**PATCH["train"], "pack": pack}
        study = write_study(patch, name=f"{label}.yaml")
        if kill:  # after member epochs 1-2 of all three and epoch 3 of the first: mid-pack
            _run(study, tmp_path, label, env={**env, KILL_ENV: kill}, expect=-signal.SIGKILL)
            saved = sorted(p.name for p in (tmp_path / label / "checkpoints").glob("*.pt"))
            assert saved == ["base-seed0.pt", "base-seed1.pt", "base-seed2.pt"], saved
        _run(study, tmp_path, label, cli)  # the whole run, or the killed one's resumption
        assert not list((tmp_path / label / "checkpoints").glob("*.pt"))
        found[label] = _trials(tmp_path / label)
    _, alone = found["alone"]
    for label in ("killed",):
        client, runs = found[label]
        assert sorted(runs) == sorted(alone) and len(runs) == 6
        for key, run in runs.items():
            assert run.data.tags[PACK_TAG] == "0,1,2"
            for metric in KEYS:
                assert run.data.metrics[metric] == alone[key].data.metrics[metric], (label, key, metric)
            curve = client.get_metric_history(run.info.run_id, "train.loss")
            assert sorted(m.step for m in curve) == [1, 2, 3, 4]
            whole = found["alone"][0].get_metric_history(alone[key].info.run_id, "train.loss")
            assert sorted((m.step, m.value) for m in curve) == sorted((m.step, m.value) for m in whole)
    assert PACK_TAG not in next(iter(alone.values())).data.tags
    resumed = {k for k, r in found["killed"][1].items() if "ablate.resumed_from_epoch" in r.data.tags}
    assert resumed == {("base", 0), ("base", 1), ("base", 2)}

"""Which precision each trial trained in: `train.precision: auto` is bf16 on CUDA and fp32 on the
CPU under one fingerprint, so every trial records what it resolved to, its trial file carries it,
and a report over trials of both precisions (a study continued on another device, or trial files
reused from one) says so instead of mixing them silently."""

from __future__ import annotations

import gzip
import json

import pandas as pd
import torch
import yaml
from tiny_study import tiny_spec

import ablate
from ablate.drive import write_trials
from ablate.drive.ledger import fingerprint, fingerprints
from ablate.drive.reuse import TRIAL_SUFFIX
from ablate.report.write import precision_warnings
from ablate.study.load import load_study
from ablate.tracking.results import load_results
from ablate.training.trainer import PRECISION_TAG, precision_name

FAST_REPORT = {"calibration": 0, "bootstrap": 200}  # the report's statistics are not under test


def test_auto_resolves_by_device():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert [precision_name(p, cpu) for p in ("auto", "fp32", "bf16")] == ["fp32", "fp32", "bf16"]
    assert [precision_name(p, cuda) for p in ("auto", "fp32", "bf16")] == ["bf16", "fp32", "bf16"]


def test_auto_counts_trials_with_the_precision_written_out(tmp_path):
    """`auto` trains in fp32 or bf16 by device, so a trial trained with either written out (fp32 on a
    GPU machine, continuing a CPU study) counts for an auto study; a study that writes one counts
    only its own, never auto's nor the other's."""
    studies = {}
    for written in ("auto", "fp32", "bf16"):
        spec = tiny_spec({"name": f"p-{written}", "train": {"precision": written}})
        (tmp_path / f"{written}.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
        studies[written] = load_study(tmp_path / f"{written}.yaml")
    own = {p: fingerprint(s, "base") for p, s in studies.items()}
    assert len(set(own.values())) == 3
    assert fingerprints(studies["auto"], "base")[:3] == (own["auto"], own["fp32"], own["bf16"])
    for written in ("fp32", "bf16"):
        accepted = fingerprints(studies[written], "base")
        assert own[written] in accepted and not {
            own["auto"],
            own[{"fp32": "bf16", "bf16": "fp32"}[written]],
        } & set(accepted)


def test_one_precision_or_none_recorded_warns_of_nothing():
    rows = pd.DataFrame({"variant": ["base", "mlp"], "seed": [0, 0]})
    assert precision_warnings(rows) == []  # trials from before the tag: unknown, nothing said
    assert precision_warnings(rows.assign(precision="fp32")) == []


def test_recorded_carried_and_a_mixed_report_says_so(tmp_path):
    spec = tiny_spec({"name": "donor", "report": FAST_REPORT, "seeds": [0, 1, 2]})
    spec["output"] = str(tmp_path / "runs" / "donor")
    (tmp_path / "donor.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    ablate.run(tmp_path / "donor.yaml", quiet=True)
    uri = f"sqlite:///{tmp_path / 'runs/donor/mlflow.db'}"
    results = load_results(uri, "donor").results
    assert set(results["precision"]) == {"fp32"}  # auto on the CPU
    report = (tmp_path / "runs/donor/report/report.md").read_text()
    assert "more than one precision" not in report

    # Written out, each trial file carries it; one of them as if trained on a GPU under `auto`.
    write_trials(uri, "donor", tmp_path / "kept")
    files = sorted((tmp_path / "kept").glob(f"*{TRIAL_SUFFIX}"))
    records = [json.loads(gzip.decompress(p.read_bytes())) for p in files]
    assert len(files) == 6 and {r["tags"][PRECISION_TAG] for r in records} == {"fp32"}
    moved = next(i for i, r in enumerate(records) if r["variant"] == "mlp" and r["seed"] == 2)
    records[moved]["tags"][PRECISION_TAG] = "bf16"
    files[moved].write_bytes(gzip.compress(json.dumps(records[moved]).encode()))

    # Reused into a fresh store: the record comes along, and the report warns.
    spec = {**spec, "name": "taker", "output": str(tmp_path / "runs" / "taker")}
    (tmp_path / "taker.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    ablate.run(tmp_path / "taker.yaml", quiet=True, reuse=[tmp_path / "kept"])
    taken = load_results(f"sqlite:///{tmp_path / 'runs/taker/mlflow.db'}", "taker").results
    assert taken["reused_from"].notna().all()
    assert taken.set_index(["variant", "seed"])["precision"].to_dict()[("mlp", 2)] == "bf16"
    report = (tmp_path / "runs/taker/report/report.md").read_text()
    said = "the trials trained in more than one precision: bf16 (mlp seeds 2), fp32 (base seeds 0, 1, 2, "
    assert f"{said}mlp seeds 0, 1); `train.precision: auto` is bf16 on CUDA" in report

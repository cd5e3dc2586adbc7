"""`ablate run --reuse DIR`: finished trials of another study's store with the same fingerprint
and seed are copied, not trained again; everything else trains as usual."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pandas as pd
import pytest

from ablate.results import load_results

FAST_REPORT = {"calibration": 0, "bootstrap": 200}  # the report's statistics are not under test


def _donor(write_study, cli, tmp_path):
    """A finished two-variant study (base, mlp × seeds 0, 1) in runs/donor."""
    study = write_study({"name": "donor", "report": FAST_REPORT}, name="donor.yaml")
    code, _, err = cli("run", study, "--quiet")
    assert code == 0, err
    out = tmp_path / "runs" / "donor"
    return out, load_results(f"sqlite:///{out / 'mlflow.db'}", "donor")


def _by_key(frame: pd.DataFrame) -> dict:
    return {(r["variant"], r["seed"]): r for r in frame.to_dict("records")}


def test_reused_trials_carry_the_donors_numbers_curves_and_units(write_study, cli, tmp_path):
    donor_dir, donor = _donor(write_study, cli, tmp_path)
    # The same base and mlp, one more variant, one more seed: 4 trials to copy, 5 to train.
    taker = write_study(
        {
            "name": "taker",
            "variants": {"post-norm": {"norm": {"placement": "post"}}},
            "seeds": [0, 1, 2],
            "report": FAST_REPORT,
        },
        name="taker.yaml",
    )
    code, _, err = cli("run", taker, "--quiet", "--reuse", donor_dir)
    assert code == 0, err
    assert "reused: 4 of the study's trials were copied from other studies' stores" in err
    got = load_results(f"sqlite:///{tmp_path / 'runs/taker/mlflow.db'}", "taker")

    rows = _by_key(got.results)
    assert len(rows) == 9
    copied = {key for key, row in rows.items() if isinstance(row["reused_from"], str)}
    assert copied == {(v, s) for v in ("base", "mlp") for s in (0, 1)}
    before = _by_key(donor.results)
    metrics = [c for c in donor.results if c.startswith(("test.", "valid."))] + ["epochs", "best_epoch"]
    for key in copied:
        assert rows[key]["reused_from"].startswith(f"donor in sqlite:///{donor_dir.resolve()}")
        assert rows[key]["reused_from"].endswith(f"run {before[key]['run_id']}")
        assert rows[key]["run_id"] != before[key]["run_id"]  # a run of the taker's own
        for column in metrics:
            assert rows[key][column] == before[key][column], (key, column)

    def select(frame, keys):
        picked = frame[[(v, s) in keys for v, s in zip(frame["variant"], frame["seed"], strict=True)]]
        return picked.sort_values(list(picked.columns[:3])).reset_index(drop=True)

    pd.testing.assert_frame_equal(select(got.units, copied), select(donor.units, copied))
    curves = ["variant", "seed", "epoch", "metric"]
    pd.testing.assert_frame_equal(
        select(got.curves, copied).sort_values(curves).reset_index(drop=True),
        select(donor.curves, copied).sort_values(curves).reset_index(drop=True),
    )
    # The report says which trials were copied and from where.
    report = (tmp_path / "runs" / "taker" / "report" / "report.md").read_text()
    assert "4 trial(s) were not trained in this study but copied from another study's store" in report
    assert "base seed 0, base seed 1, mlp seed 0, mlp seed 1 from donor in sqlite:///" in report


def test_a_trial_trained_differently_is_not_reused(write_study, cli, tmp_path):
    donor_dir, _ = _donor(write_study, cli, tmp_path)
    taker = write_study({"name": "taker", "report": FAST_REPORT, "train": {"lr": 0.002}}, name="taker.yaml")
    code, _, err = cli("run", taker, "--quiet", "--reuse", donor_dir)
    assert code == 0, err
    assert "reused:" not in err
    got = load_results(f"sqlite:///{tmp_path / 'runs/taker/mlflow.db'}", "taker")
    assert len(got.results) == 4 and "reused_from" not in got.results


def test_a_donor_that_cannot_be_read_whole_is_trained_instead(write_study, cli, tmp_path):
    """Its per-unit results are gone (artifacts deleted): a warning, the trial trains, nothing of
    the donor is half-copied."""
    donor_dir, donor = _donor(write_study, cli, tmp_path)
    shutil.rmtree(donor_dir / "artifacts")
    taker = write_study({"name": "taker", "report": FAST_REPORT, "seeds": [0]}, name="taker.yaml")
    code, _, err = cli("run", taker, "--quiet", "--reuse", donor_dir)
    assert code == 0, err
    warned = [
        line for line in err.splitlines() if line.startswith("warning: not reused (donor in sqlite:///")
    ]
    assert len(warned) == 2 and all(line.endswith("; training it instead") for line in warned)
    got = load_results(f"sqlite:///{tmp_path / 'runs/taker/mlflow.db'}", "taker")
    assert len(got.results) == 2 and "reused_from" not in got.results
    # trained here: one curve point per epoch and metric, as any trained trial has
    assert not got.curves.duplicated(["variant", "seed", "epoch", "metric"]).any()


def test_workers_reuse_too(write_study, cli, tmp_path):
    """`--workers 2` hands --reuse to its worker processes: a rerun of the donor under another
    name trains nothing."""
    donor_dir, donor = _donor(write_study, cli, tmp_path)
    taker = write_study({"name": "taker", "report": FAST_REPORT}, name="taker.yaml")
    run = subprocess.run(
        [sys.executable, "-m", "ablate.cli", "run", str(taker), "--workers", "2", "--reuse", str(donor_dir)],
        cwd=tmp_path,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr
    got = load_results(f"sqlite:///{tmp_path / 'runs/taker/mlflow.db'}", "taker")
    assert got.results["reused_from"].notna().all() and len(got.results) == 4
    assert sorted(got.results["test.ndcg@10"]) == sorted(donor.results["test.ndcg@10"])


@pytest.mark.parametrize("where", ["nothing-here", "empty"])
def test_a_reuse_folder_without_a_store_is_one_line(write_study, cli, tmp_path, where):
    (tmp_path / "empty").mkdir()
    study = write_study({"report": FAST_REPORT})
    code, _, err = cli("run", study, "--reuse", tmp_path / where)
    assert code == 2
    said = f"error: --reuse {tmp_path / where}: no finished study there (no mlflow.db in that folder)"
    assert err.strip() == said
    assert not (tmp_path / "runs" / "tiny" / "mlflow.db").exists()  # refused before anything ran

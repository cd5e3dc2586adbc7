"""`ablate run --reuse DIR`: finished trials of another study's store with the same fingerprint
and seed are copied, not trained again; everything else trains as usual."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys

import pandas as pd
import pytest
import yaml
from mlflow import MlflowClient
from tiny_study import tiny_spec

import ablate
from ablate.drive import Stores, progress
from ablate.drive.ledger import fingerprint_of
from ablate.drive.reuse import TRIAL_SUFFIX
from ablate.study.load import load_study
from ablate.tracking.results import load_results

COUNTS = ("epochs", "best_epoch", "params")
FAST_REPORT = {"calibration": 0, "bootstrap": 200}  # the report's statistics are not under test


@pytest.fixture(scope="module")
def trained_donor(tmp_path_factory):
    """A finished two-variant study (base, mlp × seeds 0, 1), trained once for the module: a
    folder holding donor.yaml and its output folder runs/donor."""
    folder = tmp_path_factory.mktemp("donor")
    spec = tiny_spec({"name": "donor", "report": FAST_REPORT})
    spec["output"] = str(folder / "runs" / "donor")
    (folder / "donor.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    ablate.run(folder / "donor.yaml", quiet=True)
    return folder


@pytest.fixture
def donor(trained_donor, tmp_path, copy_runs):
    """This test's own copy of the donor in tmp_path (donor.yaml, runs/donor), which it may change;
    returns the output folder and the donor's results."""
    copy_runs(trained_donor, tmp_path)
    out = tmp_path / "runs" / "donor"
    return out, load_results(f"sqlite:///{out / 'mlflow.db'}", "donor")


def _by_key(frame: pd.DataFrame) -> dict:
    return {(r["variant"], r["seed"]): r for r in frame.to_dict("records")}


def test_reused_trials_carry_the_donors_numbers_curves_and_units(donor, write_study, cli, tmp_path):
    donor_dir, donor = donor
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
    # The donors' conditions as another machine's: a copy carries its donor's, not this process's;
    # one donor without a recorded CPU (an older record) leaves its copy without one.
    donor_store = MlflowClient(f"sqlite:///{donor_dir / 'mlflow.db'}")
    donor_runs = {
        (v, int(s)): run_id
        for v, s, run_id in zip(*(donor.results[c] for c in ("variant", "seed", "run_id")), strict=True)
    }
    for run_id in donor_runs.values():
        donor_store.set_tag(run_id, "ablate.env.threads", "64 / 64")
    donor_store.delete_tag(donor_runs[("mlp", 1)], "ablate.env.cpu")
    code, _, err = cli("run", taker, "--quiet", "--reuse", donor_dir)
    assert code == 0, err
    assert "reused: 4 of the study's trials were copied, not trained" in err
    taker_store = MlflowClient(f"sqlite:///{tmp_path / 'runs/taker/mlflow.db'}")
    got = load_results(f"sqlite:///{tmp_path / 'runs/taker/mlflow.db'}", "taker")
    # The ETA reads the wall times of trials trained here, not the donors' (another machine's).
    study = load_study(taker)
    rows = progress(study, Stores.for_study(study))
    walls = {v: (len(r.walls), len(r.copied_walls)) for v, r in rows.items()}
    assert walls == {"base": (1, 2), "mlp": (1, 2), "post-norm": (3, 0)}

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
        own = taker_store.get_run(rows[key]["run_id"]).data.tags
        theirs = donor_store.get_run(before[key]["run_id"]).data.tags
        conditions = {k: v for k, v in own.items() if k.startswith("ablate.env.")}
        assert conditions == {k: v for k, v in theirs.items() if k.startswith("ablate.env.")}, key
        assert conditions["ablate.env.threads"] == "64 / 64" and ("ablate.env.cpu" in conditions) == (
            key != ("mlp", 1)
        )
    trained = taker_store.get_run(rows[("post-norm", 0)]["run_id"]).data.tags
    assert trained["ablate.env.threads"] != "64 / 64" and "ablate.env.cpu" in trained  # its own

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
    assert "4 trial(s) were copied, not trained in this study (ablate run --reuse)" in report
    assert "base seed 0, base seed 1, mlp seed 0, mlp seed 1 from donor in sqlite:///" in report
    # ... and the conditions they trained under, as their donors recorded them: 3 with a CPU, 1 without.
    assert "The copied trials' conditions, as their sources recorded them:" in report
    groups = [line for line in report.splitlines() if line.startswith("- ") and " trial(s): " in line]
    assert [line.split(" trial(s)")[0] for line in groups] == ["- 3", "- 1"], groups
    assert all("threads (intra-op / inter-op): 64 / 64" in line for line in groups)
    assert "CPU: " in groups[0] and "CPU: " not in groups[1]


def test_a_trial_trained_differently_is_not_reused(donor, write_study, cli, tmp_path):
    """Another learning rate is another fingerprint: trained, through the Python API's ``reuse``
    (which the donor's own settings, passed the same way, do reuse)."""
    donor_dir, _ = donor
    taker = write_study({"name": "taker", "report": FAST_REPORT}, name="taker.yaml")
    got = ablate.run(taker, {"train.lr": 0.002, "seeds": [0]}, reuse=[donor_dir], quiet=True)
    assert len(got.results) == 2 and "reused_from" not in got.results
    same = tmp_path / "runs" / "same"
    again = ablate.run(taker, {"seeds": [0]}, output=same, reuse=[donor_dir], quiet=True)
    assert len(again.results) == 2 and again.results["reused_from"].notna().all()


def test_a_donor_that_cannot_be_read_whole_is_trained_instead(donor, write_study, cli, tmp_path):
    """Its per-unit results are gone (artifacts deleted): a warning, the trial trains, nothing of
    the donor is half-copied."""
    donor_dir, donor = donor
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


@pytest.mark.heavy
def test_trial_files_outlive_the_store(donor, write_study, cli, tmp_path, monkeypatch):
    """`ablate report --trials DIR` writes one file per finished trial; with the donor's store gone
    (a lost machine), `--reuse DIR` brings every number back exactly; a copy's file names the run
    that trained it."""
    donor_dir, donor = donor
    donor_study = tmp_path / "donor.yaml"
    code, _, err = cli("report", donor_study, "--trials", tmp_path / "kept")
    assert code == 0 and "trials: 4 file(s) in" in err, err
    files = sorted(p.name for p in (tmp_path / "kept").iterdir())
    assert len(files) == 4 and all(f.endswith(TRIAL_SUFFIX) for f in files)
    kept = [tuple(f.split("-")[:2]) for f in files]
    assert kept == [("base", "seed0"), ("base", "seed1"), ("mlp", "seed0"), ("mlp", "seed1")]
    written = {p.name: p.read_bytes() for p in (tmp_path / "kept").iterdir()}
    for content in written.values():  # each record keeps the settings its fingerprint hashes
        record = json.loads(gzip.decompress(content))
        assert fingerprint_of(record["trained_with"]) == record["fingerprint"]
        # ... and the conditions it trained under, as its run recorded them
        tags = MlflowClient(f"sqlite:///{donor_dir / 'mlflow.db'}").get_run(record["run_id"]).data.tags
        conditions = {k: v for k, v in tags.items() if k.startswith("ablate.env.")}
        assert "ablate.env.torch" in conditions
        assert {k: v for k, v in record["tags"].items() if k.startswith("ablate.env.")} == conditions
    code, _, err = cli("report", donor_study, "--trials", tmp_path / "kept")  # again: the same bytes
    assert code == 0 and written == {p.name: p.read_bytes() for p in (tmp_path / "kept").iterdir()}, err
    shutil.rmtree(donor_dir)

    taker = write_study({"name": "taker", "report": FAST_REPORT}, name="taker.yaml")
    monkeypatch.chdir(tmp_path)  # a report names a folder below the working folder relative to it
    code, _, err = cli("run", taker, "--quiet", "--reuse", tmp_path / "kept")
    assert code == 0 and "reused: 4 of the study's trials" in err, err
    got = load_results(f"sqlite:///{tmp_path / 'runs/taker/mlflow.db'}", "taker")
    before, after = _by_key(donor.results), _by_key(got.results)
    for key, row in before.items():
        assert after[key]["reused_from"] == f"donor in kept, run {row['run_id']}"
        for column, value in row.items():
            if column.startswith(("test.", "valid.", "component.")) or column in COUNTS:
                assert after[key][column] == value, (key, column)
    order = list(donor.units.columns[:3])  # variant, seed, the unit's id
    pd.testing.assert_frame_equal(
        got.units.sort_values(order).reset_index(drop=True),
        donor.units.sort_values(order).reset_index(drop=True),
        check_dtype=False,
    )
    curves = ["variant", "seed", "epoch", "metric"]
    pd.testing.assert_frame_equal(
        got.curves.sort_values(curves).reset_index(drop=True),
        donor.curves.sort_values(curves).reset_index(drop=True),
    )
    # Written back into the donors' own folder, the copies leave the donors' files as they were,
    # one filed under another variant name (a donor study's own name for the model) included.
    renamed = next((tmp_path / "kept").glob("base-seed0-*"))
    renamed.rename(renamed.with_name(renamed.name.replace("base-", "full-model-", 1)))
    before_write = {p.name: p.read_bytes() for p in (tmp_path / "kept").iterdir()}
    code, _, err = cli("report", taker, "--trials", tmp_path / "kept")
    assert code == 0 and "trials: 0 file(s) in" in err and "(4 left as they were: " in err, err
    assert before_write == {p.name: p.read_bytes() for p in (tmp_path / "kept").iterdir()}
    assert sorted(before_write.values()) == sorted(written.values())
    # Written again from the taker's store, a file still names the donor's run as where it trained.
    code, _, err = cli("report", taker, "--trials", tmp_path / "again")
    assert code == 0, err
    with gzip.open(next((tmp_path / "again").glob(f"base-seed0-*{TRIAL_SUFFIX}")), "rt") as handle:
        record = json.load(handle)
    assert record["study"] == "taker" and record["trained_in"].startswith("donor in ")
    assert record["trained_in"].endswith(f"run {before[('base', 0)]['run_id']}")


def test_a_record_whose_settings_were_altered_is_trained_instead(donor, write_study, cli, tmp_path):
    """A trial file whose settings were edited under the fingerprint its name keeps (base seed 0:
    two heads) and a store's trial run whose kept settings were edited (mlp seed 0: another width)
    are refused in one line each, the search going on to the next place: base is copied from the
    store, where it is intact, and mlp, found nowhere else, is trained."""
    donor_dir, donor = donor
    code, _, err = cli("report", tmp_path / "donor.yaml", "--trials", tmp_path / "kept")
    assert code == 0, err
    (path,) = (tmp_path / "kept").glob(f"base-seed0-*{TRIAL_SUFFIX}")
    record = json.loads(gzip.decompress(path.read_bytes()))
    record["trained_with"]["model"]["attention"][0]["options"]["heads"] = 2
    path.write_bytes(gzip.compress(json.dumps(record).encode()))
    next((tmp_path / "kept").glob(f"mlp-seed0-*{TRIAL_SUFFIX}")).unlink()
    runs = donor.results.set_index(["variant", "seed"])["run_id"]
    (kept,) = (donor_dir / "artifacts").rglob(f"{runs[('mlp', 0)]}/artifacts/trained_with.json")
    kept.write_text(kept.read_text().replace('"dim": 16', '"dim": 24'))

    taker = write_study({"name": "taker", "report": FAST_REPORT, "seeds": [0]}, name="taker.yaml")
    code, _, err = cli("run", taker, "--quiet", "--reuse", tmp_path / "kept", "--reuse", donor_dir)
    assert code == 0, err
    warned = [line for line in err.splitlines() if line.startswith("warning: not reused")]
    assert len(warned) == 2 and all("its own settings hash to " in line for line in warned), err
    assert "(model.attention.0.options.heads 2 there, 1 here)" in warned[0]
    assert "(model.dim 24 there, 16 here)" in warned[1]
    assert all(line.endswith("; training it instead") for line in warned)
    got = load_results(f"sqlite:///{tmp_path / 'runs/taker/mlflow.db'}", "taker").results.set_index("variant")
    assert got.loc["base", "reused_from"].endswith(f"run {runs[('base', 0)]}")  # from the store
    assert pd.isna(got.loc["mlp", "reused_from"])  # trained


def test_a_trials_folder_that_cannot_be_written_is_one_line(donor, cli, tmp_path):
    (tmp_path / "a-file").write_text("")
    code, _, err = cli("report", tmp_path / "donor.yaml", "--trials", tmp_path / "a-file" / "kept")
    assert (
        code == 2
        and err.startswith(f"error: --trials {tmp_path / 'a-file' / 'kept'}: ")
        and len(err.splitlines()) == 1
    )


@pytest.mark.heavy
def test_workers_reuse_too(donor, write_study, cli, tmp_path):
    """`--workers 2` hands --reuse to its worker processes: a rerun of the donor under another
    name trains nothing."""
    donor_dir, donor = donor
    taker = write_study({"name": "taker", "report": FAST_REPORT}, name="taker.yaml")
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "ablate.commands.cli",
            "run",
            str(taker),
            "--workers",
            "2",
            "--reuse",
            str(donor_dir),
        ],
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
    said = f"no finished trials there (no mlflow.db, no *{TRIAL_SUFFIX} files)"
    assert err.strip() == f"error: --reuse {tmp_path / where}: {said}"
    assert not (tmp_path / "runs" / "tiny" / "mlflow.db").exists()  # refused before anything ran

"""Each configuration of a study file in its own place: overrides that change what a trial trains
name a study of their own (its output folder, MLflow experiment and Optuna queue), so a run with
overrides never meets the study file's own trials; `report` and `status` given the file without
them say where its trials are."""

from __future__ import annotations

import pytest
import yaml

from ablate.study.load import load_study
from ablate.study.overrides import changes_training, command_line, configuration_name

FAST_REPORT = {"report": {"calibration": 0, "bootstrap": 200}}  # the statistics are not under test


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ([], "q"),
        (["seeds=[0,1]", "report.alpha=0.1", "~variants.mlp", "slurm.time=10"], "q"),  # same trials
        (["train.epochs=2"], "q.epochs_2"),
        (["train.lr=1e-3", "seeds=[0]"], "q.lr_0.001"),
        (["train.lr=0.001"], "q.lr_0.001"),  # the value, not how it is spelt
        (["model.attention.kind=pointwise", "train.betas=[0.9, 0.98]"], "q.kind_pointwise.betas_0.9_0.98"),
        (["variants.wide.ffn.mult=8"], "q.mult_8"),
        (["~model.final_norm"], "q.no_final_norm"),
        (["task.data=beauty"], "q.data_beauty"),
        (["task.data=[beauty, sports]"], "q"),  # several data sets: each its own study already
    ],
)
def test_a_configuration_is_named_for_what_changes_its_trials(overrides, named):
    assert configuration_name("q", overrides) == named
    assert any(map(changes_training, overrides)) == (named != "q")


def test_a_long_configuration_name_ends_in_a_digest():
    many = [f"model.config.k{i}=value{i}" for i in range(20)]
    named = configuration_name("q", many)
    assert len(named) <= 100 and named.startswith("q.") and named != configuration_name("q", many[:-1])


def test_overrides_give_the_study_its_own_name_and_folder(write_study, tmp_path):
    path = write_study()
    study = load_study(path, overrides=["train.epochs=2"])
    assert study.name == "tiny.epochs_2"
    assert study.output_dir() == (tmp_path / "runs" / "tiny.epochs_2").resolve()
    named = load_study(path, overrides=["train.epochs=2", "name=mine", "output=elsewhere"])
    assert named.name == "mine" and named.output_dir().name == "elsewhere"  # given: as given


def test_a_sweep_with_only_runs_each_point(write_study, cli):
    """`--only` adds its deletions after a sweep's name: each point still finds its name (it was
    an IndexError), and `--print-config` prints one YAML document per point."""
    path = write_study({"variants": {"wide": {"ffn": {"kind": "mlp", "mult": 4}}}})
    points = command_line(path, ["train.lr=1e-3,3e-3"], only="mlp")
    assert [p[1] for p in points] == ["name=tiny.lr_0.001", "name=tiny.lr_0.003"]
    assert all(p[-1] == "~variants.wide" for p in points)
    code, out, err = cli("run", path, "train.lr=1e-3,3e-3", "--only", "mlp", "--print-config")
    assert code == 0, err
    documents = list(yaml.safe_load_all(out))
    assert [d["name"] for d in documents] == ["tiny.lr_0.001", "tiny.lr_0.003"]
    assert all(list(d["variants"]) == ["mlp"] for d in documents)


@pytest.mark.heavy
def test_report_and_status_without_the_overrides_say_where_the_trials_are(write_study, cli):
    path = write_study({"train": {"epochs": 1}, "seeds": [0], **FAST_REPORT}, replace={"variants": {}})
    code, _, err = cli("run", path, "train.lr=1e-3", "--quiet")
    assert code == 0, err
    code, _, err = cli("report", path)
    assert code == 2
    assert "tiny: no trials in" in err and "tiny.lr_0.001" in err
    assert f"`ablate report {path} train.lr=1e-3`" in err.replace("\n", "")
    code, out, _ = cli("status", path)
    assert code == 0 and "not started" in out and "tiny.lr_0.001" in out
    code, out, err = cli("report", path, "train.lr=1e-3")
    assert code == 0, err
    code, out, _ = cli("status", path, "train.lr=1e-3")
    assert "1/1 trials done" in out.replace("\n", " ") or "finished" in out

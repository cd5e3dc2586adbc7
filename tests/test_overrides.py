"""`key=value` overrides: applied to the study file's mapping before validation, validated like
the file, errors naming the override; on the command line and through `ablate.run`."""

from __future__ import annotations

import pytest
from mlflow import MlflowClient

import ablate
from ablate.errors import StudyError
from ablate.study.load import load_study
from ablate.study.overrides import apply_overrides, parse_overrides


def test_overrides_reach_the_validated_study(write_study):
    study = load_study(
        write_study(),
        overrides=[
            "train.lr=1e-3",
            "model.attention.heads=2",
            "seeds=[0,1,2,3]",
            "variants.mlp.ffn.mult=3",
            "variants.wide.ffn.kind=mlp",  # a new variant
            "train.loss.negatives=4",
        ],
    )
    assert study.spec.train.lr == 0.001 and study.spec.seed_list == [0, 1, 2, 3]
    assert study.variants["base"].attention.options.heads == 2
    assert study.variants["mlp"].attention.options.heads == 2  # variants patch the overridden base
    assert study.variants["mlp"].ffn.options.mult == 3.0
    assert study.variants["wide"].ffn.cls.kind_name() == "mlp"
    assert study.loss.root.negatives == 4
    assert study.overrides == (
        "train.lr=1e-3",
        "model.attention.heads=2",
        "seeds=[0,1,2,3]",
        "variants.mlp.ffn.mult=3",
        "variants.wide.ffn.kind=mlp",
        "train.loss.negatives=4",
    )


def test_values_are_yaml_and_the_last_override_wins():
    given = parse_overrides(
        ["a.b=1e-3", "a.c=[1, 2]", "a.d={x: 1}", "a.e=true", "a.f=null", "a.g=mlp", "a.b=2"]
    )
    raw = apply_overrides({"a": {"b": 0}, "z": 1}, given)
    assert raw == {"a": {"b": 2, "c": [1, 2], "d": {"x": 1}, "e": True, "f": None, "g": "mlp"}, "z": 1}
    assert parse_overrides(["x=1.5e3"])[0].value == 1500.0  # YAML 1.1 would keep "1.5e3" a string
    assert parse_overrides(["x='1e-3'"])[0].value == "1e-3"  # quoted: a string


@pytest.mark.parametrize(
    "override, message",
    [
        ("train.lr=abc", "override train.lr=abc: train.lr: Input should be a valid number"),
        ("train.lr=abc", "(got 'abc')"),
        ("train.lrr=1", "override train.lrr=1: train.lrr: unknown key"),
        (
            "model.attention.kind=sofmax",
            "override model.attention.kind=sofmax: model.attention.kind: unknown",
        ),
        ("seeds=[0,a]", "override seeds=[0,a]: seeds.1: Input should be a valid integer"),
        ("report.baseline=nope", "override report.baseline=nope: report.baseline: baseline 'nope' is not"),
        (
            "variants.mlp.ffn.mult=-1",
            "override variants.mlp.ffn.mult=-1: variants.mlp.ffn.mult: Input should",
        ),
        ("train.lr.x=1", "override train.lr.x=1: train.lr holds the value 0.003, not a mapping of keys"),
        ("seeds.0=1", "override seeds.0=1: seeds holds a list, not a mapping of keys"),
        ("train.lr", "override train.lr: expected key=value"),
        ("train..lr=1", "override train..lr=1: expected key=value"),
        ("seeds=[0,1", "override seeds=[0,1: the value is not valid YAML"),
    ],
)
def test_a_bad_override_is_named_in_one_line(write_study, cli, override, message):
    path = write_study()
    with pytest.raises(StudyError) as caught:
        load_study(path, overrides=[override])
    assert message in str(caught.value) and str(path) not in str(caught.value)
    code, out, err = cli("validate", path, override)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert err.startswith(f"error: override {override}:"), err


def test_problems_of_the_file_itself_still_name_its_line(write_study):
    path = write_study(text=write_study().read_text().replace("lr: 0.003", "lr: abc"))
    with pytest.raises(StudyError, match=rf"^{path}:\d+: train.lr: Input should be a valid number"):
        load_study(path, overrides=["model.attention.heads=2"])


def test_validate_report_and_status_take_overrides(write_study, cli):
    path = write_study()
    code, out, _ = cli("validate", path, "seeds=[0,1,2]", "variants.gelu.ffn.kind=mlp")
    assert code == 0 and "3 variants × 3 seeds = 9 trials" in out
    code, out, _ = cli("status", path, "seeds=[0,1,2]")
    assert code == 0 and "6 trials planned" in out
    code, _, err = cli("report", path, "report.alpha=2")
    assert code == 2 and err.startswith("error: override report.alpha=2: report.alpha:"), err
    code, _, err = cli("run", path, "train.epochs=zero")
    assert code == 2 and err.startswith("error: override train.epochs=zero: train.epochs:"), err


def test_python_run_with_overrides_returns_the_results(write_study, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    path = write_study(replace={"variants": {}, "train.epochs": 1})
    results = ablate.run(path, {"train.lr": 0.001, "seeds": [0, 1]}, quiet=True)
    assert sorted(zip(results.results.variant, results.results.seed, strict=True)) == [
        ("base", 0),
        ("base", 1),
    ]
    assert set(results.units.columns) >= {"variant", "seed", "unit", "ndcg@10"}  # full=True's frames
    assert results.settings is not None and results.settings.primary == "ndcg@10"
    # As `ablate run` writes it: a study of its own, named for the override that changes training.
    assert (tmp_path / "runs" / "tiny.lr_0.001" / "report" / "report.html").is_file()
    # The trials trained with the overridden study.
    client = MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'tiny.lr_0.001' / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("tiny.lr_0.001").experiment_id])
    trials = [r for r in runs if r.data.tags.get("ablate.role") == "trial"]
    assert len(trials) == 2 and {r.data.params["train.lr"] for r in trials} == {"0.001"}
    # A loaded study with more overrides keeps its own; nothing is left to train.
    again = ablate.run(load_study(path, overrides=["train.lr=1e-3"]), ["seeds=[0,1]"], quiet=True)
    assert len(again.results) == 2
    assert capsys.readouterr().err == ""  # quiet: not even the resumed line


def test_an_override_that_breaks_a_shape_is_named(write_study):
    """A component refusing its settings is reported at the slot; the override that set an option
    inside it is the one named, and a combination with the file's settings names both."""
    with pytest.raises(StudyError, match=r"^override model.attention.heads=3: model.attention: softmax"):
        load_study(write_study(), overrides=["model.attention.heads=3"])
    path = write_study({"model": {"attention": {"heads": 4}}})
    with pytest.raises(StudyError) as exc:
        load_study(path, overrides=["model.dim=18"])
    message = str(exc.value)
    assert message.startswith(f"{path}:16: model.attention: softmax attention: model width dim=18")
    assert message.endswith("(with override model.dim=18)")
    with pytest.raises(StudyError, match=r"^override model.dim=1e9: model.dim: 1000000000 gives ≈"):
        load_study(write_study(), overrides=["model.dim=1e9"])
    with pytest.raises(
        StudyError, match=r"^override train.epochs=true: train.epochs: .*integer \(got True\)"
    ):
        load_study(write_study(), overrides=["train.epochs=true"])

"""Hydra's override grammar on ablate's study files: ``~key`` deletes, ``+key=value`` adds,
``++key=value`` sets either way, ``key=a,b`` sweeps (a study per value), ``--only`` runs a subset
of the variants, and ``--resolved`` / ``--print-config`` print the study as it would run."""

from __future__ import annotations

import pytest
import yaml

from ablate.errors import StudyError
from ablate.study.load import load_study
from ablate.study.overrides import apply_overrides, command_line, expand_sweeps, parse_overrides, sweep_values

RAW = {"name": "s", "train": {"lr": 0.1}, "variants": {"two-heads": {"a": 1}, "wide": {"b": 2}}}


def _apply(*texts: str) -> dict:
    return apply_overrides(RAW, parse_overrides(texts))


def test_delete_add_and_force():
    assert _apply("~variants.two-heads")["variants"] == {"wide": {"b": 2}}
    assert "lr" not in _apply("~train.lr=0.1")["train"]  # deleted where it holds that value
    with pytest.raises(StudyError, match=r"override ~train.lr=0.2: train.lr is 0.1, so it is kept"):
        _apply("~train.lr=0.2")
    with pytest.raises(StudyError, match=r"no variants.two-head to delete; did you mean two-heads\?"):
        _apply("~variants.two-head")
    assert _apply("+train.epochs=3")["train"] == {"lr": 0.1, "epochs": 3}
    with pytest.raises(
        StudyError, match=r"override \+train.lr=1: the study has train.lr already; train.lr=1"
    ):
        _apply("+train.lr=1")
    assert _apply("++train.lr=1e-3", "++train.epochs=2")["train"] == {"lr": 0.001, "epochs": 2}
    assert RAW["variants"]["two-heads"] == {"a": 1}  # the file's mapping is left as it was


def test_a_comma_outside_brackets_and_quotes_is_a_sweep():
    assert sweep_values("1e-3,3e-3") == ["1e-3", "3e-3"]
    assert (
        sweep_values("[0,1,2]") is None
        and sweep_values("'a,b'") is None
        and sweep_values("{a: 1, b: 2}") is None
    )
    with pytest.raises(StudyError, match=r"a comma sweep runs the study once per value"):
        parse_overrides(["train.lr=1e-3,3e-3"])
    points = expand_sweeps(["train.lr=1e-3,3e-3", "seeds=[0,1]", "model.dim=16,32"], "q")
    assert [p[-1] for p in points] == [
        "name=q.lr_0.001.dim_16",
        "name=q.lr_0.001.dim_32",
        "name=q.lr_0.003.dim_16",
        "name=q.lr_0.003.dim_32",
    ]
    assert points[1][:3] == ["train.lr=1e-3", "seeds=[0,1]", "model.dim=32"]
    assert expand_sweeps(["train.lr=1e-3"], "q") == [["train.lr=1e-3"]]


def test_sweep_points_and_only_reach_the_validated_study(write_study):
    path = write_study({"variants": {"wide": {"ffn": {"kind": "mlp", "mult": 4}}}})
    points = command_line(path, ["train.lr=1e-3,3e-3"], only="wide")
    assert len(points) == 2
    studies = [load_study(path, overrides=p) for p in points]
    assert [s.name for s in studies] == ["tiny.lr_0.001", "tiny.lr_0.003"]
    assert [s.spec.train.lr for s in studies] == [0.001, 0.003]
    assert all(list(s.variants) == ["base", "wide"] for s in studies)  # mlp left out, the baseline kept
    with pytest.raises(
        StudyError, match=r"--only wdie: not a named variant of the study file; did you mean wide\?"
    ):
        command_line(path, [], only="wdie")
    study = load_study(path, overrides=["~variants.mlp", "+train.patience=2"])
    assert list(study.variants) == ["base", "wide"] and study.spec.train.patience == 2


def test_validate_prints_the_resolved_study_and_run_prints_its_config(write_study, cli):
    path = write_study()
    code, out, err = cli("validate", str(path), "~variants.mlp", "train.epochs=5", "--resolved")
    assert code == 0, err
    head = out[: out.index("tiny.epochs_5: 1 variants")]  # the resolved study, then validate's table
    resolved = yaml.safe_load(head[: head.rindex("\n")])
    assert resolved["variants"] == {} and resolved["train"]["epochs"] == 5
    assert resolved["train"]["batch_size"] == 64 and "threads" in resolved["train"]  # defaults filled in
    code, out, err = cli("run", str(path), "+train.threads=1", "--print-config")
    assert code == 0, err
    assert yaml.safe_load(out)["train"]["threads"] == 1
    assert not (path.parent / "runs").exists()  # nothing trained, no store made

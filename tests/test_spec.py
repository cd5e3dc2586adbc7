"""Study-file validation: good files resolve, bad ones fail with one line and status 2."""

from __future__ import annotations

import textwrap

import pytest

from ablate.errors import DataError, StudyError
from ablate.spec import BASE
from ablate.study import load_study


def test_variants_patch_the_base(write_study):
    study = load_study(write_study({"variants": {
        "two-heads": {"attention": {"heads": 2}},
        "gelu": {"ffn": {"kind": "mlp", "activation": "gelu"}},
    }}))
    assert list(study.variants) == [BASE, "mlp", "two-heads", "gelu"]
    two = study.variants["two-heads"]
    assert two.attention.options.heads == 2
    assert two.ffn.cls.kind_name() == "pointwise"  # untouched slots keep the base's choice
    assert two.differs_from(study.variants[BASE]) == "attention: softmax(heads=2)"
    assert study.variants["gelu"].ffn.options.activation == "gelu"
    assert study.metrics == ["ndcg@10", "hr@10"]


def test_kind_change_replaces_component_options(write_study):
    # The base's softmax 'heads' option must not leak into a kind that lacks it.
    study = load_study(write_study({
        "model": {"ffn": {"kind": "mlp", "mult": 3}},
        "variants": {"back": {"ffn": {"kind": "pointwise"}}},
    }))
    assert study.variants["back"].ffn.cls.kind_name() == "pointwise"
    assert study.variants[BASE].ffn.options.mult == 3


def test_grid_is_factorial(write_study):
    study = load_study(write_study({"grid": {"attention.heads": [1, 2], "ffn.kind": ["pointwise", "mlp"]}},
                                   replace={"variants": {}}))
    grid = [v for v in study.variants if v != BASE]
    assert len(grid) == 4
    assert study.variants["attention.heads=2,ffn.kind=mlp"].attention.options.heads == 2
    assert study.variants["attention.heads=2,ffn.kind=mlp"].ffn.cls.kind_name() == "mlp"


def test_toml_is_accepted(write_study):
    text = textwrap.dedent("""
        name = "t"
        seeds = [0]
        [task]
        kind = "seqrec"
        data = {format = "synthetic", users = 50}
        [metrics]
        primary = "hr@10"
    """)
    study = load_study(write_study(text=text, name="s.toml"))
    assert study.task.options.data.users == 50


BAD = [
    # (patch or raw text, expected fragments of the one-line message)
    ({"modle": {"dim": 3}}, [":", "modle: unknown key"]),
    ({"model": {"dim": "big"}}, ["model.dim", "integer", "'big'"]),
    ({"model": {"attention": {"kind": "sofmax"}}},
     ["model.attention.kind", "unknown attention kind 'sofmax'", "did you mean 'softmax'", "known: ", "softmax, "]),
    ({"model": {"attention": {"kind": "softmax", "head": 2}}}, ["model.attention.head: unknown key"]),
    ({"variants": {"x": {"ffn": {"kind": "nope"}}}}, ["variants.x.ffn.kind", "unknown ffn kind 'nope'"]),
    ({"train": {"epochs": 0}}, ["train.epochs", "greater than 0"]),
    ({"metrics": {"primary": "auc"}}, ["metrics.primary"]),
    ({"report": {"baseline": "nope"}}, ["report.baseline", "not a variant"]),
    ({"seeds": [1, 1]}, ["seeds", "distinct"]),
    ({"train": {"loss": {"kind": "hinge"}}}, ["train.loss"]),
    ({"model": {"norm": {"kind": "layernorm", "placement": "pre_skip_kv"}, "attention": {"kind": "pointwise"}}},
     ["model.norm.placement", "'pre_skip_kv'", "attention kind 'pointwise' does not support"]),
    ({"variants": {"hc": {"connection": {"kind": "hyper"}}},
      "model": {"norm": {"kind": "layernorm", "placement": "pre_skip_kv"}}},
     ["norm.placement: 'pre_skip_kv' needs a single-stream connection", "connection kind 'hyper'"]),
]


@pytest.mark.parametrize("patch,fragments", BAD, ids=[f[1][0] for f in BAD])
def test_bad_study_one_line_exit_2(write_study, cli, patch, fragments):
    path = write_study(patch)
    code, out, err = cli("validate", path)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert lines[0].startswith(f"error: {path}")
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


def test_error_names_the_yaml_line(write_study):
    text = textwrap.dedent("""\
        name: t
        task: {kind: seqrec, data: {format: synthetic}}
        metrics: {primary: ndcg@10}
        model:
          dim: 16
          attention: {kind: softmax, heads: two}
    """)
    with pytest.raises(StudyError) as exc:
        load_study(write_study(text=text))
    assert ":6: model.attention.heads" in str(exc.value)


def test_missing_data_file(write_study, cli, tmp_path):
    path = write_study(replace={"task.data": {"format": "movielens", "path": "nowhere/u.data"}})
    with pytest.raises(DataError, match="nowhere/u.data"):
        load_study(path)
    code, _, err = cli("validate", path)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "nowhere/u.data" in err


def test_missing_study_file_and_bad_yaml(cli, tmp_path, write_study):
    code, _, err = cli("validate", tmp_path / "absent.yaml")
    assert code == 2 and "study file not found" in err
    code, _, err = cli("validate", write_study(text="name: [unclosed\n"))
    assert code == 2 and "not valid YAML" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("args, names", [
    (("run",), ["ablate run", "Missing argument", "study_file"]),
    (("status", "x.yaml", "--bogus"), ["ablate status", "--bogus"]),
    (("worker", "x.yaml", "--heartbeat", "0"), ["ablate worker", "--heartbeat"]),
    (("run", "x.yaml", "--workers", "many"), ["ablate run", "--workers"]),
    (("frobnicate",), ["frobnicate"]),
])
def test_bad_cli_argument_is_one_line_exit_2(cli, args, names):
    code, out, err = cli(*args)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: "), err
    assert all(name in err for name in names), err
    assert "╭" not in err and "Traceback" not in err


def test_cli_help_and_no_arguments_show_help(cli):
    code, out, _ = cli("--help")
    assert code == 0 and "run" in out and "validate" in out
    code, out, err = cli()
    assert code == 2 and "validate" in out + err


def test_report_settings_reach_the_report(write_study):
    from ablate.cli import _settings
    from ablate.stats import ReportSettings

    study = load_study(write_study({"report": {"alpha": 0.01, "correction": "fdr_bh", "ci": "percentile",
                                              "calibration": 0}}))
    settings = _settings(ReportSettings, {}, study)
    assert (settings.alpha, settings.correction, settings.ci, settings.calibration) == (0.01, "fdr_bh", "percentile", 0)
    assert settings.primary == "ndcg@10" and settings.metrics[:2] == ["ndcg@10", "hr@10"]

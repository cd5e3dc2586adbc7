"""A variant configured exactly like another trains the same models: `ablate validate` and
`ablate run` say so, and the report settings name it (``duplicates``)."""

from __future__ import annotations

from ablate.study.load import duplicate_variants, load_study

WARNING = (
    "variant '{}' is configured exactly like '{}': it trains the same models; its comparison is not tested"
)


def test_a_patch_that_changes_nothing_is_a_duplicate_of_the_base(write_study):
    study = load_study(write_study({"variants": {"same": {"ffn": {"kind": "pointwise"}, "dropout": 0.1}}}))
    assert duplicate_variants(study) == {"same": "base"}
    assert study.report_settings().duplicates == {"same": "base"}


def test_a_default_spelt_out_is_the_default(write_study):
    # The base leaves the heads at their default (1); the variant writes it out.
    path = write_study(
        {"variants": {"one-head": {"attention": {"heads": 1}}}},
        replace={"model.attention": {"kind": "softmax"}},
    )
    assert duplicate_variants(load_study(path)) == {"one-head": "base"}


def test_twins_among_the_variants_point_at_the_first(write_study):
    wide = {"ffn": {"kind": "mlp", "mult": 4}}
    study = load_study(write_study({"variants": {"wide": wide, "also-wide": wide, "narrow": {"dim": 8}}}))
    assert duplicate_variants(study) == {"also-wide": "wide"}


def test_the_baseline_is_never_the_duplicate(write_study):
    study = load_study(write_study({"variants": {"twin": {}}, "report": {"baseline": "twin"}}))
    assert duplicate_variants(study) == {"base": "twin"}


def test_distinct_variants_are_not_flagged(write_study, cli):
    path = write_study()
    assert duplicate_variants(load_study(path)) == {}
    assert load_study(path).report_settings().duplicates == {}
    code, out, err = cli("validate", path)
    assert code == 0 and "configured exactly like" not in out + err


def test_validate_warns_on_stderr(write_study, cli):
    path = write_study({"variants": {"same": {}}})
    code, out, err = cli("validate", path)
    assert code == 0, err
    assert WARNING.format("same", "base") in err.replace("\n", " ")
    assert "configured exactly like" not in out and f"{path}: valid" in out


def test_run_warns_once(write_study, cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = write_study(
        {"variants": {"same": {}}, "train": {"epochs": 1}, "report": {"calibration": 0, "bootstrap": 100}},
        replace={"variants": {"same": {}}, "seeds": [0]},
    )
    code, _, err = cli("run", path, "--quiet")
    assert code == 0, err
    assert err.replace("\n", " ").count(WARNING.format("same", "base")) == 1

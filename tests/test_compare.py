"""``ablate compare``: runs ablate did not make (an MLflow experiment made here with plain ``mlflow``
calls, a CSV of runs) get the verdicts ablate computes on the same numbers; runs not paired by
seed are compared unpaired (Welch) and the report says so; bad input is one line and status 2."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest
from scipy import stats as scipy_stats

from ablate import stats

# acc per seed 0..3: lr=0.01 clearly better, lr=0.05 within noise of the baseline lr=0.1.
ACC = {
    "0.1": [0.800, 0.806, 0.811, 0.803],
    "0.01": [0.830, 0.834, 0.842, 0.831],
    "0.05": [0.801, 0.804, 0.813, 0.805],
}
COMPARED = ["variant", "n_paired", "verdict", "delta", "ci_low", "ci_high", "mdd", "p_seeds_adj", "note"]


def _expected() -> pd.DataFrame:
    """ablate's own comparison of the same numbers, from a frame built by hand."""
    results = pd.DataFrame(
        [
            {"variant": f"lr={lr}", "seed": seed, "test.acc": value}
            for lr, values in ACC.items()
            for seed, value in enumerate(values)
        ]
    )
    settings = stats.ReportSettings(
        study="expected",
        baseline="lr=0.1",
        primary="acc",
        metrics=["acc"],
        higher_is_better={"acc": True},
        variants=[f"lr={lr}" for lr in ACC],
    )
    return stats.compare(results, None, settings, "acc")


def _same_rows(report_dir, expected: pd.DataFrame) -> None:
    got = pd.read_csv(report_dir / "comparisons.csv", keep_default_na=False, na_values=[""])
    got = got.set_index("variant").loc[expected["variant"]].reset_index()
    for c in COMPARED:
        if expected[c].dtype.kind == "f":
            np.testing.assert_allclose(got[c].astype(float), expected[c].astype(float), rtol=1e-9, err_msg=c)
        else:
            assert (
                got[c].astype(object).fillna("").astype(str).tolist()
                == expected[c].astype(object).fillna("").astype(str).tolist()
            ), c


def _csv(tmp_path, seeds_of=lambda lr, seed: seed):
    rows = [
        {
            "Name": f"run-{lr}-{seed}",
            "lr": float(lr),
            "seed": seeds_of(lr, seed),
            "acc": value,
            "Runtime": 7 + i,
        }
        for i, (lr, values) in enumerate(ACC.items())
        for seed, value in enumerate(values)
    ]
    path = tmp_path / "runs.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def test_an_mlflow_experiment_made_without_ablate_gets_ablates_verdicts(tmp_path, cli):
    """Runs logged with plain MlflowClient calls (params lr and seed, metric acc); a run still
    going and a parent run without a seed are not trials. ~4 s, most of it MLflow making its store."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    experiment = client.create_experiment("sweep")
    client.set_terminated(client.create_run(experiment).info.run_id)  # a sweep's parent: no params
    for lr, values in ACC.items():
        for seed, value in enumerate(values):
            run = client.create_run(experiment).info.run_id
            client.log_param(run, "lr", lr)
            client.log_param(run, "seed", seed)
            client.log_param(run, "epochs", 10)
            client.log_metric(run, "acc", value)
            client.set_terminated(run)
    client.log_param(client.create_run(experiment).info.run_id, "lr", "0.1")  # still running

    code, out, err = cli(
        "compare",
        uri,
        "--experiment",
        "sweep",
        "-m",
        "acc",
        "--baseline",
        "lr=0.1",
        "--out",
        tmp_path / "report",
    )
    assert code == 0, err
    assert "grouped by lr: 3 groups, paired by seed" in err
    assert "run(s) without a numeric seed left out" in err
    assert "report: " in out
    _same_rows(tmp_path / "report", _expected())


def test_a_csv_of_runs_gets_ablates_verdicts(tmp_path, cli):
    """A W&B-style export: Name and Runtime differ in every run, so they are not parameters."""
    code, out, err = cli(
        "compare", _csv(tmp_path), "-m", "acc", "--baseline", "lr=0.1", "--out", tmp_path / "r"
    )
    assert code == 0, err
    assert "grouped by lr: 3 groups, paired by seed; baseline lr=0.1" in err
    expected = _expected()
    _same_rows(tmp_path / "r", expected)
    assert set(expected["verdict"].fillna("")) >= {"better"}  # the numbers decide something
    html = (tmp_path / "r" / "report.html").read_text()
    assert "lr=0.01" in html and "better" in html


def test_runs_not_paired_by_seed_are_compared_unpaired_and_the_report_says_so(tmp_path, cli):
    """lr=0.01's seeds are 10..13: no seed pairs with the baseline's, so every variant is compared by
    Welch's t-test; one variant of two then is judged at α (Holm's first step is α/2)."""
    path = _csv(tmp_path, seeds_of=lambda lr, seed: seed + 10 if lr == "0.01" else seed)
    code, _, err = cli("compare", path, "-m", "acc", "--baseline", "lr=0.1", "--out", tmp_path / "r")
    assert code == 0, err
    assert "unpaired (lr=0.01 shares 0 of its 4 seeds with the baseline)" in err
    rows = pd.read_csv(tmp_path / "r" / "comparisons.csv").set_index("variant")
    assert (rows.loc[["lr=0.01", "lr=0.05"], "n_paired"] == 0).all()
    assert rows.loc["lr=0.01", "note"].startswith("unpaired: Welch's t-test, 4 and 4 seeds")
    welch = scipy_stats.ttest_ind(ACC["0.01"], ACC["0.1"], equal_var=False)
    row = rows.loc["lr=0.01"]
    assert row["p_seeds"] == pytest.approx(welch.pvalue, rel=1e-9)
    assert row["verdict"] == "better"
    assert row["delta"] == pytest.approx(np.mean(ACC["0.01"]) - np.mean(ACC["0.1"]))
    # Holm over two p's: the smaller one is decided at α / 2, so its interval is the 97.5 % Welch interval
    assert row["level"] == pytest.approx(0.025)
    interval = welch.confidence_interval(0.975)
    assert (row["ci_low"], row["ci_high"]) == pytest.approx((interval.low, interval.high), rel=1e-9)
    assert "runs not paired by seed" in (tmp_path / "r" / "report.md").read_text()


def test_duplicated_and_missing_seeds_are_one_line_each(tmp_path, cli):
    runs = pd.read_csv(_csv(tmp_path))
    runs = pd.concat([runs, runs[(runs.lr == 0.05) & (runs.seed == 1)]])  # lr=0.05 seed 1 twice
    runs = runs[~((runs.lr == 0.01) & (runs.seed == 3))]  # lr=0.01 lacks seed 3
    runs.to_csv(tmp_path / "runs.csv", index=False)
    code, _, err = cli(
        "compare", tmp_path / "runs.csv", "-m", "acc", "--baseline", "lr=0.1", "--out", tmp_path / "r"
    )
    assert code == 0, err
    assert "warning: lr=0.05: 2 runs with seed 1; their mean is that seed's value" in err
    assert (
        "warning: lr=0.01: no run with seed(s) 3 that the baseline has; compared on the 3 seeds both have"
        in err
    )


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["missing.csv", "-m", "acc"], "missing.csv: no such file or folder"),
        (["runs.csv", "-m", "loss"], "--metric loss: no such column; columns: Name, lr, seed, acc, Runtime"),
        (["runs.csv", "-m", "acc", "--seed-key", "rep"], "--seed-key rep: no such column"),
        (["runs.csv", "-m", "acc", "--baseline", "lr=3"], "--baseline lr=3: no group is called or selected"),
        (["runs.csv", "-m", "acc", "--group-by", "seed"], "--group-by seed: that is the seed column"),
        (["runs.csv", "-m", "score"], "--metric score: no such column"),
        (["sqlite:///nowhere.db", "-m", "acc"], "--experiment names the experiment"),
        (["sqlite:///nowhere.db", "--experiment", "x", "-m", "acc"], "no tracking store at nowhere.db"),
    ],
)
def test_bad_input_is_one_line_and_status_2(tmp_path, cli, monkeypatch, args, line):
    monkeypatch.chdir(tmp_path)
    _csv(tmp_path)
    base = [] if "--baseline" in args else ["--baseline", "lr=0.1"]
    code, out, err = cli("compare", *args, *base, "--out", tmp_path / "r")
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and line in lines[0], err
    assert not (tmp_path / "r").exists()


def test_one_group_only_is_refused(tmp_path, cli):
    runs = pd.read_csv(_csv(tmp_path))
    runs[runs.lr == 0.1].to_csv(tmp_path / "one.csv", index=False)
    code, _, err = cli(
        "compare", tmp_path / "one.csv", "-m", "acc", "--baseline", "lr=0.1", "--out", tmp_path / "r"
    )
    assert code == 2
    assert err.startswith("error: every run has the same parameters, so there is one group")


def test_an_unknown_metric_direction_asks_for_it(tmp_path, cli):
    runs = pd.read_csv(_csv(tmp_path)).rename(columns={"acc": "score"})
    runs.to_csv(tmp_path / "s.csv", index=False)
    code, _, err = cli(
        "compare", tmp_path / "s.csv", "-m", "score", "--baseline", "lr=0.1", "--out", tmp_path / "r"
    )
    assert code == 2
    assert "give --higher-is-better or --lower-is-better" in err


def test_the_readmes_command_works_as_written(tmp_path, cli, monkeypatch):
    """README's "Runs you already have" command, from the clone's root; only --out moves to tmp."""
    import shlex
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    section = (repo / "README.md").read_text().split("## Runs you already have", 1)[1]
    command = shlex.split(section.split("```bash\n", 1)[1].split("\n```", 1)[0])
    assert command[:2] == [".venv/bin/ablate", "compare"]
    args = command[1:]
    args[args.index("--out") + 1] = str(tmp_path / "report")
    monkeypatch.chdir(repo)
    code, out, err = cli(*args)
    assert code == 0, err
    assert "grouped by lr, dropout: 4 groups, paired by seed; baseline lr=0.001,dropout=0.1" in err
    report = (tmp_path / "report" / "report.md").read_text()
    assert "## Which factors matter" in report and "- lr matters" in report
    rows = pd.read_csv(tmp_path / "report" / "comparisons.csv")
    assert set(rows["metric"]) == {"accuracy", "val_loss"}
    assert (
        rows.set_index(["metric", "variant"]).loc[("accuracy", "lr=0.003,dropout=0.1"), "verdict"] == "better"
    )


def test_a_folder_of_result_files_gets_ablates_verdicts(tmp_path, cli):
    """One JSON or YAML mapping per run; the metric nested under `metrics` is found by its last part."""
    import json

    import yaml

    folder = tmp_path / "results"
    folder.mkdir()
    for lr, values in ACC.items():
        for seed, value in enumerate(values):
            record = {"lr": float(lr), "seed": seed, "metrics": {"acc": value}}
            if seed % 2:
                (folder / f"{lr}-{seed}.yaml").write_text(yaml.safe_dump(record))
            else:
                (folder / f"{lr}-{seed}.json").write_text(json.dumps(record))
    code, _, err = cli("compare", folder, "-m", "acc", "--baseline", "lr=0.1", "--out", tmp_path / "r")
    assert code == 0, err
    _same_rows(tmp_path / "r", _expected())


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("good", "runs.csv:6: --metric acc (acc) is 'good', not a number"),
        ("", "runs.csv:6: --metric acc (acc) has no value"),
        ("nan", "runs.csv:6: --metric acc (acc) has no value"),
        ("inf", "runs.csv:6: --metric acc (acc) is inf, not a finite number"),
        (
            '"0,83"',
            "runs.csv:6: --metric acc (acc) is '0,83', a decimal comma: export the file with decimal points",
        ),
    ],
)
def test_a_metric_value_no_report_can_use_is_named_where_it_was_read(tmp_path, cli, value, said):
    lines = _csv(tmp_path).read_text().splitlines()
    cells = lines[5].split(",")
    lines[5] = ",".join([*cells[:3], value, *cells[4:]])  # row 5: lr=0.01 seed 0, its acc
    (tmp_path / "runs.csv").write_text("\n".join(lines) + "\n")
    code, out, err = cli(
        "compare", tmp_path / "runs.csv", "-m", "acc", "--baseline", "lr=0.1", "--out", tmp_path / "r"
    )
    assert code == 2 and said in err and len(err.strip().splitlines()) == 1, err


def test_result_files_that_would_hang_or_mislead_are_one_line(tmp_path, cli):
    folder = tmp_path / "runs"
    folder.mkdir()
    (folder / "a.json").write_text('{"lr": 0.1, "seed": 0, "seed": 1, "acc": 0.8}')
    args = ["-m", "acc", "--baseline", "lr=0.1", "--out", tmp_path / "r"]
    code, _, err = cli("compare", folder, *args)
    assert code == 2 and "a.json: not a readable result file (key 'seed' given twice)" in err, err
    (folder / "a.json").write_text("[" * 100_000 + "]" * 100_000)
    code, _, err = cli("compare", folder, *args)
    assert code == 2 and "a.json: not a readable result file" in err and "Traceback" not in err, err
    (folder / "a.json").unlink()
    os.mkfifo(folder / "b.json")
    code, _, err = cli("compare", folder, *args)
    assert code == 2 and "b.json: not a regular file or folder" in err, err
    code, _, err = cli("compare", folder / "b.json", *args)
    assert code == 2 and "b.json: not a regular file or folder" in err, err


def test_an_unreachable_server_and_a_bad_margin_are_one_line_without_a_web_address(
    tmp_path, cli, monkeypatch
):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    code, _, err = cli(
        "compare",
        "http://127.0.0.1:9",
        "--experiment",
        "x",
        "-m",
        "acc",
        "--baseline",
        "lr=0.1",
        "--out",
        tmp_path / "r",
    )
    assert code == 2 and "http://127.0.0.1:9: the tracking store did not answer" in err, err
    _csv(tmp_path)
    code, _, err = cli(
        "compare",
        tmp_path / "runs.csv",
        "-m",
        "acc",
        "--baseline",
        "lr=0.1",
        "--margin",
        "-1",
        "--out",
        tmp_path / "r",
    )
    assert code == 2 and err.startswith("error: --margin -1: ") and "http" not in err, err


def test_accuracy_near_one_is_judged_on_a_share_of_its_error(tmp_path, cli):
    """At .96 accuracy, 2 % of the mean (±.019) is half the error: the default margin of an
    accuracy-like metric is 2 % of the error (±.0008), so a −.001 ± .0025 change is no longer
    'equivalent';
    a margin set at 2 % of the mean still is, under a ⚠ line saying how wide it is."""
    acc = {"0.1": [0.960, 0.962, 0.958, 0.961], "0.05": [0.957, 0.963, 0.954, 0.962]}
    rows = [{"lr": float(lr), "seed": s, "accuracy": v} for lr, vs in acc.items() for s, v in enumerate(vs)]
    pd.DataFrame(rows).to_csv(tmp_path / "sweep.csv", index=False)
    args = ("compare", tmp_path / "sweep.csv", "-m", "accuracy", "--baseline", "lr=0.1")
    verdicts = {}
    for name, margin in (("default", ()), ("mean", ("--margin", "2%"))):
        code, _, err = cli(*args, *margin, "--out", tmp_path / name)
        assert code == 0, err
        found = pd.read_csv(tmp_path / name / "comparisons.csv").set_index("variant")
        verdicts[name] = found.loc["lr=0.05", "verdict"]
    assert verdicts == {"default": "inconclusive", "mean": "equivalent"}
    wide = "±0.0192 margin on accuracy is 48% of lr=0.1's error (1 − mean), 0.0398 (over 25%)"
    assert wide in (tmp_path / "mean" / "report.md").read_text()
    assert "no trivial baseline" not in (tmp_path / "default" / "report.md").read_text()

"""``ablate compare --items``: per-unit scores compared item by item. The verdict rows equal an
independent computation (statsmodels' McNemar, a paired t by hand, statsmodels' cluster-robust
OLS, the crossed estimate); bad input is one line naming the file and the items, status 2."""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import statsmodels.api as sm
from scipy import stats as scipy_stats
from statsmodels.stats.contingency_tables import mcnemar
from statsmodels.stats.multitest import multipletests

from ablate.report.item_logs import read_items
from ablate.stats.crossed import crossed_estimate
from ablate.stats.items import item_test

UNITS = 80


def _binary(tmp_path, n=UNITS, rates=(("base", 0.55), ("good", 0.8), ("same", 0.55)), seed=3):
    rng = np.random.default_rng(seed)
    latent = rng.random(n)  # a unit's difficulty, shared by the models: what makes pairing pay
    rows = [
        {"model": m, "seed": 0, "unit": f"q{u}", "acc": int(latent[u] < p + 0.1 * rng.standard_normal())}
        for m, p in rates
        for u in range(n)
    ]
    path = tmp_path / "long.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    return path, pd.DataFrame(rows)


def _compared(tmp_path, cli, *args):
    code, out, err = cli("compare", *map(str, args), "--items", "--out", tmp_path / "r")
    assert code == 0, err
    rows = pd.read_csv(tmp_path / "r" / "comparisons.csv").set_index("variant")
    return rows, pd.read_csv(tmp_path / "r" / "items.csv").set_index("model"), out, err


def test_binary_scores_are_decided_by_mcnemar_and_holm(tmp_path, cli):
    path, rows = _binary(tmp_path)
    got, items, out, _ = _compared(tmp_path, cli, path, "-m", "acc", "--baseline", "base")
    wide = rows.pivot(index="unit", columns="model", values="acc")
    p = {}
    for m in ("good", "same"):
        table = pd.crosstab(wide[m], wide["base"]).reindex(index=[1, 0], columns=[1, 0], fill_value=0)
        p[m] = mcnemar(table.to_numpy(), exact=True).pvalue
        assert items.loc[m, "test"] == "mcnemar"
        assert items.loc[m, "agree.only variant"] == int(((wide[m] == 1) & (wide["base"] == 0)).sum())
        assert items.loc[m, "agree.only base"] == int(((wide[m] == 0) & (wide["base"] == 1)).sum())
        assert got.loc[m, "p_seeds"] == pytest.approx(p[m], rel=1e-12)
        assert got.loc[m, "delta"] == pytest.approx((wide[m] - wide["base"]).mean())
    reject, adjusted, *_ = multipletests([p["good"], p["same"]], alpha=0.05, method="holm")
    assert got.loc["good", "p_seeds_adj"] == pytest.approx(adjusted[0])
    assert got.loc["good", "verdict"] == ("better" if reject[0] else "inconclusive")
    assert got.loc["good", "verdict"] == "better"  # 0.55 → 0.8 on 80 shared units
    assert got.loc["same", "verdict"] in ("inconclusive", "equivalent") and not reject[1]
    assert "McNemar" in (tmp_path / "r" / "report.md").read_text()
    assert "agreement: both right" in (tmp_path / "r" / "report.md").read_text()


def test_continuous_scores_read_a_paired_t_by_hand(tmp_path, cli):
    rng = np.random.default_rng(7)
    difficulty = rng.normal(0, 1, 40)
    base, other = difficulty + rng.normal(0, 0.3, 40), difficulty + 0.2 + rng.normal(0, 0.3, 40)
    rows = [{"run": "a", "unit": u, "rouge": float(base[u])} for u in range(40)]
    rows += [{"run": "b", "unit": u, "rouge": float(other[u])} for u in range(40)]
    (tmp_path / "r.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    pd.DataFrame(rows).to_parquet(tmp_path / "r.parquet")  # the same table, read alike
    lines, parquet = (
        read_items([str(tmp_path / "r.jsonl")], "rouge")[0],
        read_items([str(tmp_path / "r.parquet")], "rouge")[0],
    )
    pd.testing.assert_frame_equal(
        lines.drop(columns=["_from", "_source"]), parquet.drop(columns=["_from", "_source"])
    )
    got, items, *_ = _compared(
        tmp_path, cli, tmp_path / "r.jsonl", "-m", "rouge", "--baseline", "a", "--higher-is-better"
    )
    d = other - base
    se = d.std(ddof=1) / np.sqrt(len(d))
    p = 2 * scipy_stats.t.sf(abs(d.mean()) / se, len(d) - 1)
    half = scipy_stats.t.ppf(1 - 0.05 / 2, len(d) - 1) * se  # one comparison: Holm's level is α
    assert items.loc["b", "test"] == "paired_t"
    assert got.loc["b", "p_seeds"] == pytest.approx(p, rel=1e-9)
    assert got.loc["b", "ci_low"] == pytest.approx(d.mean() - half, rel=1e-9)
    assert got.loc["b", "ci_high"] == pytest.approx(d.mean() + half, rel=1e-9)
    assert got.loc["b", "verdict"] == ("better" if p < 0.05 else "inconclusive")


def test_clustered_units_get_cluster_robust_errors():
    rng = np.random.default_rng(1)
    clusters = np.repeat(np.arange(12), 5)  # 12 passages, 5 questions each
    shift = rng.normal(0, 0.5, 12)[clusters]  # the passage moves all its questions' differences
    e = 0.1 + shift + rng.normal(0, 0.1, len(clusters))
    frame = pd.DataFrame({"seed": 0, "unit": np.arange(len(e)).astype(str), "cluster": clusters})
    units = pd.concat([frame.assign(variant="b", score=0.0), frame.assign(variant="v", score=e)])
    test = item_test(units, "v", "b")
    fit = sm.OLS(e, np.ones(len(e))).fit(cov_type="cluster", cov_kwds={"groups": clusters}, use_t=True)
    assert test.test == "cluster_t" and test.df == 11
    assert test.se == pytest.approx(fit.bse[0]) and test.p == pytest.approx(fit.pvalues[0])
    assert test.se > e.std(ddof=1) / np.sqrt(len(e)) * 1.5  # the naive unit-level se is far too small


def test_several_seeds_are_crossed_with_the_units():
    rng = np.random.default_rng(2)
    e = 0.05 + rng.normal(0, 0.1, (4, 1))[:, :] + rng.normal(0, 0.2, (4, 30))
    long = [
        {"variant": v, "seed": s, "unit": str(u), "score": float(e[s, u]) if v == "v" else 0.0}
        for v in ("b", "v")
        for s in range(4)
        for u in range(30)
    ]
    test = item_test(pd.DataFrame(long), "v", "b")
    expected = crossed_estimate(e)
    assert test.test == "crossed" and test.seeds == 4 and test.units == 30
    assert test.delta == pytest.approx(expected.delta) and test.se == pytest.approx(expected.se)
    assert set(test.variance) == {"seeds", "units", "rest"} and test.variance["seeds"] > 0


def _bad(tmp_path, cli, *args):
    code, out, err = cli("compare", *map(str, args), "--items", "--out", tmp_path / "r")
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_item_sets_that_differ_are_named_and_partial_says_what_is_compared(tmp_path, cli):
    path, rows = _binary(tmp_path)
    cut = rows[~((rows["model"] == "good") & rows["unit"].isin(["q3", "q5", "q8"]))]
    cut = pd.concat([cut, pd.DataFrame([{"model": "good", "seed": 0, "unit": "q999", "acc": 1}])])
    cut.to_csv(path, index=False)
    line = _bad(tmp_path, cli, path, "-m", "acc", "--baseline", "base")
    assert str(path) in line and "'good' lacks 3 unit(s)" in line and "q3, q5, q8" in line
    assert "has 1 unit(s) the baseline lacks (q999)" in line and "--partial" in line
    code, _, err = cli(
        "compare", path, "-m", "acc", "--baseline", "base", "--items", "--partial", "--out", tmp_path / "p"
    )
    assert code == 0 and f"compared on the {UNITS - 3} units every model has" in err
    assert pd.read_csv(tmp_path / "p" / "items.csv")["units"].tolist() == [UNITS - 3, UNITS - 3]


def test_duplicated_items_and_bad_scores_are_one_line(tmp_path, cli):
    path, rows = _binary(tmp_path)
    pd.concat([rows, rows.iloc[[0, 1]]]).to_csv(path, index=False)
    line = _bad(tmp_path, cli, path, "-m", "acc", "--baseline", "base")
    assert "2 item(s) appear more than once for 'base': q0, q1" in line and str(path) in line
    bad = rows.astype({"acc": object})
    bad.loc[4, "acc"], bad.loc[9, "acc"] = "n/a", "1.5"
    bad.to_csv(path, index=False)
    line = _bad(tmp_path, cli, path, "-m", "acc", "--baseline", "base")
    assert f"1 score(s) of acc are not finite numbers: {path}:6 ('n/a')" in line
    bad.loc[4, "acc"] = 0
    bad.to_csv(path, index=False)
    line = _bad(tmp_path, cli, path, "-m", "acc", "--baseline", "base")
    assert f"1 score(s) of acc outside [0, 1]: {path}:11 (1.5)" in line


def test_truncated_log_mixed_tasks_and_foreign_versions(tmp_path, cli):
    record = {"doc_id": 0, "metrics": ["acc"], "acc": 1.0}
    cut = tmp_path / "a" / "samples_arc_2026-11-29T00-00-00.jsonl"
    cut.parent.mkdir()
    cut.write_text(json.dumps(record) + "\n" + json.dumps(record | {"doc_id": 1})[:20])
    line = _bad(tmp_path, cli, f"a={cut}", f"b={cut}", "-m", "acc", "--baseline", "a")
    assert f"{cut}:2: not a JSON record (the file ends there: truncated?)" in line
    other = tmp_path / "b" / "samples_hellaswag_2026-11-29T00-00-00.jsonl"
    other.parent.mkdir()
    other.write_text(json.dumps(record) + "\n")
    cut.write_text(json.dumps(record) + "\n")
    line = _bad(tmp_path, cli, f"a={cut}", f"b={other}", "-m", "acc", "--baseline", "a")
    assert "mixed tasks: arc" in line and "hellaswag" in line
    old = tmp_path / "c" / "samples_arc_2026-11-29T00-00-00.jsonl"
    old.parent.mkdir()
    old.write_text(json.dumps({"id": 0, "acc": 1.0}) + "\n")
    (old.parent / "results_2026.json").write_text(json.dumps({"lm_eval_version": "0.3.0"}))
    line = _bad(tmp_path, cli, f"a={cut}", f"c={old}", "-m", "acc", "--baseline", "a")
    assert f"{old}:1: no doc_id in the record (written by lm-eval 0.3.0" in line


def _benchmark():
    """benchmarks/items.py, the simulation whose larger run RESULTS.md reports."""
    path = Path(__file__).parents[1] / "benchmarks" / "items.py"
    spec = importlib.util.spec_from_file_location("items_benchmark", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_simulated_false_rate_with_clusters_and_the_gain_of_pairing():
    bench = _benchmark()
    rates = bench.false_rates(60, clusters=20, per_cluster=10, cluster_sd=0.6)
    given, naive = rates["clusters given"], rates["naive (items independent)"]
    assert given <= 0.05 + 2 * np.sqrt(0.05 * 0.95 / 60)  # ≤ α within two binomial se
    assert naive >= given + 0.1  # the item-level test over-rejects when items share clusters
    power = bench.power(60, items=200, effect=0.35)
    assert power["paired (McNemar)"] > power["unpaired (Welch)"]


@pytest.mark.heavy
def test_a_function_returning_unit_scores_gets_crossed_verdicts(tmp_path, cli):
    """examples/item_scores: the callable returns each test row's score beside its metrics; the
    report's verdicts read the seeds crossed with the rows, as for ablate's own tasks."""
    shutil.copytree(Path(__file__).parents[1] / "examples" / "item_scores", tmp_path / "example")
    study = tmp_path / "example" / "study.yaml"
    code, out, err = cli(
        "run", study, "--output", tmp_path / "out", "model.config.rows=100", "model.config.epochs=1"
    )
    assert code == 0, out + err
    report = tmp_path / "out" / "report"
    assert "variance: seeds crossed with the test units for acc" in (report / "report.md").read_text()
    row = pd.read_csv(report / "comparisons.csv").set_index("variant").loc["narrow"]
    assert row["n_units"] == 3 * 20  # 3 seeds × the 20 test rows, paired
    assert row["verdict"] in {"better", "worse", "equivalent", "inconclusive"}


def test_unit_scores_of_a_function_are_checked():
    from ablate.training.own_trial import unit_scores
    from ablate.training.trainer import TrialFailed

    summary = {"test.acc": 0.5, "valid.acc": 0.5}
    frame = unit_scores({"acc": {"a": 1, "b": 0.0}}, summary)
    assert frame.to_dict("list") == {"unit": ["a", "b"], "acc": [1.0, 0.0]}
    assert unit_scores(None, summary).empty
    for bad, said in [
        ([1, 0], "must map each metric to {unit id: score}"),
        ({"acc": {"a": "x"}}, "1 score(s) of 'acc' not finite numbers, units ['a']"),
        ({"f1": {"a": 1}}, "'f1' has unit scores but no test.f1"),
    ]:
        with pytest.raises(TrialFailed, match=re.escape(said)):
            unit_scores(bad, summary)


def test_a_pilot_plans_units_and_seeds():
    from ablate.stats.items import ItemTest, design_for

    one = ItemTest("paired_t", "", 0.0, 0.05, 99, 1.0, units=100, seeds=1)
    # (z_.975 + z_.8)² · 100 · 0.05² / 0.02² = 7.849 · 625 = 4905.5
    assert design_for(one, 0.02, 0.05) == {
        "units_needed": 4906,
        "seeds_needed": pytest.approx(np.nan, nan_ok=True),
    }
    split = {"seeds": 1e-4, "units": 4e-3, "rest": 1e-3}
    crossed = ItemTest("crossed", "", 0.0, 0.01, 5, 1.0, units=200, seeds=3, variance=split)
    need = design_for(crossed, 0.02, 0.05)
    target = (0.02 / 2.8015852) ** 2
    assert need["units_needed"] == np.ceil((4e-3 + 1e-3 / 3) / (target - 1e-4 / 3))
    assert need["seeds_needed"] == np.ceil((1e-4 + 1e-3 / 200) / (target - 4e-3 / 200))


def test_the_readmes_command_works_as_written(tmp_path, cli, monkeypatch):
    """README's "Evaluation logs, item by item" command, from the clone's root; only --out moves."""
    repo = Path(__file__).resolve().parents[1]
    section = (repo / "README.md").read_text().split("## Evaluation logs, item by item", 1)[1]
    command = shlex.split(section.split("```bash\n", 1)[1].split("\n```", 1)[0])
    assert command[:2] == [".venv/bin/ablate", "compare"]
    args = command[1:]
    args[args.index("--out") + 1] = str(tmp_path / "report")
    monkeypatch.chdir(repo)
    code, out, err = cli(*args)
    assert code == 0, err
    assert "3 models, 240 units, 1 seed(s); baseline base" in err
    items = pd.read_csv(tmp_path / "report" / "items.csv").set_index("model")
    assert items["test"].tolist() == ["cluster_t", "cluster_t"]  # 40 passages of 6 questions
    assert items.loc["rerank", "verdict"] == "better"
    report = (tmp_path / "report" / "report.md").read_text()
    assert "only rerank 51, only base 20" in report and "- variance: the units'" in report
    assert "variance: seeds only" not in report  # the seed test's line, not these verdicts'


def test_weights_and_clusters_are_checked_and_used(tmp_path, cli):
    path, rows = _binary(tmp_path, rates=(("base", 0.55), ("good", 0.8)))
    rows["cluster"] = [f"p{int(u[1:]) // 4}" for u in rows["unit"]]
    rows["weight"] = [1.0 + int(u[1:]) % 3 for u in rows["unit"]]
    rows.to_csv(path, index=False)
    got, items, *_ = _compared(tmp_path, cli, path, "-m", "acc", "--baseline", "base")
    assert items.loc["good", "test"] == "cluster_t" and items.loc["good", "df"] == UNITS // 4 - 1
    wide = rows.pivot(index="unit", columns="model", values="acc")
    w = rows[rows["model"] == "base"].set_index("unit")["weight"].loc[wide.index]
    assert got.loc["good", "delta"] == pytest.approx(np.average(wide["good"] - wide["base"], weights=w))
    for column, value, said in [
        ("cluster", None, "1 row(s) with no cluster"),
        ("weight", -1.0, "1 row(s) with a weight that is not a positive number"),
        ("cluster", "elsewhere", "1 unit(s) with a different cluster in different models' rows: q7"),
    ]:
        bad = rows.copy()
        bad.loc[UNITS + 7, column] = value  # the second model's row of q7
        bad.to_csv(path, index=False)
        line = _bad(tmp_path, cli, path, "-m", "acc", "--baseline", "base")
        assert said in line, line


def test_options_for_runs_are_refused_with_items(tmp_path, cli):
    path, _ = _binary(tmp_path)
    line = _bad(tmp_path, cli, path, "-m", "acc", "--baseline", "base", "--unpaired", "--group-by", "x")
    assert "--group-by, --unpaired: for runs, not with --items" in line
    line = _bad(tmp_path, cli, f"mine={path}", "-m", "acc", "--baseline", "base")
    assert f"mine={path}: a table names its models in its model column" in line
    code, _, err = cli(
        "compare", path, "-m", "acc", "--baseline", "base", "--partial", "--out", tmp_path / "r"
    )
    assert code == 2 and "--partial: only with --items" in err


def test_plan_with_items_reads_a_log_as_the_pilot(tmp_path, cli):
    """``ablate plan --items``: the items each comparison needs, as compare's items.csv has them,
    with the design's options for a study refused in one line."""
    path, _ = _binary(tmp_path)
    _, items, _, _ = _compared(tmp_path, cli, path, "--metric", "acc", "--baseline", "base")
    code, out, err = cli("plan", path, "--items", "--metric", "acc", "--baseline", "base")
    assert code == 0, err
    for model in ("good", "same"):
        [line] = [x for x in out.splitlines() if x.startswith(f"{model}: ")]
        assert line.startswith(f"{model}: {items.loc[model, 'units_needed']:g} units at 1 seed(s)")
        assert f"({items.loc[model, 'test']}: " in line
    for wrong in (["--sd", "0.1"], []):
        args = ["--baseline", "base"] if wrong else []
        code, _, err = cli("plan", path, "--items", "--metric", "acc", *args, *wrong)
        assert code == 2 and len(err.strip().splitlines()) == 1, err

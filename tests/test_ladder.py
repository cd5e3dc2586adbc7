"""Does it hold at scale (:mod:`ablate.stats.ladder`): the line through the rung means checked
against least squares computed here by hand, each trend on a ladder built to show it, the
prediction's label and width, decision accuracy on a hand-counted example, and a small simulation:
false trends ≤ α with a constant effect, power for a slope, the held-out top rung's coverage."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from scipy import stats

from ablate.stats.ladder import (
    EXTRAPOLATION,
    INTERPOLATION,
    Trend,
    decision_accuracy,
    fit_ladder,
    project,
    simulate_ladder,
)

SCALES = np.log10([1e5, 4e5, 1.6e6, 6.4e6])  # four widths over 64× in parameters


def _ladder(effects: list[float], noise: list[float], scales=SCALES) -> pd.DataFrame:
    """Paired differences: rung r's seeds are effects[r] + each of ``noise``."""
    rows = [
        {"rung": f"r{r}", "scale": x, "diff": e + n}
        for r, (x, e) in enumerate(zip(scales, effects, strict=True))
        for n in noise
    ]
    return pd.DataFrame(rows)


def test_line_matches_least_squares_by_hand():
    rng = np.random.default_rng(3)
    diffs = _ladder([0.1, 0.3, 0.2, 0.5], [0.0, 0.0, 0.0])
    diffs["diff"] += rng.normal(0, 0.1, len(diffs))
    fit = fit_ladder(diffs, margin=0.1, alpha=0.05)
    means = diffs.groupby("scale")["diff"].mean()
    x, y = means.index.to_numpy(), means.to_numpy()
    b, a = np.polyfit(x, y, 1)  # equal seeds: equal weights
    resid = y - (a + b * x)
    s2 = resid @ resid / (len(x) - 2)
    se_b = math.sqrt(s2 / np.sum((x - x.mean()) ** 2))
    t = stats.t.ppf(0.975, len(x) - 2)
    assert fit.slope == pytest.approx(b)
    assert (fit.slope_low, fit.slope_high) == pytest.approx((b - t * se_b, b + t * se_b))
    assert fit.effect == pytest.approx(a + b * x.max())  # read at the top rung by default
    assert fit.df == 2 and fit.rungs == 4


@pytest.mark.parametrize(
    ("effects", "trend"),
    [
        ([0.50, 0.51, 0.49, 0.50], Trend.HOLDS),
        ([0.10, 0.30, 0.50, 0.70], Trend.GROWS),
        ([-0.10, -0.30, -0.50, -0.70], Trend.GROWS),  # a worse effect growing is growing too
        ([0.70, 0.50, 0.30, 0.10], Trend.SHRINKS),
        ([0.60, 0.20, -0.20, -0.60], Trend.FLIPS),
        ([0.01, -0.01, 0.00, 0.01], Trend.HOLDS),  # no effect at any size
    ],
)
def test_each_trend_on_a_ladder_built_to_show_it(effects, trend):
    fit = fit_ladder(_ladder(effects, [-0.01, 0.0, 0.01]), margin=0.1, alpha=0.05)
    assert fit.trend == trend


def test_a_noisy_ladder_is_unknown_and_two_rungs_need_a_third():
    noisy = fit_ladder(_ladder([0.5, 0.1, 0.9, 0.2], [-1.0, 0.0, 1.0]), margin=0.1, alpha=0.05)
    assert noisy.trend == Trend.UNKNOWN
    two = fit_ladder(_ladder([0.1, 0.9], [-0.01, 0.0, 0.01], SCALES[:2]), margin=0.1, alpha=0.05)
    assert two.trend == Trend.NEEDS_RUNGS and str(two.trend) == "needs ≥ 3 rungs"
    assert math.isnan(two.slope)
    assert project(_ladder([0.1, 0.9], [0.0, 0.1], SCALES[:2]), 8.0, 0.05) is None


def test_the_prediction_widens_with_distance_and_says_what_it_is():
    diffs = _ladder([0.10, 0.22, 0.28, 0.41], [-0.02, 0.0, 0.02])
    inside = project(diffs, 6.0, 0.05)
    near, far = project(diffs, 7.0, 0.05), project(diffs, 9.0, 0.05)
    assert inside.kind == INTERPOLATION and near.kind == far.kind == EXTRAPOLATION
    assert inside.high - inside.low < near.high - near.low < far.high - far.low
    assert far.low < far.effect < far.high and far.effect > near.effect  # the line continued


def test_decision_accuracy_counts_pairs_ordered_as_at_the_top():
    means = pd.DataFrame(
        {"a": [1.0, 1.0, 3.0], "b": [2.0, 1.0, 2.0], "c": [3.0, 3.0, 1.0]}, index=["s", "m", "l"]
    )
    accuracy = decision_accuracy(means)
    # top order a > b > c; rung s: a<b, a<c, b<c: none agree; rung m: a=b (½), a<c, b<c
    assert accuracy.to_dict() == {"s": 0.0, "m": pytest.approx(1 / 6), "l": 1.0}


def test_simulation_false_trends_power_and_coverage():
    common = {"seeds": 3, "sd": 1.0, "margin": 0.5, "alpha": 0.05, "studies": 300}
    null = simulate_ladder(SCALES, effect=0.5, slope=0.0, rung_sd=0.2, **common)
    false = null["grows"] + null["shrinks"] + null["flips"]
    assert false <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / 300)  # ≤ α, three binomial sd's slack
    assert 0.95 - 0.04 <= null["coverage"] <= 0.95 + 0.04
    six = np.log10(1e5 * 4.0 ** np.arange(6))
    sloped = simulate_ladder(six, effect=0.5, slope=1.0, rung_sd=0.0, rng_seed=1, **common)
    # 1 seed sd per decade over 3 decades: t's noncentrality ≈ 4.4 on 4 df, power ≈ 3 in 4
    assert sloped["grows"] > 0.6 and sloped["shrinks"] + sloped["flips"] < 0.02


RUNGS = {"w8": ["model.dim=8"], "w16": ["model.dim=16"], "w32": ["model.dim=32", "model.blocks=2"]}
LADDER = {"rungs": RUNGS}


def test_validate_prints_each_rungs_parameters(write_study, cli):
    code, out, err = cli("validate", write_study({"model": {"attention": {"heads": 2}}, "ladder": LADDER}))
    assert code == 0, err
    counts, gflop = {}, {}
    for line in out.splitlines():
        if line.startswith("ladder rung "):
            rung, rest = line.removeprefix("ladder rung ").split(" (base): ", 1)
            counts[rung] = int(rest.split(" parameters")[0].replace(",", ""))
            gflop[rung] = float(rest.split(" to train, ")[1].split(" training GFLOP")[0])
    assert list(counts) == ["w8", "w16", "w32"]
    assert counts["w8"] < counts["w16"] < counts["w32"]
    assert 0 < gflop["w8"] < gflop["w16"] < gflop["w32"]
    assert "tiny.w32: " in out and "3 rungs spanning" in out and "× in parameters" in out


def test_validate_says_what_the_design_cannot_tell_once_not_once_per_rung(write_study, cli):
    code, _, err = cli("validate", write_study({"ladder": LADDER, "seeds": [0, 1]}))
    assert code == 0, err
    assert err.count("2 seed(s) give no verdict") == 1


def test_a_trials_training_gflop_is_known_before_it_trains(write_study):
    """validate's figure (trial_gflop) is the one the trained trial records, counted apart."""
    from ablate.study.load import load_study
    from ablate.training.preflight import trial_gflop
    from ablate.training.trainer import train_trial

    study = load_study(write_study({"train": {"epochs": 2, "patience": 5}}))
    data = study.task.load()
    expected = trial_gflop(study, "base", data)
    trained = train_trial(study, study.variants["base"], 0, data, torch.device("cpu"))
    assert expected > 0 and trained.train_gflop == pytest.approx(expected, rel=1e-9)


EPOCHS = {"e1": ["train.epochs=1"], "e2": ["train.epochs=2"], "e4": ["train.epochs=4"]}


def test_a_ladder_over_epochs_is_placed_by_compute(write_study, cli):
    path = write_study({"ladder": {"rungs": EPOCHS}})
    code, _, err = cli("validate", path)  # one parameter count at every rung: no trend to read
    line = err.strip().splitlines()[-1]  # after each rung's own warnings (2 seeds: no verdict)
    assert code == 2 and line.startswith(f"error: {path}:") and ": ladder.scale: rungs e1, e2, e4 " in line
    assert "set ladder.scale: compute" in line
    code, out, err = cli("validate", write_study({"ladder": {"rungs": EPOCHS, "scale": "compute"}}))
    assert code == 0 and "3 rungs spanning 4.0× in compute" in out, err
    code, _, err = cli("validate", write_study({"ladder": {"rungs": EPOCHS, "scale": "flops"}}))
    assert code == 2 and "unknown ladder scale 'flops'" in err


def test_a_compute_ladders_report_reads_training_gflop(tmp_path):
    from ablate.report.ladder import write_ladder
    from ablate.stats.ladder import ladder_table

    per_rung = {  # one size; "relu" worse by 0.1 at 1× and less the longer it trains
        f"e{k}": _rung_results({"base": 5000, "relu": 5000}, {"base": 2.0, "relu": 2.1 - 0.02 * k}).assign(
            train_gflop=10.0 * k
        )
        for k in (1, 2, 4, 8)
    }
    trends, rungs, points = ladder_table(per_rung, {"relu": 0.05}, "bpb", "base", 0.05, 1e3, "compute")
    assert rungs.columns[0] == "training GFLOP" and rungs["training GFLOP"].tolist() == [10, 20, 40, 80]
    assert trends.at[0, "trend"] == "shrinks" and trends.at[0, "target_kind"] == "extrapolation"
    text = write_ladder(tmp_path, "lm", (trends, rungs, points), "bpb", "base", {}, 0.05)["md"].read_text()
    assert "| rung | training GFLOP |" in text and "| e8 | 80 |" in text
    assert "relu at 1e+03 training GFLOP (extrapolation)" in text
    with pytest.raises(ValueError, match="rung e1: its base trials have no training GFLOP figure"):
        missing = {**per_rung, "e1": per_rung["e1"].drop(columns="train_gflop")}
        ladder_table(missing, {}, "bpb", "base", 0.05, None, "compute")


def test_a_rung_that_breaks_a_shape_is_refused_naming_the_rung(write_study, cli):
    broken = {"rungs": {**LADDER["rungs"], "w10": ["model.dim=10"]}}  # 10 not divisible by 4 heads
    path = write_study({"model": {"attention": {"heads": 4}}, "ladder": broken})
    code, _, err = cli("validate", path)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith(f"error: {path}:") and "ladder.rungs.w10: model.attention" in lines[0]
    assert "not divisible by heads=4" in lines[0] and lines[0].count(str(path)) == 1


def _rung_results(params: dict[str, int], means: dict[str, float], seeds: int = 3) -> pd.DataFrame:
    noise = np.linspace(-0.01, 0.01, seeds)
    rows = [
        {"variant": v, "seed": s, "params": params[v], "test.bpb": means[v] + noise[s]}
        for v in means
        for s in range(seeds)
    ]
    return pd.DataFrame(rows)


def test_the_ladder_report_reads_each_rungs_trials(tmp_path):
    from ablate.report.ladder import write_ladder
    from ablate.stats.ladder import ladder_table, smallest_predicting

    per_rung = {  # rung → trials; "relu" worse by 0.1 at every size, "wide" better the larger
        f"w{d}": _rung_results(
            {"base": 1000 * d * d, "relu": 1000 * d * d, "wide": 1200 * d * d},
            {"base": 2.0 - 0.1 * i, "relu": 2.1 - 0.1 * i, "wide": 2.0 - 0.1 * i - 0.05 * i},
        )
        for i, d in enumerate((8, 16, 32, 64))
    }
    trends, rungs, points = ladder_table(per_rung, {"relu": 0.05, "wide": 0.05}, "bpb", "base", 0.05, 1e8)
    assert list(rungs.index) == ["w8", "w16", "w32", "w64"] and rungs.at["w8", "parameters"] == 64_000
    by = trends.set_index("variant")
    assert by.at["relu", "trend"] == "holds" and by.at["relu", "effect"] == pytest.approx(0.1)
    # bpb: lower is better; "wide"'s difference grows more negative with size — its magnitude grows
    assert by.at["wide", "trend"] == "grows" and by.at["wide", "slope"] < 0
    assert by.at["wide", "target_kind"] == "extrapolation"
    # at w8 base and wide tie (½), the other two pairs are ordered as at w64
    assert rungs["decision_accuracy"].tolist() == pytest.approx([5 / 6, 1.0, 1.0, 1.0])
    assert smallest_predicting(rungs["decision_accuracy"]) == "w16"
    # a middle rung out of order: only the rungs above it count
    assert smallest_predicting(pd.Series([1.0, 0.5, 1.0, 1.0], index=list("abcd"))) == "c"
    assert smallest_predicting(pd.Series([1.0, 1.0, 0.5, 1.0], index=list("abcd"))) is None
    assert len(points) == 2 * 4 * 3  # two variants × four rungs × three seeds
    reports = {r: tmp_path / r for r in per_rung}
    paths = write_ladder(tmp_path, "lm", (trends, rungs, points), "bpb", "base", reports, 0.05)
    text = paths["md"].read_text()
    assert "](figures/ladder.png)" in text and (tmp_path / "figures" / "ladder.png").stat().st_size > 1000
    assert "**trend: holds**" in text and "**trend: grows**" in text and "(extrapolation)" in text
    assert "as the top rung does, and every rung above it too: **w16**" in text
    assert pd.read_csv(paths["csv"])["trend"].tolist() == ["holds", "grows"]


def test_a_worker_refuses_a_ladder_and_status_shows_each_rung(write_study, cli):
    path = write_study({"ladder": LADDER})
    code, _, err = cli("worker", path)  # a worker takes one queue: one rung's
    assert code == 2 and "ladder: ablate worker takes one rung's study" in err
    assert "model.dim=8 ~ladder name=tiny.w8" in err
    code, out, err = cli("status", path)  # status shows each rung's
    assert code == 0, err
    assert [line for line in out.splitlines() if line.startswith("ladder rung ")] == [
        "ladder rung w8:",
        "ladder rung w16:",
        "ladder rung w32:",
    ]
    assert "tiny.w16: not started (4 trials planned)" in out and "ladder report: follows" in out


def test_the_ladder_report_of_a_studys_rungs(write_study, capsys, tmp_path):
    """write_ladder_report as ``ablate run`` and ``ablate report`` call it once every rung is done
    (their training and per-rung reports are any study's; the whole command was run by hand)."""
    from types import SimpleNamespace

    from ablate.commands.ladder import write_ladder_report
    from ablate.study.ladder import per_rung
    from ablate.study.load import load_study

    study = load_study(write_study({"ladder": {**LADDER, "target": 1e6}, "seeds": [0, 1, 2]}))
    done = {}
    for i, (rung, sub) in enumerate(per_rung(study, check_files=False).items()):
        results = _rung_results(
            {"base": 100 * 4**i, "mlp": 120 * 4**i}, {"base": 0.2, "mlp": 0.25 + 0.05 * i}
        )
        results = results.rename(columns={"test.bpb": "test.ndcg@10"}).assign(differs="")
        done[rung] = (
            sub,
            SimpleNamespace(results=results, units=pd.DataFrame()),
            tmp_path / rung / "report.md",
        )
    paths = write_ladder_report(study, done, tmp_path / "report")
    text = paths["md"].read_text()
    assert "| w8 | 100 |" in text and "| w32 | 1,600 |" in text
    assert "**trend: grows**" in text and "mlp at 1e+06 parameters (extrapolation)" in text
    assert "ladder: mlp: trend: grows" in capsys.readouterr().out


@pytest.mark.heavy
def test_a_ladder_runs_then_its_report_and_trial_files_are_rebuilt(write_study, cli, tmp_path):
    """`ablate run` trains every rung and writes the ladder report; `ablate report --trials`
    rebuilds it from the stores and writes each rung's trials as files."""
    patch = {"ladder": {"rungs": RUNGS}, "train": {"epochs": 1}, "seeds": [0]}
    patch["model"] = {"attention": {"heads": 2}}
    path = write_study({**patch, "report": {"calibration": 0, "bootstrap": 100}})
    code, out, err = cli("run", path, "--quiet", "--reports", tmp_path / "reports")
    assert code == 0, err
    ladder = tmp_path / "reports" / "tiny" / "ladder.md"
    assert "| w8 |" in ladder.read_text() and "ladder: mlp: trend: " in out
    assert {p.name for p in (tmp_path / "reports" / "tiny").iterdir()} >= {"tiny.w8", "tiny.w16", "tiny.w32"}
    first = ladder.read_text()
    ladder.unlink()
    code, out, err = cli("report", path, "--reports", tmp_path / "reports", "--trials", tmp_path / "trials")
    assert code == 0, err
    assert ladder.read_text() == first  # the same report from the stores alone
    files = sorted(p.name for p in (tmp_path / "trials").iterdir())
    assert len(files) == 6 and all(f.endswith(".trial.json.gz") for f in files)  # 3 rungs × 2 variants
    assert "trials of w32: 2 file(s)" in err


def test_mup_style_width_scaling_gives_each_rung_its_hidden_matrices_lr(write_study, cli):
    from ablate.study.ladder import per_rung
    from ablate.study.load import load_study
    from ablate.training.trainer import Trainer

    path = write_study({"ladder": {**LADDER, "lr_base_dim": 16}, "model": {"attention": {"heads": 2}}})
    rungs = per_rung(load_study(path, check_files=False), check_files=False)
    assert [r.spec.train.param_groups[0].lr for r in rungs.values()] == pytest.approx([0.006, 0.003, 0.0015])
    w32 = rungs["w32"]
    optimizer = Trainer.start(w32, w32.variants["base"], 0, w32.task.load(), torch.device("cpu")).optimizer
    scaled = optimizer.param_groups[1]  # the rest first, at train.lr
    assert optimizer.param_groups[0]["lr"] == 0.003 and scaled["lr"] == pytest.approx(0.0015)
    assert {tuple(p.shape) for p in scaled["params"]} == {(96, 32), (32, 32)}  # qkv; out and the FFN
    assert all(p.dim() == 2 for p in scaled["params"])  # matrices only: no norm gain, no bias
    code, out, err = cli("validate", path)
    assert code == 0 and "ladder rung w32 (base): " in out and "matrices at lr 0.0015 (μP-style)" in out, err


@pytest.mark.heavy
def test_the_readmes_ladder_section_validates_as_written(tmp_path):
    """README "Does it hold at scale?": its yaml is the committed study's ladder, and its validate
    command, run from a clone's root, prints each rung's parameters."""
    import re
    import subprocess
    import sys

    import yaml

    repo = Path(__file__).resolve().parents[1]
    readme = (repo / "README.md").read_text()
    start = readme.index("\n## Does it hold at scale?\n")
    section = readme[start : readme.find("\n## ", start + 1)]
    [shown] = re.findall(r"```yaml\n(.*?)```", section, flags=re.S)
    [commands] = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    committed = yaml.safe_load((repo / "studies" / "ladder_minimind_lm.yaml").read_text())["ladder"]
    assert yaml.safe_load(shown)["ladder"] == committed
    validate = commands.strip().splitlines()[0]
    (tmp_path / "studies").symlink_to(repo / "studies", target_is_directory=True)
    (tmp_path / ".venv").symlink_to(Path(sys.prefix), target_is_directory=True)
    done = subprocess.run(["bash", "-c", validate], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    for rung, count in {"d32": "57,664", "d64": "213,632", "d128": "820,480", "d256": "3,213,824"}.items():
        assert f"ladder rung {rung} (base): {count} parameters" in done.stdout


def test_plan_says_what_every_rung_shares_once(write_study, cli):
    """The noise and effect given hold for every size: the assumptions once, one table for the
    rungs whose plans are alike, then the trend's degrees of freedom."""
    code, out, err = cli(
        "plan", write_study({"ladder": LADDER}), "--sd", "2%", "--effect", "2%", "--simulations", "50"
    )
    assert code == 0, err
    lines = out.splitlines()
    assert sum(line.startswith("effect: Δ = 2 % of the mean") for line in lines) == 1
    assert sum(line.startswith("noise: sd(d) = 2 % of the mean") for line in lines) == 1
    assert [line.strip() for line in lines if ": plan for " in line] == [
        "tiny, rungs w8, w16, w32 (each alike): plan for ndcg@10"
    ]
    assert lines[-1] == "ladder: 3 rungs, each planned alone; the trend over them: its slope on 1 df"

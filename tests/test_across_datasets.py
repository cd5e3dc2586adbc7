"""Several data sets in one study: a (variant, seed, data set) per trial, each data set's report,
and the across-data-set verdict checked against formulas computed here by hand (the effects' mean
and t interval, Cochran's Q and its parametric bootstrap, Paule–Mandel τ² and the prediction
interval)."""

from __future__ import annotations

import gc
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from ablate.data import catalog as datasets
from ablate.data.catalog import Dataset
from ablate.schema import Vocabulary
from ablate.stats.across import across_datasets, dataset_ranks
from ablate.tracking.results import load_results


def _results(base: list[float], variant: list[float], metric: str = "ndcg@10") -> pd.DataFrame:
    rows = [{"variant": "base", "seed": s, f"test.{metric}": x} for s, x in enumerate(base)]
    rows += [{"variant": "v", "seed": s, f"test.{metric}": x} for s, x in enumerate(variant)]
    return pd.DataFrame(rows)


def _compared(verdict: str, base_mean: float, margin: float) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {"variant": "base", "verdict": None, "margin": math.nan, "mean": base_mean},
            {"variant": "v", "verdict": verdict, "margin": margin, "mean": math.nan},
        ]
    )


def _by_hand(e: np.ndarray, v: np.ndarray, alpha: float = 0.05) -> dict[str, float]:
    """The effects' mean and its t interval, Cochran's Q, Paule–Mandel τ² (the τ² at which the
    generalised Q equals k − 1, else 0) and the prediction interval around its weighted mean, from
    their formulas."""
    from scipy.optimize import brentq

    k = len(e)
    w = 1 / v
    fixed = np.sum(w * e) / np.sum(w)
    q = np.sum(w * (e - fixed) ** 2)

    def excess(tau2: float) -> float:
        ws = 1 / (v + tau2)
        return np.sum(ws * (e - np.sum(ws * e) / np.sum(ws)) ** 2) - (k - 1)

    tau2 = 0.0 if excess(0.0) <= 0 else brentq(excess, 0.0, 10.0, xtol=1e-14)
    ws = 1 / (v + tau2)
    mu = np.sum(ws * e) / np.sum(ws)
    t1, t2 = stats.t.ppf(1 - alpha / 2, k - 1), stats.t.ppf(1 - alpha / 2, k - 2)
    half = t1 * e.std(ddof=1) / math.sqrt(k)
    pi = t2 * math.sqrt(tau2 + 1 / np.sum(ws))
    return {
        "effect": e.mean(),
        "ci_low": e.mean() - half,
        "ci_high": e.mean() + half,
        "effect_re": mu,
        "pi_low": mu - pi,
        "pi_high": mu + pi,
        "tau2": tau2,
        "q": q,
    }


def test_the_pooled_effect_is_the_random_effects_meta_analysis():
    rng = np.random.default_rng(3)
    levels = [0.2, 0.05, 0.08, 0.12]  # the metric sits at other levels on each data set
    per, compared, effects, variances = {}, {}, [], []
    for i, level in enumerate(levels):
        base = level + rng.normal(0, 0.004, 5)
        variant = base * (1.03 + 0.01 * i) + rng.normal(0, 0.002, 5)
        per[f"d{i}"] = _results(list(base), list(variant))
        compared[f"d{i}"] = _compared("better", base.mean(), 0.02 * base.mean())
        d = variant - base
        effects.append(d.mean() / base.mean())
        variances.append(d.var(ddof=1) / len(d) / base.mean() ** 2)
    table = across_datasets(per, compared, "ndcg@10", "base", True, 0.05)
    row = table.set_index("variant").loc["v"]
    expected = _by_hand(np.array(effects), np.array(variances))
    for key, value in expected.items():
        assert row[key] == pytest.approx(value, rel=1e-6, abs=1e-12), key
    # Q's p by parametric bootstrap: each data set's mean N(0, v), its variance v χ²₄ / 4 (5 seeds),
    # drawn here with another generator
    v = np.array(variances)
    draws = np.random.default_rng(11)
    means = draws.standard_normal((200_000, 4)) * np.sqrt(v)
    var = v * draws.chisquare(4, (200_000, 4)) / 4
    w = 1 / var
    q = np.sum(w * means**2, 1) - np.sum(w * means, 1) ** 2 / np.sum(w, 1)
    p = np.mean(q >= expected["q"])
    assert row["p_homogeneity"] == pytest.approx(p, abs=4 * math.sqrt(p * (1 - p) / 20_000) + 1e-3)
    assert row["p_homogeneity"] > stats.chi2.sf(expected["q"], 3)  # the χ² p takes v as known
    assert row["datasets"] == 4 and row["margin"] == pytest.approx(0.02)
    assert row["verdict"] == ("generalises (better)" if expected["pi_low"] > 0 else "unknown")
    assert row["per_dataset"] == "d0: better; d1: better; d2: better; d3: better"


def test_opposite_effects_vary_and_noise_is_unknown():
    """Effects of +30 % and −30 %, each to ±1 % over its seeds: the bootstrap Q test rejects, so the
    verdict is "varies". Opposite verdicts alone do not make it (only that test does), but they keep
    "generalises" away."""
    per = {
        "a": _results([0.10, 0.11, 0.10], [0.131, 0.142, 0.130]),
        "b": _results([0.10, 0.11, 0.10], [0.069, 0.078, 0.071]),
        "c": _results([0.10, 0.11, 0.10], [0.10, 0.112, 0.099]),
    }
    compared = {
        "a": _compared("better", 0.103, 0.002),
        "b": _compared("worse", 0.103, 0.002),
        "c": _compared("inconclusive", 0.103, 0.002),
    }
    row = across_datasets(per, compared, "ndcg@10", "base", True, 0.05).iloc[0]
    assert row["verdict"] == "varies" and row["p_homogeneity"] < 0.01
    agree = {k: _results([0.10, 0.11, 0.10], [0.131, 0.142, 0.130]) for k in "abc"}
    mixed = {"a": compared["a"], "b": compared["b"], "c": compared["a"]}  # verdicts at odds with Δ
    row = across_datasets(agree, mixed, "ndcg@10", "base", True, 0.05).iloc[0]
    assert row["p_homogeneity"] > 0.5 and row["pi_low"] > 0 and row["verdict"] == "unknown"
    noisy = {k: _results([0.10, 0.12, 0.09], [0.11, 0.10, 0.10]) for k in "abc"}
    same = {k: _compared("inconclusive", 0.103, 0.002) for k in "abc"}
    assert across_datasets(noisy, same, "ndcg@10", "base", True, 0.05)["verdict"].item() == "unknown"
    # A lower-is-better metric: a variant that lowers it everywhere generalises as better.
    lower = {k: _results([1.0, 1.1, 1.05], [0.80, 0.89, 0.84]) for k in "abc"}
    got = across_datasets(lower, same, "ndcg@10", "base", False, 0.05)["verdict"].item()
    assert got == "generalises (better)"


def test_ranks_over_datasets_are_friedmans_with_datasets_as_blocks():
    per = {}
    for i in range(4):
        rows = [
            {"variant": v, "seed": s, "test.ndcg@10": x + i}
            for s in range(2)
            for v, x in zip("abc", (3, 2, 1), strict=True)
        ]
        per[f"d{i}"] = pd.DataFrame(rows)
    ranks = dataset_ranks(per, "ndcg@10", True, 0.05)
    assert ranks["ranks"] == {"a": 1.0, "b": 2.0, "c": 3.0} and ranks["n_seeds"] == 4
    chi2 = stats.friedmanchisquare([3, 3, 3, 3], [2, 2, 2, 2], [1, 1, 1, 1]).statistic
    assert ranks["statistic"] == pytest.approx(chi2)


def _tiny_registry(folder, monkeypatch, names=("tiny-a", "tiny-b", "tiny-c")):
    """Tiny one-line-per-user data sets in a mirror at ``folder``, named in the registry."""
    import hashlib

    entries = {}
    for i, name in enumerate(names):
        rng = np.random.default_rng(i)
        lines = [" ".join(map(str, [u, *rng.integers(1, 40, 12)])) for u in range(1, 41)]
        rel = f"tiny/{name}.txt"
        (folder / "tiny").mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text("\n".join(lines) + "\n")
        sha = hashlib.sha256((folder / rel).read_bytes()).hexdigest()
        entries[name] = Dataset(
            name,
            name,
            "seqrec",
            {"format": "user_lines"},
            "loo",
            rel,
            {rel: (sha, 0)},
            "",
            "licence",
            "cite",
            True,
        )
    monkeypatch.setattr(datasets, "registry", lambda: Vocabulary("data set", entries))
    monkeypatch.setenv(datasets.MIRROR_ENV, str(folder))


@pytest.fixture(scope="module")
def empty_store(tmp_path_factory):
    """An MLflow store with no experiment, at the installed MLflow's schema. MLflow makes a new
    SQLite store by running its ~140 Alembic migrations (4–5 s on a loaded 2-core machine): the
    test makes one and copies it where each data set's store goes, the run then fills each."""
    from mlflow import MlflowClient

    path = tmp_path_factory.mktemp("store") / "mlflow.db"
    MlflowClient(f"sqlite:///{path}").search_experiments()
    return path


def _rows(out: str, first: str) -> list[list[str]]:
    """The cells of the table rows of ``out`` (rich's box drawing) whose first cell is ``first``."""
    cells = [[c.strip() for c in line.strip("│ ").split("│")] for line in out.splitlines() if "│" in line]
    return [c for c in cells if c[0] == first]


@pytest.mark.heavy
def test_a_study_over_two_datasets_trains_each_and_reports_across(
    write_study, cli, tmp_path, monkeypatch, empty_store
):
    """validate, plan, status, run, report (--trials) of a study over two data sets; run's
    --gpus and --launcher slurm go through each data set's study in turn."""
    import shutil

    from ablate.commands import gpus, running, slurm

    monkeypatch.setenv("COLUMNS", "250")  # no table cell cut short
    _tiny_registry(tmp_path / "mirror", monkeypatch)
    study = write_study(
        {
            "task": {"max_len": 8},
            "train": {"epochs": 1},
            "metrics": {"also": []},
            # the per-data-set statistics are not under test; an absolute margin for --sd
            "report": {"calibration": 0, "bootstrap": 200, "margin": 0.01},
        },
        replace={"task.data": ["tiny-a", {"name": "tiny-b", "k_core": 2}]},
    )
    runs = tmp_path / "runs" / "tiny"
    code, out, err = cli("validate", study)
    assert code == 0 and out.count(": valid") == 2, err
    # Before the run: each data set's study not started, the across-data-set step waiting.
    code, out, err = cli("status", study)
    assert code == 0, err
    assert "tiny.tiny-a: not started (4 trials planned)" in out and "tiny.tiny-b: not started" in out
    assert "across data sets: 0 of 2 data sets finished; across_datasets.md follows the last" in out
    # The plan: each data set's, then the trials summed over them.
    code, out, err = cli("plan", study, "--sd", "0.01", "--effect", "0.02")
    assert code == 0, err
    assert "tiny.tiny-a: plan for ndcg@10" in out and "tiny.tiny-b: plan for ndcg@10" in out
    ours = _rows(out, "the study's 2 seeds")  # each data set's row, then the total's
    assert [r[-2:] for r in ours[:2]] == [["2", "4"], ["2", "4"]] and ours[2][-3:] == ["4", "4", "8"]
    assert "with 2 it can say only varies or unknown" in out
    for name in ("tiny-a", "tiny-b"):  # where each data set's store goes: a copy of an empty one
        (runs / name).mkdir(parents=True)
        shutil.copy(empty_store, runs / name / "mlflow.db")
    # Each data set's report is read, not drawn, until `ablate report` below draws them (their
    # figures take most of a report's time); the across-data-set report is written from them.
    drawn = {"md": tmp_path / "report.md", "html": tmp_path / "report.html"}
    write_report = running.write_study_report
    monkeypatch.setattr(running, "write_study_report", lambda uri, name, *_: (drawn, load_results(uri, name)))
    # Each trial starts with a full garbage collection (ablate.training.memory: its memory peak is its own);
    # the objects this process holds by now (torch, MLflow, …) are left out of them.
    gc.freeze()
    try:
        code, out, err = cli("run", study)
    finally:
        gc.unfreeze()
    assert code == 0, err
    for name in ("tiny-a", "tiny-b"):  # each data set its own experiment: (variant, seed, data set)
        got = load_results(f"sqlite:///{runs / name / 'mlflow.db'}", f"tiny.{name}")
        assert sorted(zip(got.results["variant"], got.results["seed"], strict=True)) == [
            ("base", 0),
            ("base", 1),
            ("mlp", 0),
            ("mlp", 1),
        ]
    table = pd.read_csv(runs / "report" / "across_datasets.csv")
    assert table["variant"].tolist() == ["mlp"] and table["datasets"].item() == 2
    assert "across data sets: mlp:" in out
    # Status after it: each data set done, the across-data-set report written; with a third data
    # set listed (not run), two of three finished.
    code, out, err = cli("status", study)
    assert code == 0 and out.count("4/4 trials done") == 2, err
    assert f"across data sets: every data set finished: {runs / 'report' / 'across_datasets.md'}" in out
    code, out, err = cli("status", study, "task.data=[tiny-a,tiny-b,tiny-c]")
    assert code == 0 and "tiny.tiny-c: not started" in out, err
    assert "across data sets: 2 of 3 data sets finished (tiny-a, tiny-b)" in out
    # A pilot folder of such a study gives each data set its own noise.
    code, out, err = cli("plan", study, "--pilot", runs)
    assert code == 0, err
    for name in ("tiny-a", "tiny-b"):
        assert f"in {runs / name}" in out
    # The reports from the stores alone, elsewhere: each data set's and its trial files, then the
    # one across them, with the same numbers.
    monkeypatch.setattr(running, "write_study_report", write_report)
    code, out, err = cli("report", study, "--reports", tmp_path / "paper", "--trials", tmp_path / "trials")
    assert code == 0, err
    assert "trials of tiny-a: 4 file(s)" in err and "trials of tiny-b: 4 file(s)" in err
    files = sorted(p.name for p in (tmp_path / "trials").iterdir())
    assert len(files) == 8 and len({f.rsplit("-", 1)[1] for f in files}) == 4  # 2 fingerprints × 2 variants
    for name in ("tiny-a", "tiny-b"):
        assert (tmp_path / "paper" / "tiny" / f"tiny.{name}" / "report.md").exists()
    md = (tmp_path / "paper" / "tiny" / "across_datasets.md").read_text()
    assert "| mlp |" in md and "[tiny-a](tiny.tiny-a/report.md)" in md
    assert "| tiny-a: —; tiny-b: — |" in md  # 2 seeds: no verdict on either data set
    again = pd.read_csv(tmp_path / "paper" / "tiny" / "across_datasets.csv")
    pd.testing.assert_frame_equal(again, table)
    # --launcher slurm: every data set's array submitted before the first is followed (a lost login
    # shell loses no data set); --gpus: each data set's workers in turn (nothing is left to train).
    calls = []
    monkeypatch.setattr(running, "write_study_report", lambda uri, name, *_: (drawn, load_results(uri, name)))

    def start(study, stores, workers, settings, *rest):
        calls.append(("submitted", study.name, stores.output_dir.name))
        return [f"{study.name}-array"]

    def jobs(study, stores, workers, quiet, settings, retry_failed, donors, submitted):
        calls.append((study.name, workers, settings.partition, submitted))
        return 4, []

    monkeypatch.setattr(slurm, "start_jobs", start)
    monkeypatch.setattr(slurm, "run_jobs", jobs)
    code, _, err = cli("run", study, "--launcher", "slurm", "--partition", "p", "-w", "3")
    assert code == 0, err
    assert calls == [
        ("submitted", "tiny.tiny-a", "tiny-a"),
        ("submitted", "tiny.tiny-b", "tiny-b"),
        ("tiny.tiny-a", 3, "p", ["tiny.tiny-a-array"]),
        ("tiny.tiny-b", 3, "p", ["tiny.tiny-b-array"]),
    ]
    del calls[:2]
    slurm.record(runs / "tiny-b", [("17", "log", "errors")])  # as a submission of tiny-b's jobs would
    monkeypatch.setattr(slurm, "cancel", lambda ids: ids)
    code, out, err = cli("cancel", study)
    assert code == 0 and "tiny.tiny-a: no SLURM jobs recorded" in out, err
    assert "tiny.tiny-b: cancelled 1 of 1 SLURM job(s) 17" in out

    def workers(study, stores, count, quiet, retry_failed, placed, donors):
        calls.append((study.name, count, placed.devices))
        return 4, []

    monkeypatch.setattr(gpus, "cuda_device_count", lambda: 2)
    monkeypatch.setattr(running, "run_workers", workers)
    code, _, err = cli("run", study, "--gpus", "all", "--per-gpu", "2")
    assert code == 0 and calls[2:] == [("tiny.tiny-a", 4, ("0", "1")), ("tiny.tiny-b", 4, ("0", "1"))], err
    pd.testing.assert_frame_equal(pd.read_csv(runs / "report" / "across_datasets.csv"), table)


def test_a_list_of_datasets_names_them(write_study, cli, tmp_path, monkeypatch):
    _tiny_registry(tmp_path / "mirror", monkeypatch)
    for data, said in [
        ([], "task.data: an empty list"),
        (["tiny-a", "tiny-a"], "task.data.1: data set 'tiny-a' is listed twice"),
        (
            ["tiny-a", {"format": "user_lines", "path": "x.txt"}],
            "task.data.1: a list of data sets holds names",
        ),
        (["tiny-d"], "unknown data set 'tiny-d'"),
    ]:
        code, _, err = cli("validate", write_study(replace={"task.data": data}))
        assert code == 2 and said in err and len(err.strip().splitlines()) == 1, err


def test_the_notebook_call_and_a_worker_take_one_dataset(write_study, cli, tmp_path, monkeypatch):
    import ablate
    from ablate.errors import AblateError

    _tiny_registry(tmp_path / "mirror", monkeypatch)
    study = write_study(replace={"task.data": ["tiny-a", "tiny-b"]})
    with pytest.raises(
        AblateError, match=r"task.data lists data sets: ablate.run takes one \(task.data=NAME\)"
    ):
        ablate.run(study, quiet=True)
    code, _, err = cli("worker", study)  # it would train the first data set under the study's name
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "ablate worker takes one data set's study (`'task.data=\"tiny-a\"' name=tiny.tiny-a`" in err
    assert not (tmp_path / "runs").exists()

"""ablate.report: files, self-contained HTML, round-trip of results.csv, n/a rendering, LaTeX,
and a report rebuilt from an MLflow store written by hand."""

from __future__ import annotations

import json
import re
import time

import numpy as np
import pandas as pd
import pytest

from ablate.report import format_table, latex_table, tex_escape, write_report
from ablate.stats import ReportSettings, compare

FIGURES = {
    "seeds": "seeds.png",
    "seeds:hr@10": "seeds_hr_at_10.png",
    "cost_quality": "cost_quality.png",
    "cd": "cd.png",
    "pairwise_fig": "pairwise.png",
    "curves": "curves.png",
}

VARIANTS = {"base": ("—", 0.0), "softmax-attn": ("attention", -0.03), "swiglu-ffn": ("ffn", 0.02)}


def study(seeds: int, units: bool = True, curves: bool = True):
    rng = np.random.default_rng(7)
    rows, urows, crows = [], [], []
    for v, (differs, eff) in VARIANTS.items():
        for s in range(seeds):
            x = 0.30 + eff + rng.normal(0, 0.004)
            rows.append(
                {
                    "variant": v,
                    "seed": s,
                    "differs": differs,
                    "test.ndcg@10": x,
                    "test.hr@10": x + 0.2,
                    "valid.ndcg@10": x + 0.01,
                    "valid.hr@10": x + 0.21,
                    "params": 12_345 + len(v),
                    "tokens_per_s": 5000.0 + s,
                    "peak_memory_mb": 321.5,
                    "wall_s": 12.25,
                    "epochs": 8,
                    "trial": f"{v}/{s}",
                }
            )
            if units:
                hit = rng.random(40) < 0.5 + eff
                urows += [
                    {
                        "variant": v,
                        "seed": s,
                        "unit": f"u{u}",
                        "ndcg@10": float(hit[u]) * 0.6,
                        "hr@10": float(hit[u]),
                    }
                    for u in range(40)
                ]
            if curves:
                crows += [
                    {
                        "variant": v,
                        "seed": s,
                        "epoch": e,
                        "metric": "ndcg@10",
                        "value": x - 0.1 * np.exp(-e / 2) + rng.normal(0, 0.003),
                    }
                    for e in range(8)
                ]
    cols = {
        "units": ["variant", "seed", "unit", "ndcg@10", "hr@10"],
        "curves": ["variant", "seed", "epoch", "metric", "value"],
    }
    return (
        pd.DataFrame(rows),
        pd.DataFrame(urows, columns=cols["units"]),
        pd.DataFrame(crows, columns=cols["curves"]),
    )


def settings(**kw) -> ReportSettings:
    return ReportSettings(
        **{
            "study": "toy-study",
            "primary": "ndcg@10",
            "metrics": ["ndcg@10", "hr@10"],
            "bootstrap": 1000,
            "notes": ["device: cpu"],
            "calibration": 20,
            **kw,
        }
    )


@pytest.fixture(scope="module")
def report4(tmp_path_factory):
    """One 4-seed report (figures take most of a report's time), read by several tests."""
    out = tmp_path_factory.mktemp("report4")
    results, units, curves = study(seeds=4)
    return out, (results, units, curves), write_report(results, units, curves, settings(calibration=30), out)


def test_write_report_files_and_self_contained_html(report4):
    tmp_path, (results, units, curves), paths = report4
    for name in ("md", "html", "csv", "comparisons", "pairwise", "tex", *FIGURES):
        assert paths[name].is_file() and paths[name].stat().st_size > 0, name
    for name, file in FIGURES.items():
        assert paths[name] == tmp_path / "figures" / file
        assert paths[name].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    page = paths["html"].read_text(encoding="utf-8")
    assert page.count("data:image/png;base64,") == len(FIGURES)
    assert 'src="figures/' not in page  # nothing outside the file
    for v in VARIANTS:
        assert v in page
    base_mean = compare(results, units, settings(), "ndcg@10").set_index("variant").loc["base", "mean"]
    assert f"{base_mean:.4f}" in page
    assert "toy-study" in page and "device: cpu" in page and "Holm" in page and "Friedman" in page
    assert '<div class="wrap"><table>' in page  # wide tables scroll instead of overflowing

    md = paths["md"].read_text(encoding="utf-8")
    assert md.startswith("# Ablation report: toy-study")
    assert "## Primary metric: ndcg@10" in md and "## Secondary metric: hr@10" in md
    assert "figures/seeds.png" in md and "family of 2 comparisons" in md
    for file in FIGURES.values():
        assert f"](figures/{file})" in md
    assert "12,357" in md  # params of 'base' in the cost table
    assert "▼" in md  # softmax-attn is 10 sd worse on every seed
    assert "smoothed studentized bootstrap" in md
    # the pairwise family: 3 pairs, every one significant (effects of 5–13 sd)
    assert "Holm over the family of 3 pairs" in md and "swiglu-ffn − softmax-attn = +0.0" in md
    pairs = pd.read_csv(paths["pairwise"])
    assert list(zip(pairs.a, pairs.b, strict=True)) == [
        ("base", "softmax-attn"),
        ("base", "swiglu-ffn"),
        ("softmax-attn", "swiglu-ffn"),
    ]
    assert pairs["significant"].all()
    tex = paths["tex"].read_text(encoding="utf-8")
    assert r"\toprule" in tex and "softmax-attn" in tex and r"$\downarrow$" in tex


def test_calibration_section_states_tests_alpha_correction_and_rates(report4):
    md = report4[2]["md"].read_text(encoding="utf-8")
    section = md[md.index("## Calibration") : md.index("## Files")]
    assert "paired t-test across seeds" in section
    assert "Wilcoxon signed-rank across evaluation units" in section
    assert "α = 0.05; correction: Holm" in section
    assert "Families: 2 comparisons with base per metric and per test" in section
    assert "with a p-value: 4 seed-test and 4 unit-test comparisons over the 2 metrics" in section
    assert "3 pairs in the pairwise family" in section
    assert "30 null comparisons in 15 synthetic studies shaped like this one (4 seeds × 2 variants" in section
    for what in (
        "Raw seed-test p < α:",
        "family-wise rate",
        "Power: a planted effect of paired d = ",
        "CI coverage: the 95% interval contained the true Δ = 0 in",
    ):
        assert what in section, what
    rate = re.search(r"Raw seed-test p < α: ([0-9.]+)% \(± ([0-9.]+)%, n = 30\)", section)
    assert rate and 0 <= float(rate[1]) <= 100
    # the same numbers as stats.calibrate with these settings
    from ablate.stats import calibrate

    cal = calibrate(settings(calibration=30), 4, 2, bootstrap=1000)
    assert f"Raw seed-test p < α: {cal['fpr_raw']:.1%}" in section
    assert f"in {cal['ci_coverage']:.1%}" in section


def test_results_csv_round_trips(report4):
    _, (results, _, _), paths = report4
    back = pd.read_csv(paths["csv"])
    assert len(back) == 4 * len(VARIANTS)  # one row per trial
    assert list(back.columns) == list(results.columns)
    pd.testing.assert_frame_equal(back, results, check_dtype=False, check_exact=False, rtol=1e-12)
    cmp = pd.read_csv(paths["comparisons"])
    assert set(cmp["metric"]) == {"ndcg@10", "hr@10"} and len(cmp) == 2 * len(VARIANTS)


def test_two_seed_study_says_na(tmp_path):
    results, units, curves = study(seeds=2)
    paths = write_report(results, units, curves, settings(), tmp_path)
    md = paths["md"].read_text(encoding="utf-8")
    html_text = paths["html"].read_text(encoding="utf-8")
    assert "n/a (2 seeds)" in md and "n/a (2 seeds)" in html_text
    assert "[n/a (2 seeds)]" in md  # no CI either: the smoothed bootstrap-t needs 3 seeds
    cmp = pd.read_csv(paths["comparisons"])
    assert cmp["p_seeds"].isna().all() and not cmp["significant"].any()
    assert cmp["ci_low"].isna().all()
    assert pd.read_csv(paths["pairwise"])["p"].isna().all()
    assert "0 pairs with a test (3 n/a" in md
    assert "False-positive rate: n/a (2 seeds)" in md and "CI coverage: n/a (2 seeds)" in md
    pairwise_text = next(line for line in md.splitlines() if line.startswith("All pairs on test"))
    assert "p = " not in pairwise_text and pairwise_text.endswith(": none.")  # no made-up p-value


def test_without_units_or_curves(tmp_path):
    results, units, curves = study(seeds=3, units=False, curves=False)
    paths = write_report(results, units, curves, settings(), tmp_path)
    assert "curves" not in paths and not (tmp_path / "figures" / "curves.png").exists()
    md = paths["md"].read_text(encoding="utf-8")
    assert "n/a (no units)" in md and "## Learning curves" not in md
    assert paths["html"].read_text(encoding="utf-8").count("data:image/png;base64,") == len(FIGURES) - 1


def test_format_table_is_the_primary_markdown_table():
    results, units, _ = study(seeds=4)
    s = settings()
    table = format_table(compare(results, units, s, "ndcg@10"), s)
    lines = table.splitlines()
    assert lines[0].startswith("| variant | differs | ndcg@10 mean ± sd | Δ [95% CI]")
    assert "P(>base)" in lines[0]
    assert len(lines) == 2 + len(VARIANTS)
    assert lines[2].startswith("| base | — |")
    low = ReportSettings(study="x", primary="ndcg@10", higher_is_better={"ndcg@10": False}, bootstrap=100)
    assert "P(<base)" in format_table(compare(results, units, low, "ndcg@10"), low)


def test_single_variant_study_has_no_friedman(tmp_path):
    results, units, curves = study(seeds=3)
    keep = results["variant"].isin(["base", "swiglu-ffn"])
    paths = write_report(results[keep], units, curves, settings(), tmp_path)
    assert "cd" not in paths
    md = paths["md"].read_text(encoding="utf-8")
    assert "Friedman test: not available" in md
    assert "pairwise_fig" in paths and "family of 1 pair with a test" in md
    assert "(1 seeds" not in md and "3 seeds × 1 variant + baseline" in md


def test_latex_table_escapes_specials():
    assert tex_escape("a_b&c%d$e#f{g}h~i^j\\k") == (
        r"a\_b\&c\%d\$e\#f\{g\}h\textasciitilde{}i\textasciicircum{}j\textbackslash{}k"
    )
    assert tex_escape("0.30 ± 0.01 −∞ — Δ ▲ <0.001") == (
        r"0.30 $\pm$ 0.01 $-$$\infty$ --- $\Delta$ $\uparrow$ \textless{}0.001"
    )
    results, units, _ = study(seeds=3)
    results = results.replace({"variant": {"swiglu-ffn": "ffn_x2 & 50%"}, "differs": {"ffn": "ffn{#1}"}})
    s = settings(study="my_study")
    tex = latex_table(compare(results, units, s, "ndcg@10"), s)
    assert r"ffn\_x2 \& 50\%" in tex and r"ffn\{\#1\}" in tex and "ffn_x2" not in tex
    assert r"\begin{tabular}{llrrrrrrrc}" in tex and r"\toprule" in tex and r"\bottomrule" in tex
    assert r"Ablation study my\_study" in tex and r"\label{tab:ablate:my_study:ndcg-10}" in tex
    body = tex[tex.index(r"\toprule") : tex.index(r"\bottomrule")]
    rows = [line for line in body.splitlines() if line.endswith(r"\\")]
    assert len(rows) == 1 + len(VARIANTS)
    for line in rows:  # every row has the header's 10 cells: 9 unescaped column separators
        assert len(re.findall(r"(?<!\\)&", line)) == 9, line
    assert all(ord(c) < 128 for c in tex.replace("—", "")), "non-ASCII left in table.tex"


def test_pipes_in_names_do_not_break_markdown():
    results, units, _ = study(seeds=3)
    results = results.replace({"variant": {"swiglu-ffn": "my|variant"}})
    s = settings()
    table = format_table(compare(results, units, s, "ndcg@10"), s)
    assert "| my\\|variant |" in table


def write_store(tmp_path, seeds: int = 3, epochs: int = 3) -> str:
    """An MLflow store written by hand, shaped as ``ablate run`` writes it (see ablate/track.py):
    a parent run tagged ``ablate.role=study`` with the report settings, one child run per trial
    tagged ``ablate.role=trial``, metric names with '@' stored as '_at_', per-epoch validation
    history, the per-unit test metrics as the artifact ``units/test.csv``; plus one FAILED trial
    that the report must leave out."""
    from mlflow import MlflowClient
    from mlflow.entities import Metric

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = client.create_experiment("hand", artifact_location=(tmp_path / "artifacts").as_uri())
    stored = {
        "study": "hand",
        "primary": "ndcg@10",
        "metrics": ["ndcg@10", "hr@10"],
        "baseline": "base",
        "alpha": 0.05,
        "correction": "holm",
        "bootstrap": 500,
        "calibration": 20,
        "higher_is_better": {"ndcg@10": True, "hr@10": True},
        "variants": list(VARIANTS),
    }
    parent = client.create_run(
        exp, run_name="hand", tags={"ablate.role": "study", "ablate.report_settings": json.dumps(stored)}
    )
    results, units, curves = study(seeds)
    ts = int(time.time() * 1000)
    for i, r in enumerate(results.to_dict("records")):
        run = client.create_run(
            exp,
            run_name=f"{r['variant']}-s{r['seed']}",
            tags={
                "mlflow.parentRunId": parent.info.run_id,
                "ablate.role": "trial",
                "variant": r["variant"],
                "seed": str(r["seed"]),
                "trial": str(i),
                "differs": r["differs"],
                "component.ffn": r["differs"],
            },
        )
        rid = run.info.run_id
        final = {
            "test.ndcg_at_10": r["test.ndcg@10"],
            "test.hr_at_10": r["test.hr@10"],
            "epochs": epochs,
            **{k: r[k] for k in ("params", "tokens_per_s", "peak_memory_mb", "wall_s")},
        }
        metrics = [Metric(k, float(v), ts, 0) for k, v in final.items()]
        c = curves[(curves.variant == r["variant"]) & (curves.seed == r["seed"])]
        metrics += [
            Metric("valid.ndcg_at_10", float(x.value), ts, int(x.epoch) + 1)
            for x in c.itertuples()
            if x.epoch < epochs
        ]
        metrics += [Metric("train.loss", 1.0 / (e + 1), ts, e + 1) for e in range(epochs)]
        client.log_batch(rid, metrics=metrics)
        unit_file = tmp_path / "test.csv"
        u = units[(units.variant == r["variant"]) & (units.seed == r["seed"])]
        u = u.drop(columns=["variant", "seed"])
        u.to_csv(unit_file, index=False)
        client.log_artifact(rid, str(unit_file), artifact_path="units")
        client.set_terminated(rid, "FINISHED")
    failed = client.create_run(
        exp,
        tags={
            "mlflow.parentRunId": parent.info.run_id,
            "ablate.role": "trial",
            "variant": "broken",
            "seed": "0",
            "differs": "x",
        },
    )
    client.log_batch(failed.info.run_id, metrics=[Metric("test.ndcg_at_10", 0.9, ts, 0)])
    client.set_terminated(failed.info.run_id, "FAILED")
    return uri


def test_report_rebuilt_from_a_hand_written_mlflow_store(tmp_path):
    import ablate
    from ablate.results import load_results

    uri = write_store(tmp_path / "store")
    loaded = load_results(uri, "hand")
    assert len(loaded.results) == 3 * len(VARIANTS) and "broken" not in set(loaded.results["variant"])
    assert {"test.ndcg@10", "test.hr@10", "params", "wall_s", "component.ffn"} <= set(loaded.results.columns)
    assert len(loaded.units) == 3 * len(VARIANTS) * 40
    assert set(loaded.curves["metric"]) == {"valid.ndcg@10", "train.loss"}
    # the store was written as older versions wrote it: the settings tag a plain JSON mapping
    s = loaded.settings
    assert isinstance(s, ReportSettings) and s.primary == "ndcg@10" and s.calibration == 20
    assert s.variants == list(VARIANTS) and s.bootstrap == 500
    out = tmp_path / "reports" / "hand"
    paths = write_report(loaded.results, loaded.units, loaded.curves, s, out)
    for name in ("md", "html", "csv", "comparisons", "pairwise", "tex", *FIGURES):
        assert paths[name].is_file(), name
    md = paths["md"].read_text(encoding="utf-8")
    assert md.startswith("# Ablation report: hand") and "▼" in md and "n/a (no units)" not in md
    assert "20 null comparisons" in md
    assert paths["html"].read_text(encoding="utf-8").count("data:image/png;base64,") == len(FIGURES)
    back = pd.read_csv(paths["csv"])
    assert len(back) == 9 and set(back["variant"]) == set(VARIANTS)
    # the numbers are the ones the trials logged, to MLflow's float precision
    cmp = pd.read_csv(paths["comparisons"]).set_index(["metric", "variant"])
    results, units, _ = study(3)
    direct = compare(results, units, s, "ndcg@10").set_index("variant")
    for v in VARIANTS:
        assert cmp.loc[("ndcg@10", v), "mean"] == pytest.approx(direct.loc[v, "mean"], rel=1e-9)
    assert cmp.loc[("ndcg@10", "swiglu-ffn"), "p_units"] == pytest.approx(direct.loc["swiglu-ffn", "p_units"])

    # the public API: the per-trial frame, or everything with full=True
    frame = ablate.load_results(uri, "hand")
    assert isinstance(frame, pd.DataFrame)
    pd.testing.assert_frame_equal(frame, loaded.results)
    full = ablate.load_results(uri, "hand", full=True)
    assert len(full.units) == len(loaded.units) and not full.curves.empty


def test_regenerating_a_report_is_byte_identical_and_leaves_numpy_rng_alone(tmp_path):
    results, units, curves = study(seeds=3)
    np.random.seed(123)
    expected_next = np.random.random()
    np.random.seed(123)
    first = write_report(results, units, curves, settings(calibration=0), tmp_path / "a")
    assert np.random.random() == expected_next  # the caller's global RNG stream is untouched
    second = write_report(results, units, curves, settings(calibration=0), tmp_path / "b")
    assert first["html"].read_bytes() == second["html"].read_bytes()
    second_md = second["md"].read_text().replace(str(tmp_path / "b"), str(tmp_path / "a"))
    assert first["md"].read_text() == second_md

"""ablate.report: files, self-contained HTML, round-trip of results.csv, n/a rendering, LaTeX,
the verdicts in words, the paper-shaped layout (results first, Methods after), table.tex with
every metric, convergence warnings, the recorded meta (data, configuration, version, commit),
CPU-time costs, and a report rebuilt from an MLflow store written by hand."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time

import numpy as np
import pandas as pd
import pytest

from ablate.report import (
    format_table,
    latex_table,
    not_converged,
    overview_latex,
    overview_rows,
    tex_escape,
    write_report,
)
from ablate.report.document import Strong
from ablate.report.figures import cost_time
from ablate.report.methods import DEFAULT_COST_NOTE
from ablate.stats import ReportSettings, compare, comparisons
from ablate.stats.power import seeds_for_difference
from ablate.stats.verdicts import difference_power

# every report of ``study`` draws these (the critical-difference diagram only when its seeds
# support one: see test_ranking)
FIGURES = {
    "seeds": "seeds.png",
    "seeds:hr@10": "seeds_hr_at_10.png",
    "cost_quality": "cost_quality.png",
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
    assert page.count("data:image/png;base64,") == len(FIGURES) + ("cd" in paths)
    assert 'src="figures/' not in page  # nothing outside the file
    for v in VARIANTS:
        assert v in page
    base_mean = compare(results, units, settings(), "ndcg@10").set_index("variant").loc["base", "mean"]
    assert f"{base_mean:.4f}" in page
    assert "toy-study" in page and "device: cpu" in page and "Holm" in page and "Friedman" in page
    assert '<div class="wrap"><table>' in page  # wide tables scroll instead of overflowing

    md = paths["md"].read_text(encoding="utf-8")
    assert md.startswith("# Ablation report: toy-study")
    assert "## Primary metric: ndcg@10" in md and "## Secondary metric (exploratory): hr@10" in md
    assert "figures/seeds.png" in md and "family of 2 tested comparisons" in md
    for file in FIGURES.values():
        assert f"](figures/{file})" in md
    assert "12,357" in md  # params of 'base' in the cost table
    assert "worse ▼" in md and "better ▲" in md  # softmax-attn is 10 sd worse on every seed
    assert "smoothed studentized bootstrap" in md  # named where the tables leave it out
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


def test_calibration_section_states_families_and_the_verdicts_rates(report4):
    md = report4[2]["md"].read_text(encoding="utf-8")
    section = md[md.index("### Calibration") : md.index("## Files")]
    assert "paired t intervals at Holm decision levels, α = 0.05" in section
    assert "tested comparisons with base (2 on ndcg@10, 2 on hr@10); not corrected across metrics" in section
    assert "The 3 pairs of the pairwise comparison form a separate family" in section
    assert "4 seeds × 2 variants + baseline" in section
    for what in (
        "A/A, every variant identical to the baseline (30 comparisons in 15 studies): called better",
        "studies with any:",
        "False equivalence, every true Δ = ± the margin (30 comparisons): said to lie inside the margin",
        "Power: one variant better by Δ = ",
        "Coverage: the decision intervals held the true Δ in",
    ):
        assert what in section, what
    rate = re.search(r"called better or worse in ([0-9.]+)% \(± ([0-9.]+)%, n = 30\)", section)
    assert rate and 0 <= float(rate[1]) <= 100
    # the same numbers as stats.calibrate for this study's shape (its mean and pooled sd)
    from ablate.stats import calibrate

    primary = pd.read_csv(report4[2]["comparisons"]).query("metric == 'ndcg@10'")
    sd = float(np.sqrt(np.mean(np.square(primary["sd_diff"].dropna()))))
    cal = calibrate(settings(calibration=30), 4, 2, mean=float(primary["mean"].iloc[0]), sd=sd)
    assert f"called better or worse in {cal['false_verdict']:.1%}" in section
    assert f"held the true Δ in {cal['coverage']:.1%}" in section
    assert f"better by Δ = {cal['planted_delta']:.4f}" in section


def test_verdicts_in_words(tmp_path):
    """The opening lines and the table speak in verdicts: better, equivalent within the margin,
    inconclusive with the seeds a new study would need for the margin (prospective, from the observed
    sd, as `ablate plan` gives them), a duplicate flagged and left out."""
    rng = np.random.default_rng(4)
    effects = {"base": (0.0, 0.0), "post-norm": (0.05, 0.002), "two-heads": (0.0, 0.0005)}
    effects |= {"gelu-mlp": (0.004, 0.012), "copy": (0.0, 0.0)}
    rows = []
    for s in range(5):
        base = 0.3 + rng.normal(0, 0.01)
        for v, (eff, sd) in effects.items():
            x = base + eff + rng.normal(0, sd)
            rows.append({"variant": v, "seed": s, "differs": v, "test.ndcg@10": x, "test.hr@10": x + 0.2})
    results = pd.DataFrame(rows)
    s = settings(calibration=0, duplicates={"copy": "base"})
    paths = write_report(results, None, None, s, tmp_path)
    md = paths["md"].read_text(encoding="utf-8")
    head = md[: md.index("\n| variant |")]  # the verdict lines, above the results table
    cmp = compare(results, None, s, "ndcg@10").set_index("variant")
    assert cmp.loc["post-norm", "verdict"] == "better" and cmp.loc["two-heads", "verdict"] == "equivalent"
    assert cmp.loc["gelu-mlp", "verdict"] == "inconclusive" and cmp.loc["copy", "verdict"] == ""
    margin = f"±{cmp.loc['post-norm', 'margin']:.4f}"
    assert f"practical margin {margin} (2% of base's mean)" in head
    assert "- post-norm is better (+0.049" in head
    assert f"- two-heads is equivalent within {margin} (" in head
    needed = int(cmp.loc["gelu-mlp", "seeds_for_margin"])
    # the fixed-seed t-test at α/m (3 tested comparisons) with power 80 % at Δ = margin, sd as observed
    gelu = cmp.loc["gelu-mlp"]
    assert needed == seeds_for_difference(gelu["margin"], gelu["sd_diff"], 0.05 / 3) > 5
    assert difference_power(needed - 1, gelu["margin"], gelu["sd_diff"], 0.05 / 3) < 0.8
    assert cmp["seeds_for_margin"].notna().sum() == 1  # only the inconclusive comparison has one
    low, high = (f"{cmp.loc['gelu-mlp', c]:+.4f}".replace("-", "−") for c in ("ci_low", "ci_high"))
    assert (
        f"- gelu-mlp: inconclusive — its interval [{low}, {high}] spans both 0 and the {margin} margin; "
        f"≈ {needed} seeds for 80% power at Δ = {margin} (sd as observed)." in head
    )
    assert "would likely decide" not in md
    duplicate = "- copy is configured exactly like base: it trains the same models; its comparison is not"
    assert f"{duplicate} tested." in head
    # the decided comparisons come first
    order = [head.index(s) for s in ("post-norm is", "two-heads is", "gelu-mlp:", "copy is")]
    assert order == sorted(order)
    # settings: one interval, the margin, the MDD, families counting only what was tested
    assert "Intervals: the table's Δ [interval] is the interval the verdict reads" in md
    assert "family of 3 tested comparisons" in md and "no simultaneous coverage" in md
    # both error guarantees, one sentence each
    assert "False better / worse: the chance that any of the 3 comparisons with a true difference" in md
    assert "False equivalence: the chance that any comparison whose true difference is at or beyond" in md
    assert "its 1 − 2e interval lies inside the margin; e comes from Holm over the family's TOST" in md
    # an equivalent verdict reads its TOST interval, at its own confidence (1 − 2e)
    eq_low, eq_high = (f"{cmp.loc['two-heads', c]:+.4f}".replace("-", "−") for c in ("eq_low", "eq_high"))
    assert f"two-heads is equivalent within {margin} (" in head and f"[{eq_low}, {eq_high}])" in head
    primary = md[md.index("## Primary metric") :]
    two_heads = primary[primary.index("| two-heads |") :].split("\n")[0]
    shown = ", ".join(f"{cmp.loc['two-heads', c]:+.4f}" for c in ("eq_low", "eq_high"))
    assert f"[{shown}] | {1 - 2 * cmp.loc['two-heads', 'eq_level']:.1%} |" in two_heads
    assert "`margin: 0.005`" in md and "MDD: the minimum detectable difference, in the metric's units" in md
    assert "not evidence that a difference would replicate" in md
    # the table: the decision interval, its confidence, the MDD, the verdict
    table = md[md.index("## Primary metric") :]
    assert "| conf. |" in table and "| MDD |" in table and "p units" not in table and "P(>base)" not in table
    gelu_row = table[table.index("| gelu-mlp |") :].split("\n")[0]
    copy_row = table[table.index("| copy |") :].split("\n")[0]
    assert "| inconclusive |" in gelu_row
    assert copy_row.endswith("| configured exactly like base: not tested |")
    mdd = cmp.loc["gelu-mlp", "mdd"]
    assert f"{mdd:.4f} ({mdd / cmp.loc['base', 'mean']:.0%})" in table  # ≥ 10 %: whole percent
    # the results table: each verdict's mark, the best mean in bold, no mark without a verdict
    overview = {
        line.split(" | ")[0].removeprefix("| "): line
        for line in md[md.index("\n| variant |") : md.index("## Primary metric")].splitlines()
        if line.startswith("| ")
    }
    assert overview["post-norm"].count("**") == 4 and overview["post-norm"].count(" ▲**") == 1
    assert overview["post-norm"].count(" △**") == 1  # hr@10, exploratory: an open triangle
    assert " =" in overview["two-heads"] and " ? |" in overview["gelu-mlp"]
    assert not re.search("[▲▼△▽=?] \\|", overview["copy"]) and not re.search("[▲▼△▽=?] \\|", overview["base"])
    # a secondary metric is exploratory, corrected within its own family
    assert "## Secondary metric (exploratory): hr@10" in md
    assert "corrected over its own family of 3 tested comparisons, not across the 2 metrics" in md


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
    assert "Error rates: n/a (2 seeds): no verdict to calibrate." in md
    assert "- softmax-attn: no verdict, n/a (2 seeds) (a verdict needs ≥ 3)." in md
    pairwise_text = next(line for line in md.splitlines() if line.startswith("All pairs on test"))
    assert "p = " not in pairwise_text and pairwise_text.endswith(": none.")  # no made-up p-value


def test_without_units_or_curves(tmp_path):
    results, units, curves = study(seeds=3, units=False, curves=False)
    paths = write_report(results, units, curves, settings(), tmp_path)
    assert "curves" not in paths and not (tmp_path / "figures" / "curves.png").exists()
    md = paths["md"].read_text(encoding="utf-8")
    assert "## Learning curves" not in md
    assert pd.read_csv(paths["comparisons"])["p_units"].isna().all()  # no units: no unit test
    images = paths["html"].read_text(encoding="utf-8").count("data:image/png;base64,")
    assert images == len(FIGURES) - 1 + ("cd" in paths)


def test_format_table_is_the_primary_markdown_table():
    results, units, _ = study(seeds=4)
    s = settings()
    table = format_table(compare(results, units, s, "ndcg@10"), s)
    lines = table.splitlines()
    assert lines[0] == (
        "| variant | differs | ndcg@10 mean ± sd | Δ [interval] | conf. | rel. change | MDD | p (adj) "
        "| verdict |"
    )
    assert len(lines) == 2 + len(VARIANTS)
    assert lines[2].startswith("| base | — |")
    assert "| 97.5% |" in table  # Holm's first step over 2 comparisons: a 1 − α/2 interval
    low = ReportSettings(study="x", primary="ndcg@10", higher_is_better={"ndcg@10": False}, bootstrap=100)
    flipped = format_table(compare(results, units, low, "ndcg@10"), low)
    assert "softmax-attn | attention" in flipped and "better ▲" in flipped and "worse ▼" in flipped


def test_single_variant_study_has_no_friedman(tmp_path):
    results, units, curves = study(seeds=3)
    keep = results["variant"].isin(["base", "swiglu-ffn"])
    paths = write_report(results[keep], units, curves, settings(), tmp_path)
    assert "cd" not in paths
    md = paths["md"].read_text(encoding="utf-8")
    assert "Friedman test: not available" in md
    assert "pairwise_fig" in paths and "family of 1 pair with a test" in md
    assert "(1 seeds" not in md and "3 seeds × 1 variant + baseline" in md


def test_a_baseline_only_report_opens_with_its_results_and_no_empty_lines(tmp_path):
    """A study of its baseline alone compares nothing: no 'practical margin none' headline, no
    empty verdict lists, no exploratory paragraph about a family of 0 comparisons."""
    results, units, curves = study(seeds=3)
    keep = results["variant"] == "base"
    md = write_report(results[keep], units, curves, settings(), tmp_path)["md"].read_text(encoding="utf-8")
    second = md.splitlines()[2]
    assert second.startswith("Results on ndcg@10 (the primary metric; higher is better) of base alone")
    results_part = md.split("## Methods")[0]
    assert "no tested comparison" not in results_part and "family of 0" not in results_part
    assert "\n\n\n" not in md and "\n- \n" not in md
    assert md.splitlines()[4].startswith("|")  # the table follows the headline


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
    tex = latex_table(comparisons(results, units, s, "ndcg@10"), s)
    assert r"ffn\_x2 \& 50\%" in tex and r"ffn\{\#1\}" in tex and "ffn_x2" not in tex
    assert r"\begin{tabular}{llrrrrrrl}" in tex and r"\toprule" in tex and r"\bottomrule" in tex
    assert r"Ablation study my\_study" in tex and r"\label{tab:ablate:my_study:ndcg-10}" in tex
    body = tex[tex.index(r"\toprule") : tex.index(r"\bottomrule")]
    rows = [line for line in body.splitlines() if line.endswith(r"\\")]
    assert len(rows) == 1 + len(VARIANTS)
    for line in rows:  # every row has the header's 9 cells: 8 unescaped column separators
        assert len(re.findall(r"(?<!\\)&", line)) == 8, line
    assert all(ord(c) < 128 for c in tex.replace("—", "")), "non-ASCII left in table.tex"


def test_pipes_in_names_do_not_break_markdown():
    results, units, _ = study(seeds=3)
    results = results.replace({"variant": {"swiglu-ffn": "my|variant"}})
    s = settings()
    table = format_table(compare(results, units, s, "ndcg@10"), s)
    assert "| my\\|variant |" in table


def write_store(tmp_path, seeds: int = 3, epochs: int = 3) -> str:
    """An MLflow store written by hand, shaped as ``ablate run`` writes it (see ablate/tracking/store.py):
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
    from ablate.tracking.results import load_results

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
    assert md.startswith("# Ablation report: hand") and "worse ▼" in md
    assert "(20 comparisons in 10 studies)" in md
    images = paths["html"].read_text(encoding="utf-8").count("data:image/png;base64,")
    assert images == len(FIGURES) + ("cd" in paths)
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


def test_first_screen_is_the_results_and_methods_come_after(report4):
    """The verdict lines, then one table of variants × every metric (marks, best in bold), then
    each metric's detail; the method text under Methods, after every result."""
    paths = report4[2]
    md = paths["md"].read_text(encoding="utf-8")
    lines = md.splitlines()
    assert lines[0] == "# Ablation report: toy-study" and lines[2].startswith("Verdicts on ndcg@10")
    assert lines[4].startswith("- swiglu-ffn is better") and lines[5].startswith("- softmax-attn is worse")
    assert lines[7] == "| variant | differs | seeds | ndcg@10 (primary) | hr@10 |"
    assert lines[9].startswith("| base | — | 4 | 0.") and "▲" not in lines[9] and "**" not in lines[9]
    # the secondary metric's verdicts are exploratory: open triangles
    assert lines[10].startswith("| softmax-attn | attention | 4 | 0.") and lines[10].count(" ▼ |") == 1
    assert lines[10].endswith(" ▽ |")
    assert lines[11].startswith("| swiglu-ffn | ffn | 4 | **0.") and lines[11].endswith(" △** |")
    assert lines[11].count(" ▲** |") == 1
    assert lines[13].startswith("*Test metrics, mean ± sd over seeds. Marks against base")
    assert "▲ better, ▼ worse, = equivalent within the margin, ? inconclusive" in lines[13]
    assert "are exploratory, each corrected over its own family, and marked △ better, ▽ worse" in lines[13]
    order = [
        md.index(h)
        for h in (
            "| variant | differs | seeds |",
            "## Primary metric: ndcg@10",
            "## Secondary metric (exploratory): hr@10",
            "## Cost",
            "## Ranking",
            "## Learning curves",
            "## Methods",
            "### Verdicts, intervals, margins",
            "### Convergence",
            "### Costs",
            "### Calibration",
            "## Files",
        )
    ]
    assert order == sorted(order)
    methods = md[md.index("## Methods") :]
    for text in ("Intervals: the table's Δ [interval]", "MDD: the minimum detectable", "Margin: ±"):
        assert text in methods and text not in md[: md.index("## Methods")]
    assert "## Settings" not in md
    page = paths["html"].read_text(encoding="utf-8")
    first_table = page[page.index("<table>") : page.index("</table>")]
    assert "ndcg@10 (primary)" in first_table and first_table.count("<strong>") == 2
    assert page.index(">Primary metric: ndcg@10</h2>") < page.index(">Methods</h2>")
    assert "http://" not in page and "https://" not in page  # self-contained


def test_results_table_bolds_the_best_by_the_metrics_direction():
    results, units, _ = study(seeds=3)
    low = settings(higher_is_better={"ndcg@10": False})
    tables = {m: comparisons(results, units, low, m) for m in low.metrics}
    headers, rows = overview_rows(tables, low)
    assert headers == ["variant", "differs", "seeds", "ndcg@10 (primary)", "hr@10"]
    by = {r[0]: r for r in rows}
    # lower is better on ndcg@10: softmax-attn (lowest) is best and better; higher on hr@10
    assert isinstance(by["softmax-attn"][3], Strong) and by["softmax-attn"][3].endswith(" ▲")
    assert isinstance(by["swiglu-ffn"][4], Strong) and by["swiglu-ffn"][3].endswith(" ▼")
    assert not any(isinstance(c, Strong) for c in by["base"])


def _tex_study():
    results, units, _ = study(seeds=3)
    results = results.replace({"variant": {"swiglu-ffn": "ffn_x2 & 50%"}, "differs": {"ffn": "ffn{#1}"}})
    s = settings(study="my_study", metrics=["ndcg@10", "hr@10"])
    return {m: comparisons(results, units, s, m) for m in s.metrics}, s


def test_table_tex_has_every_metric():
    tables, s = _tex_study()
    tex = overview_latex(tables, s)
    assert tex.count(r"\begin{table}") == 1 and tex.count(r"\begin{tabular}{lrr}") == 1
    assert tex.index(r"\toprule") < tex.index(r"\midrule") < tex.index(r"\bottomrule")
    assert tex.index(r"\caption{") < tex.index(r"\begin{tabular}") < tex.index(r"\end{tabular}")
    body = tex[tex.index(r"\toprule") : tex.index(r"\bottomrule")]
    rows = [line for line in body.splitlines() if line.endswith(r"\\")]
    # a paper's column: no differs column, the seeds in the caption when every variant has as many
    assert rows[0] == r"variant & ndcg@10 (primary) & hr@10 \\"
    assert len(rows) == 1 + len(VARIANTS)
    for line in rows:  # 3 cells: 2 unescaped column separators
        assert len(re.findall(r"(?<!\\)&", line)) == 2, line
    assert r"ffn\_x2 \& 50\%" in tex and r"ffn\{\#1\}" not in tex
    best = next(r for r in rows if r.startswith(r"ffn\_x2"))
    assert best.count(r"\textbf{") == 2 and r"$\uparrow$}" in best
    worse = next(r for r in rows if r.startswith("softmax-attn"))
    assert r"$\downarrow$" in worse and r"\textbf" not in worse
    caption = tex[tex.index(r"\caption{") : tex.index(r"\label")]
    for legend in (
        r"$\uparrow$ better",
        r"$\downarrow$ worse",
        "= equivalent",
        "? inconclusive",
    ):
        assert legend in caption, legend
    assert "bold: best" in caption and r"\label{tab:ablate:my_study}" in tex
    assert r"mean $\pm$ sd over 3 seeds;" in caption
    assert all(ord(c) < 128 for c in tex), "non-ASCII left in table.tex"
    bare = tex.replace(r"\{", "").replace(r"\}", "")
    assert bare.count("{") == bare.count("}")  # balanced groups once the escaped braces are out
    # seeds that differ between variants (a sequential study) get their column
    results, units, _ = study(seeds=4)
    results = results[~((results["variant"] == "base") & (results["seed"] == 3))]
    s = settings()
    uneven = overview_latex({m: comparisons(results, units, s, m) for m in s.metrics}, s)
    assert r"\begin{tabular}{lrrr}" in uneven and r"variant & seeds & ndcg@10 (primary) & hr@10 \\" in uneven
    assert "base & 3 & " in uneven and "swiglu-ffn & 4 & " in uneven and "sd over seeds;" in uneven


def test_table_tex_compiles_with_pdflatex(tmp_path):
    """The file as written, \\input into a bare article with booktabs (skipped without pdflatex)."""
    if shutil.which("pdflatex") is None:
        if os.environ.get("CI"):  # .ci/run installs it: in CI the compile check may not skip
            pytest.fail("pdflatex is missing in CI (.ci/run installs texlive-latex-base)")
        pytest.skip("pdflatex is not installed: only test_table_tex_has_every_metric's structure checks ran")
    tables, s = _tex_study()
    (tmp_path / "table.tex").write_text(overview_latex(tables, s), encoding="utf-8")
    (tmp_path / "doc.tex").write_text(
        "\\documentclass{article}\n\\usepackage{booktabs,graphicx}\n\\begin{document}\n\\input{table.tex}\n"
        "\\end{document}\n"
    )
    run = subprocess.run(
        ["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "doc.tex"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout[-2000:]
    assert (tmp_path / "doc.pdf").stat().st_size > 0
    log = (tmp_path / "doc.log").read_text(errors="replace")
    assert "Undefined control sequence" not in log and "Missing $" not in log


def _convergence_study():
    """Four variants, 3 seeds, 8 epochs: gelu-mlp's best epoch is the last for seeds 0 and 2;
    two-heads stopped early but its validation metric rose over its last 3 evaluations; base and
    post-norm settled (post-norm's curve rose then dipped)."""
    rows, crows = [], []
    best = {"base": [5, 6, 4], "gelu-mlp": [8, 6, 8], "post-norm": [7, 5, 6], "two-heads": [6, 6, 6]}
    shapes = {
        "base": [0.1, 0.2, 0.3, 0.34, 0.35, 0.36, 0.355, 0.36],
        "gelu-mlp": [0.1, 0.2, 0.3, 0.34, 0.35, 0.345, 0.35, 0.348],
        "post-norm": [0.1, 0.2, 0.3, 0.31, 0.32, 0.33, 0.34, 0.335],
        "two-heads": [0.1, 0.2, 0.3, 0.31, 0.32, 0.33, 0.34, 0.35],
    }
    for v, epochs in best.items():
        for s in range(3):
            rows.append(
                {
                    "variant": v,
                    "seed": s,
                    "differs": v,
                    "test.ndcg@10": 0.3 + 0.001 * s + 0.01 * list(best).index(v),
                    "test.hr@10": 0.5 + 0.001 * s,
                    "epochs": 8,
                    "best_epoch": epochs[s],
                    "wall_s": 10.0,
                }
            )
            crows += [
                {"variant": v, "seed": s, "epoch": e + 1, "metric": "valid.ndcg@10", "value": x + 0.0001 * s}
                for e, x in enumerate(shapes[v])
            ]
            crows += [
                {"variant": v, "seed": s, "epoch": e + 1, "metric": "train.loss", "value": 1 / (e + 1)}
                for e in range(8)
            ]
    return pd.DataFrame(rows), pd.DataFrame(crows)


def test_convergence_warnings_near_the_top_and_in_the_methods(tmp_path):
    results, curves = _convergence_study()
    s = settings(calibration=0)
    flags = not_converged(results, curves, s, ["base", "gelu-mlp", "post-norm", "two-heads"])
    assert [(f.variant, f.at_cap, f.rising) for f in flags] == [
        ("gelu-mlp", {0: 8, 2: 8}, False),
        ("two-heads", {}, True),
    ]
    paths = write_report(results, None, curves, s, tmp_path)
    md = paths["md"].read_text(encoding="utf-8")
    top = md[: md.index("## Primary metric")]
    assert "- ⚠ not converged: gelu-mlp (seeds 0, 2: best epoch = last epoch 8 of 8)" in top
    assert (
        "- ⚠ not converged: two-heads (validation ndcg@10 (mean over seeds) still improving at each of "
        "the last 3 evaluations)" in top
    )
    assert top.index("| variant | differs | seeds |") < top.index("⚠ not converged")
    methods = md[md.index("### Convergence") : md.index("### Costs")]
    assert "best validation epoch (the state its test metrics come from) is the last epoch trained" in methods
    assert (
        "better at each of its last 3 evaluations" in methods and "Flagged: gelu-mlp, two-heads." in methods
    )
    page = paths["html"].read_text(encoding="utf-8")
    assert '<ul class="warn"><li>⚠ not converged: gelu-mlp (seeds 0, 2: best epoch' in page

    # a lower-is-better metric is still improving when it falls; one seed at the cap is 'seed'
    falling = curves.assign(value=-curves["value"])
    low = settings(calibration=0, higher_is_better={"ndcg@10": False})
    one = results.assign(best_epoch=results["best_epoch"].where(results["seed"] != 0, 5))
    flags = not_converged(one, falling, low, ["base", "gelu-mlp", "post-norm", "two-heads"])
    assert [f.line("ndcg@10") for f in flags] == [
        "gelu-mlp (seed 2: best epoch = last epoch 8 of 8)",
        "two-heads (validation ndcg@10 (mean over seeds) still improving at each of the last 3 evaluations)",
    ]
    # evaluated every 2 epochs, bare metric names: 4 evaluations are enough, 3 are not
    sparse = curves[(curves["epoch"] % 2 == 0) & (curves["metric"] == "valid.ndcg@10")]
    sparse = sparse.assign(metric="ndcg@10", value=sparse["epoch"] * 0.01)
    settled = results.assign(best_epoch=3)
    assert {f.variant for f in not_converged(settled, sparse, s, ["base", "two-heads"])} == {
        "base",
        "two-heads",
    }
    short = sparse[sparse["epoch"] > 2]
    assert not_converged(settled, short, s, ["base", "two-heads"]) == []
    # without best_epoch or curves (an older store): nothing to flag, and the Methods say so
    bare = results.drop(columns=["best_epoch"])
    assert not_converged(bare, None, s, ["base"]) == []
    md = write_report(bare, None, None, s, tmp_path / "bare")["md"].read_text(encoding="utf-8")
    assert "⚠" not in md and "only the best epoch was checked. No variant was flagged." in md


META = {
    "ablate_version": "9.9.9",
    "git_commit": "0123456789abcdef0123456789abcdef01234567",
    "data_summary": {"users": 6040, "items": 3416, "interactions": 1000209, "test units": 6040},
    "resolved_study": "name: toy-study\nmodel:\n  dim: 32\n  attention: {kind: softmax, heads: 1}\n<&>\n",
    "cost_note": "Costs: CPU seconds of each trial's process (time.process_time) beside its wall time.",
}


def test_meta_data_summary_configuration_version_commit(tmp_path):
    results, units, curves = study(seeds=3, units=False, curves=False)
    paths = write_report(results, None, None, settings(calibration=0), tmp_path, meta=META)
    md = paths["md"].read_text(encoding="utf-8")
    methods = md[md.index("## Methods") :]
    assert "### Data\n\n| data | value |\n|---|---:|\n| users | 6,040 |" in methods
    assert "| interactions | 1,000,209 |" in methods and "| test units | 6,040 |" in methods
    assert f"Built with ablate 9.9.9; the study's repository at commit {META['git_commit']}." in methods
    assert "```yaml\nname: toy-study\nmodel:\n  dim: 32\n" in methods and "<&>\n```" in methods
    assert META["cost_note"] in methods[methods.index("### Costs") :] and DEFAULT_COST_NOTE not in md
    assert methods.index("### Data") < methods.index("### Verdicts") < methods.index("### Software")
    page = paths["html"].read_text(encoding="utf-8")
    assert "<details><summary>Resolved study (YAML)</summary><pre><code>name: toy-study" in page
    assert "&lt;&amp;&gt;</code></pre></details>" in page  # escaped, folded
    assert "9.9.9" in page and "6,040" in page

    # a recorded fragment reads as a sentence; uncommitted changes are named
    fragment = META | {"cost_note": "wall time is elapsed time; CPU time is the process's", "git_dirty": True}
    md = write_report(results, None, None, settings(calibration=0), tmp_path / "f", meta=fragment)["md"]
    md = md.read_text(encoding="utf-8")
    assert "\n\nWall time is elapsed time; CPU time is the process's.\n\n" in md
    assert f"commit {META['git_commit']} (with uncommitted changes)." in md

    # only what is present; a study outside a git repository says so
    partial = {"ablate_version": "9.9.9", "git_commit": None}
    md = write_report(results, None, None, settings(calibration=0), tmp_path / "p", meta=partial)["md"]
    md = md.read_text(encoding="utf-8")
    assert "Built with ablate 9.9.9; no commit recorded (the study file is not in a git repository)." in md
    assert "### Data" not in md and "```yaml" not in md and DEFAULT_COST_NOTE in md
    md = write_report(results, None, None, settings(calibration=0), tmp_path / "n")["md"].read_text()
    assert "### Software and configuration" not in md and "### Data" not in md
    assert DEFAULT_COST_NOTE in md[md.index("### Costs") :]


def test_cpu_time_beside_wall_time(tmp_path):
    results, _, _ = study(seeds=3, units=False, curves=False)
    # a shared machine: the baseline, trained first, waited longest for a core
    timed = results.assign(
        wall_s=results["variant"].map({"base": 40.0, "softmax-attn": 12.0, "swiglu-ffn": 11.0}),
        cpu_s=results["variant"].map({"base": 9.0, "softmax-attn": 9.5, "swiglu-ffn": 9.25}),
    )
    assert cost_time(timed) == ("cpu_s", "CPU s per trial")
    assert cost_time(results) == ("wall_s", "wall s per trial")
    mixed = timed.assign(cpu_s=timed["cpu_s"].where(timed["seed"] != 1))  # trials from before cpu_s
    assert cost_time(mixed)[0] == "wall_s"
    assert cost_time(results.drop(columns=["wall_s"]))[0] is None
    paths = write_report(timed, None, None, settings(calibration=0), tmp_path)
    md = paths["md"].read_text(encoding="utf-8")
    cost = md[md.index("## Cost") : md.index("## Ranking")]
    assert "| variant | params | tokens/s | peak memory MB | wall s | CPU s | epochs |" in cost
    assert "| base | 12,349 | 5,001 | 321.5 | 40.0 | 9.0 | 8.0 |" in cost
    assert "against CPU time per trial" in cost and "cost_quality.png" in cost
    plain = write_report(results, None, None, settings(calibration=0), tmp_path / "wall")["md"]
    assert "against wall time per trial" in plain.read_text(encoding="utf-8")


def test_seeds_stopped_early_do_not_make_the_mean_look_unfinished():
    """Early stopping ends seeds at different epochs: the mean over the epochs every seed evaluated
    then ends where the shortest stopped, while the others were still climbing. Only seeds that
    trained as long as the study's longest trial count for the rising sign."""
    climb = [0.10, 0.20, 0.30, 0.32, 0.34, 0.36, 0.37, 0.365, 0.36, 0.355]
    stops = {"base": [6, 10, 10], "early": [4, 6, 8]}  # epochs trained per seed; the study's longest: 10
    rows, crows = [], []
    for v, ends in stops.items():
        for s, end in enumerate(ends):
            best = end - 2  # early stopping: two evaluations without improvement after the best
            rows.append(
                {
                    "variant": v,
                    "seed": s,
                    "differs": v,
                    "test.ndcg@10": 0.3 + 0.001 * s,
                    "epochs": end,
                    "best_epoch": best,
                    "wall_s": 1.0,
                }
            )
            crows += [
                {"variant": v, "seed": s, "epoch": e + 1, "metric": "valid.ndcg@10", "value": climb[e]}
                for e in range(end)
            ]
    results, curves = pd.DataFrame(rows), pd.DataFrame(crows)
    s = settings(calibration=0)
    # every seed's curve, cut at the shortest (4 epochs), rises 3 times in a row: the old sign fired
    assert all(np.diff(climb[:4]) > 0)
    assert not_converged(results, curves, s, ["base", "early"]) == []
    # the seeds that ran the full 10 epochs still rising at the end: flagged
    rising = curves.assign(value=curves["value"] + np.where(curves["epoch"] > 7, curves["epoch"] * 0.01, 0))
    flags = not_converged(results, rising, s, ["base", "early"])
    assert [(f.variant, f.rising) for f in flags] == [("base", True)]

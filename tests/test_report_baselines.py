"""The report's trivial-baseline rows, warnings and protocol (issue 36), its HTML (contents, links,
no literal backticks) and table.tex fitting a paper's column with a short caption."""

from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pandas as pd
import pytest

from ablate.report import overview_latex, write_report
from ablate.report.baselines import trivial_baselines
from ablate.stats import ReportSettings, comparisons

METRICS = ["mse", "mae", "rmse", "smape", "mase"]  # five metric columns, lower is better
REFERENCE = {
    "protocol": "Rows are split by time; MSE on the z-normalised scale.",
    "baselines": [
        {
            "name": "repeat-last",
            "about": "the last input value, held",
            "values": dict.fromkeys(METRICS, 0.500),
        },
        {
            "name": "window-mean",
            "about": "the lookback's mean, held",
            "values": dict.fromkeys(METRICS, 0.900),
        },
    ],
}
# base and wide beat repeat-last (0.50) on every metric; deep does not
MEANS = {"base": 0.480, "deep": 0.520, "wide-and-shallow-variant-name": 0.470}


def _study(seeds: int = 3):
    rng = np.random.default_rng(3)
    rows = [
        {"variant": v, "seed": s, "differs": "attention.heads: 4→1" if v == "deep" else "—"}
        | {f"test.{m}": mean + rng.normal(0, 0.002) for m in METRICS}
        for v, mean in MEANS.items()
        for s in range(seeds)
    ]
    settings = ReportSettings(
        study="forecast-toy",
        primary="mse",
        metrics=METRICS,
        higher_is_better=dict.fromkeys(METRICS, False),
        variants=list(MEANS),
        calibration=0,
    )
    return pd.DataFrame(rows), settings


def _written(tmp_path, **kw):
    results, settings = _study()
    paths = write_report(results, None, None, settings, tmp_path, meta={"reference": REFERENCE} | kw)
    return paths, settings


def test_baseline_rows_marked_and_without_verdicts(tmp_path):
    paths, _ = _written(tmp_path)
    md = paths["md"].read_text(encoding="utf-8")
    first = md[md.index("| variant | differs | seeds |") :].split("\n\n")[0]
    row = next(line for line in first.splitlines() if line.startswith("| repeat-last †"))
    assert row.split(" | ")[1:3] == ["trivial baseline: the last input value, held", "—"]
    assert row.count("0.5000") == len(METRICS) and "±" not in row and "?" not in row
    assert "**" not in row  # bold marks the best variant, never a baseline
    detail = md[md.index("## Primary metric: mse") :].split("\n\n")[1]
    base_row = next(line for line in detail.splitlines() if line.startswith("| window-mean †"))
    assert base_row.endswith("| 0.9000 | — | — | — | — | — | — |")
    assert "†: a trivial baseline (repeat-last, window-mean" in md
    comparisons_csv = pd.read_csv(paths["comparisons"])
    assert set(comparisons_csv["variant"]) == set(MEANS)  # the baselines are not compared


def test_warns_when_a_variant_does_not_beat_a_baseline(tmp_path):
    paths, _ = _written(tmp_path)
    md = paths["md"].read_text(encoding="utf-8")
    warnings = [line for line in md.splitlines() if line.startswith("- ⚠")]
    assert any(
        re.fullmatch(r"- ⚠ deep \(0\.52\d\d\) does not beat repeat-last on mse \(0\.5000\)", w)
        for w in warnings
    )
    assert not any("window-mean" in w for w in warnings)  # every variant beats it
    assert not any(w.startswith("- ⚠ base") for w in warnings)


def test_warns_when_the_margin_is_wider_than_the_gap_to_a_baseline(tmp_path):
    results, settings = _study()
    meta = {"reference": REFERENCE}
    wide = settings.model_copy(update={"margin": 0.05})  # base 0.48 beats repeat-last 0.50 by 0.02
    md = write_report(results, None, None, wide, tmp_path / "wide", meta=meta)["md"].read_text(
        encoding="utf-8"
    )
    said = "the ±0.0500 margin on mse is wider than the gap between base and repeat-last (0.0"
    assert said in md
    narrow = settings.model_copy(update={"margin": 0.005})
    md = write_report(results, None, None, narrow, tmp_path / "narrow", meta=meta)["md"].read_text(
        encoding="utf-8"
    )
    assert "margin on mse is wider" not in md


def test_protocol_and_baselines_in_methods(tmp_path):
    paths, _ = _written(tmp_path)
    md = paths["md"].read_text(encoding="utf-8")
    methods = md[md.index("## Methods") :]
    assert "Protocol. Rows are split by time; MSE on the z-normalised scale." in methods
    assert "repeat-last: the last input value, held; window-mean: the lookback's mean, held." in methods
    assert methods.index("Protocol.") < methods.index("### Verdicts, intervals, margins")


def test_no_reference_no_rows(tmp_path):
    results, settings = _study()
    md = write_report(results, None, None, settings, tmp_path)["md"].read_text(encoding="utf-8")
    assert "†" not in md and "Protocol." not in md and trivial_baselines(None) == []


def test_html_has_contents_links_and_no_literal_backticks(tmp_path):
    tracking = {"uri": "http://mlflow.example:5000", "experiment": "7", "run": "abc123"}
    paths, _ = _written(tmp_path, tracking=tracking)
    page = paths["html"].read_text(encoding="utf-8")
    toc = page[page.index('<nav class="toc">') : page.index("</nav>")]
    heads = re.findall(r'<h2 id="([^"]+)">', page)
    assert heads and all(f'href="#{h}"' in toc for h in heads) and page.index("</h1>") < page.index("<nav")
    assert '<a href="results.csv">results.csv</a>' in page and '<a href="table.tex">table.tex</a>' in page
    assert '<a href="figures/seeds.png">' in page
    assert '<a href="http://mlflow.example:5000/#/experiments/7/runs/abc123">' in page
    body = re.sub(r"<pre>.*?</pre>", "", page, flags=re.S)  # code blocks keep theirs
    assert "`" not in body and "<code>margin: 0.005</code>" in body
    md = paths["md"].read_text(encoding="utf-8")
    assert "[results.csv](results.csv)" in md and "`margin: 0.005`" in md


def test_table_tex_caption_is_short_and_ascii(tmp_path):
    results, settings = _study()
    tables = {m: comparisons(results, None, settings, m) for m in settings.metrics}
    tex = overview_latex(tables, settings, trivial_baselines({"reference": REFERENCE}))
    caption = tex[tex.index(r"\caption{") + 9 : tex.index(r"\label")].strip().removesuffix("}")
    plain = re.sub(r"\$[^$]*\$", "x", caption)
    assert len(plain) <= 260, plain  # 2–3 lines of a one-column paper
    assert all(ord(c) < 128 for c in tex) and r"repeat-last $\dagger$" in tex
    assert tex.index(r"\midrule", tex.index("wide-and-shallow")) < tex.index("repeat-last")


@pytest.mark.skipif(shutil.which("pdflatex") is None, reason="pdflatex is not installed")
@pytest.mark.parametrize("columns", ["onecolumn", "twocolumn"])
def test_table_tex_with_five_metrics_fits_the_column(tmp_path, columns):
    results, settings = _study()
    tables = {m: comparisons(results, None, settings, m) for m in settings.metrics}
    (tmp_path / "table.tex").write_text(
        overview_latex(tables, settings, trivial_baselines({"reference": REFERENCE})), encoding="utf-8"
    )
    (tmp_path / "doc.tex").write_text(
        f"\\documentclass[{columns}]{{article}}\n\\usepackage{{booktabs,graphicx}}\n\\begin{{document}}\n"
        "\\input{table.tex}\n\\end{document}\n"
    )
    run = subprocess.run(
        ["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "doc.tex"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout[-2000:]
    log = (tmp_path / "doc.log").read_text(errors="replace")
    assert "Overfull \\hbox" not in log and "Undefined control sequence" not in log


def test_the_store_is_named_the_same_on_every_machine_and_without_credentials(tmp_path, monkeypatch):
    from ablate.report.write import store_shown

    monkeypatch.chdir(tmp_path)
    shown = {
        u: store_shown({"uri": u, "run": "r1", "experiment": "3"})
        for u in (
            f"sqlite:///{tmp_path}/runs/s/mlflow.db",
            "sqlite:////elsewhere/out/mlflow.db",
            "postgresql://user:secret@db.example:5432/mlflow",
            "https://me:pw@mlflow.example",
        )
    }
    assert list(shown.values()) == [
        "`runs/s/mlflow.db`",
        "`mlflow.db` in the study's output folder",
        "`postgresql://db.example:5432/mlflow`",
        "[https://mlflow.example](https://mlflow.example/#/experiments/3/runs/r1)",
    ]

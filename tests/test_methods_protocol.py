"""Every committed study's Methods says the protocol its run used: the task's protocol sentence,
built from the study file as resolved, and the one in its committed report (``reports/<study>/``)
each name the split, the held-out files and the evaluation settings the resolved data settings
give (issue 60: Adult trained with its test file was described as a random 64/16/20 split)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_studies import STUDIES, with_its_data

from ablate.study.load import load_study

REPORTS = Path(__file__).resolve().parents[1] / "reports"


def seqrec_claims(options, metrics: list[str]) -> list[str]:
    from ablate_plugins.seqrec import metrics as M

    used = {M.protocol(m, options.protocol) for m in metrics}
    return [
        "Leave-one-out split",
        *([f"{options.sampled_negatives} items drawn"] if "sampled" in used else []),
        *(["(full ranking)"] if "full" in used else []),
    ]


def tabular_claims(options, metrics: list[str]) -> list[str]:
    data = options.data
    files = getattr(data, "files", dict)()
    named = [f"rows are those of {Path(p).name}" for option, p in files.items() if option != "path"]
    if data.format == "csv" and "test" not in files:
        named.append(f"drawn at random from {Path(data.path).name}")
    return named or ["the folder's own" if data.format == "npy" else "in the order generated"]


def forecast_claims(options, metrics: list[str]) -> list[str]:
    return [f"{options.lookback} rows of input, the next {options.horizon} rows as target"]


def lm_claims(options, metrics: list[str]) -> list[str]:
    return [
        f"{options.valid_fraction:.0%} and {options.test_fraction:.0%} of the bytes",
        f"at most {options.eval_bytes:,} bytes",
        f"at most {options.window} predicted tokens",
    ]


CLAIMS = {"seqrec": seqrec_claims, "tabular": tabular_claims, "forecast": forecast_claims, "lm": lm_claims}


def committed_protocol(stem: str) -> str | None:
    report = REPORTS / stem / "report.md"
    if not report.exists():
        return None
    lines = [
        line for line in report.read_text(encoding="utf-8").splitlines() if line.startswith("Protocol. ")
    ]
    return lines[0] if lines else None


@pytest.mark.parametrize("path", [with_its_data(p) for p in STUDIES])
def test_each_protocol_sentence_says_what_the_study_resolves_to(path):
    study = load_study(path)
    claims = CLAIMS[study.spec.task.kind](study.task.options, study.metrics)
    said = study.task.protocol(study.metrics)
    for claim in claims:
        assert claim in said, (claim, said)
    committed = committed_protocol(path.stem)
    if committed is not None:  # the committed report's Methods says the same of its run
        for claim in claims:
            assert claim in committed, (path.stem, claim, committed)


def test_a_test_file_is_named_where_the_split_is_by_file():
    """Adult as UCI publishes it: adult.data split at random for training and validation, adult.test
    as the test rows; the sentence says so (and not 'at random, 64 % / 16 % / 20 %')."""
    from ablate_plugins.tabular.options import TabularOptions
    from ablate_plugins.tabular.task import TabularTask

    data = {"format": "csv", "path": "adult/adult.data", "test": "adult/adult.test", "target": "income"}
    data |= {"task_type": "binclass", "missing": "error", "header": False, "columns": ["age", "income"]}
    data |= {"numeric": ["age"]}
    said = TabularTask(TabularOptions.model_validate({"data": data}), Path(".")).protocol(["accuracy"])
    assert said.startswith(
        "Rows are split: training / validation rows drawn at random from adult.data, 80% / 20% "
        "(split_seed 0); test rows are those of adult.test; every test row is one test unit."
    )
    assert "64%" not in said

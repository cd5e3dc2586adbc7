"""Real logs of the real tools, made here offline at tiny size, compared item by item: inspect-ai's
mock model on a 16-sample dataset for two "models" (their answers right at different rates) over 3
epochs, and lm-eval-harness's dummy model on a 24-item local multiple-choice task with
``--log_samples``, run twice. The verdict rows equal an independent computation from the logs'
own records (a paired t by hand, statsmodels' McNemar)."""

from __future__ import annotations

import json
import random

import numpy as np
import pandas as pd
import pytest
from scipy import stats as scipy_stats
from statsmodels.stats.contingency_tables import mcnemar

SAMPLES, EPOCHS = 16, 3


def _inspect_log(folder, right: float, seed: int, log_format: str = "eval"):
    from inspect_ai import Task, eval
    from inspect_ai.dataset import MemoryDataset, Sample
    from inspect_ai.model import ModelOutput, ModelUsage, get_model
    from inspect_ai.scorer import match
    from inspect_ai.solver import generate

    draw = random.Random(seed)
    outputs = [
        ModelOutput.from_content("mockllm/model", "yes" if draw.random() < right else "no")
        for _ in range(SAMPLES * EPOCHS)
    ]
    for output in outputs:  # set, so that the mock model does not fetch a tokenizer to count them
        output.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)
    dataset = MemoryDataset(
        [Sample(input=f"question {i}?", target="yes", id=f"s{i}") for i in range(SAMPLES)]
    )
    task = Task(dataset=dataset, solver=generate(), scorer=match(), epochs=EPOCHS, name="tiny")
    model = get_model("mockllm/model", custom_outputs=outputs, memoize=False)
    (log,) = eval(task, model=model, log_dir=str(folder), display="none", log_format=log_format)
    assert log.status == "success"
    return log.location


def test_inspect_logs_over_epochs_read_a_paired_t(tmp_path, cli):
    pytest.importorskip("inspect_ai")
    from inspect_ai.log import read_eval_log

    strong = _inspect_log(tmp_path / "strong", 0.85, 1)
    weak = _inspect_log(tmp_path / "weak", 0.35, 2, log_format="json")  # both of its log formats
    code, out, err = cli(
        "compare", f"weak={weak}", f"strong={strong}", "--items", "-m", "match", "--higher-is-better",
        "--baseline", "weak", "--out", tmp_path / "r",
    )  # fmt: skip
    assert code == 0, err
    means = {}
    for name, path in (("weak", weak), ("strong", strong)):
        scores = [(s.id, s.scores["match"].value == "C") for s in read_eval_log(path).samples]
        means[name] = pd.DataFrame(scores, columns=["id", "right"]).groupby("id")["right"].mean()
    d = (means["strong"] - means["weak"]).to_numpy(float)
    assert len(d) == SAMPLES
    se = d.std(ddof=1) / np.sqrt(len(d))
    p = 2 * scipy_stats.t.sf(abs(d.mean()) / se, len(d) - 1)
    row = pd.read_csv(tmp_path / "r" / "comparisons.csv").set_index("variant").loc["strong"]
    items = pd.read_csv(tmp_path / "r" / "items.csv").set_index("model").loc["strong"]
    assert items["test"] == "paired_t" and items["units"] == SAMPLES
    assert row["delta"] == pytest.approx(d.mean()) and row["p_seeds"] == pytest.approx(p, rel=1e-9)
    assert row["verdict"] == ("better" if p < 0.05 else "inconclusive")
    assert f"{EPOCHS} epochs each (their mean per unit)" in (tmp_path / "r" / "report.md").read_text()


TASK = """task: tiny_sums
dataset_path: json
dataset_kwargs:
  data_files:
    test: {items}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: answer
metric_list:
  - metric: acc
"""


def _lm_eval_samples(tmp_path, folder: str, seed: int):
    from lm_eval import simple_evaluate
    from lm_eval.loggers import EvaluationTracker
    from lm_eval.tasks import TaskManager

    tracker = EvaluationTracker(output_path=str(tmp_path / folder))
    results = simple_evaluate(
        model="dummy",
        tasks=["tiny_sums"],
        # without lm-eval's thousands of built-in task files, which take most of a minute to index
        task_manager=TaskManager(include_path=str(tmp_path / "task"), include_defaults=False),
        log_samples=True,
        evaluation_tracker=tracker,
        random_seed=seed,
    )
    samples = results.pop("samples")
    tracker.save_results_aggregated(results=results, samples=samples)
    tracker.save_results_samples(task_name="tiny_sums", samples=samples["tiny_sums"])
    (found,) = (tmp_path / folder).rglob("samples_tiny_sums_*.jsonl")
    return found


def test_lm_eval_samples_are_decided_by_mcnemar(tmp_path, cli, monkeypatch):
    pytest.importorskip("lm_eval")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")  # conftest sets both for the whole session too
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (tmp_path / "task").mkdir()
    items = tmp_path / "task" / "items.jsonl"
    rows = [{"question": f"{i} + 1 =", "choices": [str(i + 1), str(i + 2)], "answer": 0} for i in range(24)]
    items.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "task" / "tiny.yaml").write_text(TASK.format(items=items))
    first, second = _lm_eval_samples(tmp_path, "one", 1), _lm_eval_samples(tmp_path, "two", 2)
    code, out, err = cli(
        "compare", f"one={first.parent}", f"two={second}", "--items", "-m", "acc",
        "--baseline", "one", "--out", tmp_path / "r",
    )  # fmt: skip
    assert code == 0, err
    right = {}
    for name, path in (("one", first), ("two", second)):
        records = [json.loads(line) for line in path.read_text().splitlines()]
        right[name] = pd.Series({r["doc_id"]: r["acc"] for r in records})
    only_two = int(((right["two"] == 1) & (right["one"] == 0)).sum())
    only_one = int(((right["two"] == 0) & (right["one"] == 1)).sum())
    both = int(((right["two"] == 1) & (right["one"] == 1)).sum())
    table = [[both, only_two], [only_one, 24 - both - only_two - only_one]]
    p = mcnemar(table, exact=True).pvalue
    row = pd.read_csv(tmp_path / "r" / "comparisons.csv").set_index("variant").loc["two"]
    found = pd.read_csv(tmp_path / "r" / "items.csv").set_index("model").loc["two"]
    assert found["test"] == "mcnemar" and found["units"] == 24
    assert (found["agree.only variant"], found["agree.only base"]) == (only_two, only_one)
    assert row["p_seeds"] == pytest.approx(p, rel=1e-12)
    # one comparison: Holm's level is α; 24 items cannot show equivalence within 2 % of the error
    expected = ("better" if only_two > only_one else "worse") if p < 0.05 else "inconclusive"
    assert row["verdict"] == expected


def test_a_file_inspect_ai_cannot_read_is_one_line(tmp_path, cli):
    pytest.importorskip("inspect_ai")
    log = _inspect_log(tmp_path / "good", 0.5, 1)
    cut = tmp_path / "cut.eval"
    cut.write_bytes(open(log, "rb").read()[:300])  # a zip cut short
    code, _, err = cli(
        "compare", f"a={log}", f"b={cut}", "--items", "-m", "match", "--higher-is-better",
        "--baseline", "a", "--out", tmp_path / "r",
    )  # fmt: skip
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(lines) == 1, err
    assert f"{cut}: inspect-ai 0.3" in lines[0] and "cannot read it as a log" in lines[0]

"""Training FLOPs (ablate.training.flops): softmax attention's CPU form counted as its products are, a
trial's count taken without moving anything the trial draws, and the same count at any thread
count (the cost no machine load changes), reported beside the timings."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
import torch.nn.functional as F

import ablate.training.trainer as train_module
from ablate.study.load import load_study
from ablate.training.flops import counted_flops
from ablate.training.trainer import train_trial

PATCH = {"train": {"epochs": 2, "eval_every": 1}, "model": {"dropout": 0.2}}


def test_softmax_attention_on_the_cpu_counts_its_matrix_products():
    b, h, n, d = 2, 3, 16, 8
    q, k, v = (torch.randn(b, h, n, d, requires_grad=True) for _ in range(3))
    products = 2 * b * h * n * n * d  # one (n × d) @ (d × n) or (n × n) @ (n × d) product per head

    def fused():
        F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()

    with torch.no_grad():
        assert counted_flops(lambda: F.scaled_dot_product_attention(q, k, v)) == 2 * products
    # forward: q kᵀ and a v; backward: the gradients of both products (4) and q kᵀ recomputed (1)
    assert counted_flops(fused) == 7 * products

    def explicit():
        a = (q @ k.transpose(-1, -2) / d**0.5).softmax(-1)
        (a @ v).sum().backward()

    assert counted_flops(explicit) == 6 * products  # the same products, without the recomputation


def test_a_trial_counts_its_flops_without_changing_what_it_trains(write_study, monkeypatch):
    study = load_study(write_study(PATCH))
    data = study.task.load()
    cpu = torch.device("cpu")
    counted = train_trial(study, study.variants["mlp"], 1, data, cpu)
    monkeypatch.setattr(train_module, "flops_per_token", lambda probe, batches: 0.0)
    uncounted = train_trial(study, study.variants["mlp"], 1, data, cpu)
    assert counted.summary == uncounted.summary and counted.curves == uncounted.curves
    assert counted.train_gflop > 0 and uncounted.train_gflop == 0
    pd.testing.assert_frame_equal(counted.per_unit, uncounted.per_unit)


def test_the_count_is_the_same_at_any_thread_count(write_study):
    study = load_study(write_study({**PATCH, "train": {**PATCH["train"], "micro_batches": 2}}))
    data = study.task.load()
    before, counts = torch.get_num_threads(), []
    try:
        for threads in (1, 2):  # two threads: the micro-batches run in parallel streams
            torch.set_num_threads(threads)
            counts.append(train_trial(study, study.variants["mlp"], 0, data, torch.device("cpu")).train_gflop)
    finally:
        torch.set_num_threads(before)
    assert counts[0] > 0 and counts[0] == counts[1]


@pytest.mark.heavy
def test_the_report_shows_the_flops_and_says_how_they_were_counted(cli, write_study, tmp_path):
    study = write_study({"seeds": [0, 1, 2], "report": {"calibration": 0, "bootstrap": 200}})
    code, _, err = cli("run", study, "--reports", tmp_path / "reports", "--quiet")
    assert code == 0, err
    results = pd.read_csv(tmp_path / "reports" / "tiny" / "results.csv")
    assert (results["train_gflop"] > 0).all()
    md = (tmp_path / "reports" / "tiny" / "report.md").read_text(encoding="utf-8")
    assert "train GFLOP" in md and "counted over one step by torch's FlopCounterMode" in md
    assert "against training GFLOP (the same at any machine load)" in md

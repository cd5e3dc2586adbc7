"""The sampled-100 evaluation protocol beside full ranking, and the softmax losses, each
against values computed independently (per user / per position loops)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from pydantic import ValidationError

from ablate import kernels
from ablate.model.build import build_backbone
from ablate.study.load import load_study
from ablate_plugins.seqrec import LossOptions, SampledSoftmax, SeqRecOptions, SeqRecTask, Softmax, synthetic
from ablate_plugins.seqrec import losses as L
from ablate_plugins.seqrec import metrics as M
from ablate_plugins.seqrec.batches import collate, history, target

# ---------------------------------------------------------------------------------------
# Metric names and sampled ranks


@pytest.mark.parametrize(
    "name,default,expected",
    [
        ("ndcg@10", "full", "full"),
        ("ndcg@10", "sampled", "sampled"),
        ("sampled.hr@10", "full", "sampled"),
        ("full.mrr", "sampled", "full"),
    ],
)
def test_a_prefix_pins_the_protocol(name, default, expected):
    assert M.protocol(name, default) == expected and M.check(name) is None


@pytest.mark.parametrize("name", ["sampled.", "sample.hr@10", "full.auc", "sampled.hr@0"])
def test_bad_prefixed_names_are_rejected(name):
    assert "optionally prefixed 'full.' or 'sampled.'" in M.check(name)


def test_sampled_ranks_count_ties_and_duplicates_against_the_target():
    #                       pad   1    2    3    4    5
    scores = torch.tensor([[0.0, 0.5, 0.9, 0.5, 0.1, 0.7], [0.0, 0.2, 0.3, float("nan"), 0.3, 0.1]])
    targets = torch.tensor([1, 2])
    negatives = torch.tensor([[3, 4, 4, 5], [5, 3, 1, 4]])
    # Row 0: item 3 ties (0.5), item 5 beats it, item 4 twice below: rank 2.
    # Row 1: NaN (item 3) counts against the target, item 4 ties: rank 2.
    assert M.sampled_ranks(scores, targets, negatives).tolist() == [2, 2]


def test_negatives_avoid_every_item_the_user_touched_and_are_uniform():
    sequences = [np.array([1, 2, 3]), np.array([4, 5, 6, 7, 8, 9])]
    drawn = M.draw_negatives(sequences, num_items=10, count=30_000, seed=0)
    assert drawn.shape == (2, 30_000)
    for seq, row in zip(sequences, drawn, strict=False):
        allowed = sorted(set(range(1, 11)) - set(seq.tolist()))
        counts = np.bincount(row, minlength=11)
        assert set(np.flatnonzero(counts).tolist()) == set(allowed)
        np.testing.assert_allclose(counts[allowed] / len(row), 1 / len(allowed), atol=0.01)
    again = M.draw_negatives(sequences, num_items=10, count=30_000, seed=0)
    assert np.array_equal(drawn, again)


def test_a_user_who_saw_everything_has_no_negatives():
    with pytest.raises(ValueError, match="every item"):
        M.draw_negatives([np.array([1, 2])], num_items=2, count=3, seed=0)


def test_protocol_option():
    assert SeqRecOptions.model_validate({}).protocol == "full"
    assert (
        SeqRecOptions.model_validate({"protocol": "sampled", "sampled_negatives": 50}).sampled_negatives == 50
    )
    with pytest.raises(ValidationError):
        SeqRecOptions.model_validate({"sampled_negatives": 0})


# ---------------------------------------------------------------------------------------
# Evaluation against a one-user-at-a-time reference

STUDY = """\
name: protocols
task: {kind: seqrec, data: {format: synthetic, users: 60, items: 150, min_len: 5, max_len: 30, seed: 3},
       max_len: 12, protocol: sampled, sampled_negatives: 20}
model:
  dim: 16
  blocks: 1
  dropout: 0.0
  attention: {kind: softmax, heads: 2}
  ffn: {kind: pointwise}
  norm: {kind: layernorm}
  connection: {kind: residual}
  bias: [{kind: abs_pos}]
metrics: {primary: ndcg@10, also: [hr@5, mrr, full.ndcg@10, full.hr@5]}
"""


@pytest.mark.parametrize("threads", [1, 2])  # 2: one single-threaded stream of batches per thread
def test_evaluation_matches_a_per_user_reference_under_both_protocols(tmp_path, threads):
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        check_evaluation_against_a_per_user_reference(tmp_path)
    finally:
        torch.set_num_threads(saved)


def check_evaluation_against_a_per_user_reference(tmp_path):
    path = tmp_path / "study.yaml"
    path.write_text(STUDY)
    study = load_study(path)
    task: SeqRecTask = study.task
    data = task.load()
    variant = study.variants["base"]
    ctx = study.build_context(variant, task.max_len(data))
    torch.manual_seed(0)
    model = task.build_model(build_backbone(variant, ctx), ctx, data).eval()
    result = task.evaluate(model, data, "test", study.metrics, torch.device("cpu"), batch_size=7)
    # A second evaluation reuses the split's batches kept on the data, with the same values.
    assert list(data.batch_cache) == [("test", 12, 7)]
    again = task.evaluate(model, data, "test", study.metrics, torch.device("cpu"), batch_size=7)
    pd.testing.assert_frame_equal(again.per_unit, result.per_unit)

    negatives = M.draw_negatives(data.sequences, data.num_items, 20, seed=20180822)  # the task's test draw
    expected = {name: [] for name in study.metrics}
    for u, seq in enumerate(data.sequences):
        window = history(seq, "test")[-12:]
        batch = collate([window], [np.zeros(len(window), dtype=np.int64)], None, data.users[u : u + 1])
        with torch.no_grad():
            scores = model.scores(model(batch)[0, -1]).tolist()
        y = target(seq, "test")
        seen = set(history(seq, "test").tolist()) - {y}
        full_rank = sum(
            1 for i in range(1, data.num_items + 1) if i != y and i not in seen and scores[i] >= scores[y]
        )
        sampled_rank = sum(1 for i in negatives[u] if scores[i] >= scores[y])
        for name in study.metrics:
            rank = full_rank if name.startswith("full.") else sampled_rank
            kind, k = M.parse(name)
            value = {
                "hr": float(rank < (k or 0)),
                "ndcg": 1 / math.log2(rank + 2) if rank < (k or 0) else 0.0,
                "mrr": 1 / (rank + 1),
            }[kind]
            expected[name].append(value)
    order = np.argsort(data.users)
    for name in study.metrics:
        np.testing.assert_allclose(
            result.per_unit[name].to_numpy(), np.array(expected[name])[order], atol=1e-12
        )
        assert result.summary[name] == pytest.approx(np.mean(expected[name]))
    # The sampled protocol ranks among 20 candidates, so it is far easier than full ranking.
    assert result.summary["ndcg@10"] > result.summary["full.ndcg@10"]


# ---------------------------------------------------------------------------------------
# Losses


def test_loss_options_parse_the_new_kinds():
    assert LossOptions.model_validate({"kind": "sampled_softmax"}).root == SampledSoftmax(
        kind="sampled_softmax"
    )
    assert LossOptions.model_validate({"kind": "softmax", "temperature": 0.05}).root.temperature == 0.05
    with pytest.raises(ValidationError):
        LossOptions.model_validate({"kind": "sampled_softmax", "negatives": 0})


@pytest.mark.parametrize("m", [9, 40], ids=["dense-route", "gather-route"])  # m ≤ k·d = 20 picks dense
@pytest.mark.parametrize("shared", [True, False])
def test_sampled_softmax_matches_a_per_position_reference(shared, m):
    torch.manual_seed(0)
    t, d, k = 6, 4, 5
    table, h = torch.randn(m, d), torch.randn(t, d)
    positives = torch.tensor([1, 2, 3, 4, 5, 3])
    options = SampledSoftmax(kind="sampled_softmax", negatives=k, temperature=0.5, shared=shared)
    value = L.sampled_softmax(options, h, positives, table, torch.Generator().manual_seed(7))
    # The same draws, replayed.
    shape = (1, k) if shared else (t, k)
    drawn = torch.randint(1, m, shape, generator=torch.Generator().manual_seed(7)).expand(t, k)
    terms = []
    for r in range(t):
        pos = float(h[r] @ table[positives[r]]) / 0.5
        negs = [float(h[r] @ table[j]) / 0.5 for j in drawn[r].tolist() if j != positives[r]]
        terms.append(-pos + math.log(math.exp(pos) + sum(math.exp(v) for v in negs)))
    assert value.item() == pytest.approx(sum(terms) / t, rel=1e-5)


def test_per_position_logits_routes_agree_with_gradients(monkeypatch):
    """Every route computes h_t · E[neg_tk]: the fused kernel where it runs (CPU, float32/64, a
    C compiler), else the matmul for small catalogues and the gather for large ones (or when the
    [t, m] logits would be too big)."""
    torch.manual_seed(3)
    t, m, d, k = 30, 50, 8, 16
    negatives = torch.randint(1, m, (t, k))
    weights = torch.randn(t, k)
    grads = []
    routes = [L.dense_logits, L.gathered_logits]
    if kernels.library() is not None:
        routes.append(kernels.gathered_dot)
    for route in routes:
        h, table = (
            torch.randn(t, d, generator=torch.Generator().manual_seed(1)).requires_grad_(),
            torch.randn(m, d, generator=torch.Generator().manual_seed(2)).requires_grad_(),
        )
        out = route(h, table, negatives)
        torch.testing.assert_close(out, torch.stack([table[negatives[r]] @ h[r] for r in range(t)]))
        (out * weights).sum().backward()
        grads.append((h.grad, table.grad))
    for other in grads[1:]:
        for a, b in zip(grads[0], other, strict=True):
            torch.testing.assert_close(a, b)
    called = []
    monkeypatch.setattr(L, "dense_logits", lambda *a: called.append("dense") or torch.zeros(t, k))
    monkeypatch.setattr(L, "gathered_logits", lambda *a: called.append("gather") or torch.zeros(t, k))
    monkeypatch.setattr(kernels, "gathered_dot", lambda *a: called.append("kernel") or torch.zeros(t, k))
    h = torch.randn(t, d)
    monkeypatch.setattr(kernels, "takes_all", lambda *tensors: True)
    L.per_position_logits(h, torch.randn(m, d), negatives)
    monkeypatch.setattr(kernels, "takes_all", lambda *tensors: False)
    L.per_position_logits(h, torch.randn(k * d, d), negatives)
    L.per_position_logits(h, torch.randn(k * d + 1, d), negatives)
    monkeypatch.setattr(L, "DENSE_LOGITS_LIMIT", t * m - 1)
    L.per_position_logits(h, torch.randn(m, d), negatives)
    assert called == ["kernel", "dense", "gather", "gather"]


def test_accidental_hits_are_masked():
    # Two items: draws of item 1 (the positive) are masked, draws of item 2 count; with one
    # item every draw hits the positive, only the positive is left and the loss is 0.
    table = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    h = torch.tensor([[2.0, 1.0]])
    options = SampledSoftmax(kind="sampled_softmax", negatives=64, shared=False)
    generator = torch.Generator().manual_seed(0)
    drawn = torch.randint(1, 3, (1, 64), generator=torch.Generator().manual_seed(0))
    hits = int((drawn != 1).sum())
    value = L.sampled_softmax(options, h, torch.tensor([1]), table, generator)
    assert value.item() == pytest.approx(-2.0 + math.log(math.exp(2.0) + hits * math.exp(1.0)), rel=1e-6)
    one_item = SampledSoftmax(kind="sampled_softmax", negatives=8)
    assert L.sampled_softmax(one_item, h, torch.tensor([1]), table[:2], torch.Generator()).item() == 0.0


def test_full_softmax_is_cross_entropy_over_every_item():
    torch.manual_seed(1)
    table, h = torch.randn(7, 3), torch.randn(4, 3)
    positives = torch.tensor([1, 6, 2, 2])
    value = L.softmax(Softmax(kind="softmax", temperature=2.0), h, positives, table, torch.Generator())
    terms = []
    for r in range(4):
        logits = [float(h[r] @ table[i]) / 2.0 for i in range(1, 7)]
        terms.append(-logits[positives[r] - 1] + math.log(sum(math.exp(v) for v in logits)))
    assert value.item() == pytest.approx(sum(terms) / 4, rel=1e-5)


def test_normalize_scores_with_cosine_similarity(tmp_path):
    task = SeqRecTask(SeqRecOptions.model_validate({"normalize": True, "max_len": 8}), tmp_path)
    data = synthetic(20, 15, 5, 9, 0.5, seed=0, timestamps=False)
    study_path = tmp_path / "s.yaml"
    study_path.write_text(STUDY.replace("protocol: sampled, ", "normalize: true, "))
    study = load_study(study_path)
    variant = study.variants["base"]
    ctx = study.build_context(variant, 8)
    model = task.build_model(build_backbone(variant, ctx), ctx, data).eval()
    hidden = torch.randn(3, 16)
    scores = model.scores(hidden)
    unit_h = hidden / hidden.norm(dim=-1, keepdim=True)
    unit_e = model.items.weight[1:] / model.items.weight[1:].norm(dim=-1, keepdim=True)
    torch.testing.assert_close(scores[:, 1:], unit_h @ unit_e.T)
    assert (scores[:, 0] == 0).all() and scores.abs().max() <= 1 + 1e-6


def test_the_popularity_baseline_refuses_sampled_metrics():
    from ablate_plugins.seqrec import popularity_evaluation

    data = synthetic(10, 30, 5, 8, 0.5, seed=0, timestamps=False)
    assert popularity_evaluation(data, "test", ["full.hr@10"]).summary["full.hr@10"] >= 0
    with pytest.raises(ValueError, match="sampled-protocol metrics"):
        popularity_evaluation(data, "test", ["sampled.hr@10"])

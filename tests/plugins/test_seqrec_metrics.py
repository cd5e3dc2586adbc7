"""seqrec ranking metrics, full-ranking evaluation and the popularity baseline, against
ranks worked out by hand."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from ablate.jagged import last_of_rows
from ablate_plugins.seqrec import Interactions, SeqRecModel, SeqRecOptions, SeqRecTask, popularity_evaluation
from ablate_plugins.seqrec import metrics as M


def test_ranks_count_ties_against_the_target_and_skip_history_and_padding():
    #                       pad   1    2    3    4    5
    scores = torch.tensor([[5.0, 0.5, 0.9, 0.5, 0.1, 0.7], [5.0, 0.2, 0.3, 0.3, 0.3, 0.1]])
    targets = torch.tensor([1, 3])
    # User 0 saw item 2 (0.9, excluded); item 3 ties the target, item 5 beats it: rank 2.
    # User 1 saw items 2 and 3 (3 is the target, so it stays); item 4 ties: rank 1.
    exclude = M.exclusion_mask([np.array([2]), np.array([2, 3])], targets, num_items=5)
    assert exclude.tolist() == [
        [True, False, True, False, False, False],
        [True, False, True, False, False, False],
    ]
    assert M.ranks(scores, targets, exclude).tolist() == [2, 1]


def test_nan_scores_count_against_the_target():
    scores = torch.tensor([[0.0, 1.0, float("nan"), 0.5, 0.2], [0.0, float("nan"), 0.3, 0.5, 0.2]])
    targets = torch.tensor([1, 1])
    exclude = M.exclusion_mask([np.array([], dtype=np.int64)] * 2, targets, num_items=4)
    assert M.ranks(scores, targets, exclude).tolist() == [1, 3]


def test_metric_values_from_ranks():
    rank = np.array([0, 1, 2, 9, 10])
    assert M.values("hr@1", rank).tolist() == [1, 0, 0, 0, 0]
    assert M.values("hr@10", rank).tolist() == [1, 1, 1, 1, 0]
    np.testing.assert_allclose(M.values("ndcg@3", rank), [1.0, 1 / math.log2(3), 0.5, 0.0, 0.0])
    np.testing.assert_allclose(M.values("ndcg@10", rank)[3:], [1 / math.log2(11), 0.0])
    np.testing.assert_allclose(M.values("mrr", rank), [1, 1 / 2, 1 / 3, 1 / 10, 1 / 11])


@pytest.mark.parametrize("name", ["hr@10", "ndcg@5", "mrr", "hr@1", "NDCG@20"])
def test_check_metric_accepts(name):
    task = SeqRecTask(SeqRecOptions(), Path("."))
    assert task.check_metric(name) is None


@pytest.mark.parametrize("name", ["hr@0", "hr@", "recall@10", "ndcg@-1", "mrr@10", "auc"])
def test_check_metric_rejects_with_the_accepted_forms(name):
    problem = SeqRecTask(SeqRecOptions(), Path(".")).check_metric(name)
    assert problem is not None and "\n" not in problem
    assert name in problem and "hr@K" in problem and "ndcg@K" in problem and "mrr" in problem


# ---------------------------------------------------------------------------------------
# evaluate() on a model whose scores are known: the identity backbone makes the hidden state
# at the last position √d · E[last item], so scores are √d · E[last] · E[j].


class IdentityBackbone(nn.Module):
    def forward(self, x, tokens, last_only=False):
        return last_of_rows(x, tokens.lengths) if last_only else x


TABLE = torch.tensor(
    [
        [0.0, 0.0],  # padding
        [1.0, 0.0],  # 1
        [0.0, 1.0],  # 2
        [1.0, 1.0],  # 3
        [2.0, 0.0],  # 4
        [1.0, 0.0],
    ]
)  # 5, ties item 1


def tiny_data() -> Interactions:
    seqs = [np.array(s) for s in ([5, 1, 4], [2, 4, 1, 3], [3, 1, 3])]
    return Interactions(
        users=np.array([3, 7, 9]),
        sequences=seqs,
        timestamps=None,
        num_items=5,
        item_ids=np.r_[-1, 1:6],
        source="tiny",
    )


def tiny_model() -> SeqRecModel:
    model = SeqRecModel(IdentityBackbone(), num_items=5, dim=2)
    with torch.no_grad():
        model.items.weight.copy_(TABLE)
    return model


# Worked by hand from TABLE. Test split (history s[:-1], target s[-1], query = last history item):
#   user 3: query e1, candidates 2 (0), 3 (1), target 4 (2)           → rank 0
#   user 7: query e1, candidates target 3 (1), 5 (1, tie)             → rank 1
#   user 9: query e1, target 3 seen before but kept (1); 2 (0), 4 (2), 5 (1) → rank 2
# Validation split (history s[:-2], target s[-2]):
#   user 3: query e5=(1,0), target 1 (1); 2 (0), 3 (1), 4 (2)          → rank 2
#   user 7: query e4=(2,0), target 1 (2); 3 (2), 5 (2)                 → rank 2
#   user 9: query e3=(1,1), target 1 (1); 2 (1), 4 (2), 5 (1)          → rank 3
TEST_RANKS = {3: 0, 7: 1, 9: 2}
VALID_RANKS = {3: 2, 7: 2, 9: 3}


@pytest.mark.parametrize("split,expected", [("test", TEST_RANKS), ("valid", VALID_RANKS)])
def test_evaluate_ranks_all_items_from_the_last_position(split, expected):
    task = SeqRecTask(SeqRecOptions(max_len=2), Path("."))
    model = tiny_model()
    model.train()
    result = task.evaluate(
        model, tiny_data(), split, ["mrr", "hr@2", "ndcg@3"], torch.device("cpu"), batch_size=2
    )
    assert model.training  # restored
    assert result.per_unit["unit"].tolist() == [3, 7, 9]
    ranks = np.array([expected[u] for u in (3, 7, 9)])
    np.testing.assert_allclose(result.per_unit["mrr"], 1 / (ranks + 1))
    np.testing.assert_allclose(result.per_unit["hr@2"], (ranks < 2).astype(float))
    np.testing.assert_allclose(result.per_unit["ndcg@3"], np.where(ranks < 3, 1 / np.log2(ranks + 2), 0))
    assert result.summary["mrr"] == pytest.approx(np.mean(1 / (ranks + 1)))
    assert list(result.per_unit.columns) == ["unit", "mrr", "hr@2", "ndcg@3"]


def test_popularity_ranks_by_training_counts_with_the_same_exclusions():
    # Training parts s[:-2]: [5], [2, 4], [3] → counts 1 for items 2, 3, 4, 5; 0 for item 1.
    # Test: user 3 target 4, candidates 2, 3 tie         → rank 2
    #       user 7 target 3, candidate 5 ties            → rank 1
    #       user 9 target 3 (seen, kept), 2, 4, 5 tie     → rank 3
    result = popularity_evaluation(tiny_data(), "test", ["mrr", "hr@2"])
    assert result.per_unit["unit"].tolist() == [3, 7, 9]
    np.testing.assert_allclose(result.per_unit["mrr"], [1 / 3, 1 / 2, 1 / 4])
    assert result.summary["hr@2"] == pytest.approx(1 / 3)


def test_ranks_do_not_count_the_target_even_if_the_mask_excludes_it():
    scores = torch.tensor([[0.0, 0.9, 0.5, 0.7]])
    targets = torch.tensor([2])
    exclude = torch.tensor([[True, False, True, False]])  # target column marked excluded
    assert M.ranks(scores, targets, exclude).tolist() == [2]

"""The seqrec task: options, loaders, the leave-one-out split, batches, the BCE loss, and a
small end-to-end run where a real backbone must beat popularity on planted structure."""

from __future__ import annotations

import gzip
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from pydantic import ValidationError
from torch import nn

from ablate.components import BuildContext, Component, Options
from ablate.errors import DataError, StudyError
from ablate.model.build import build_backbone
from ablate.study.load import load_study
from ablate.training.trainer import backward_parts, training_autocast
from ablate_plugins.seqrec import (
    BCE,
    Interactions,
    LossOptions,
    MovieLensData,
    SeqRecModel,
    SeqRecOptions,
    SeqRecTask,
    SyntheticData,
    popularity_evaluation,
    read_movielens,
    synthetic,
)
from ablate_plugins.seqrec.losses import SeenItems, sample_negatives

NO_AUTOCAST = training_autocast("fp32", torch.device("cpu"))


def task_for(tmp_path: Path, **options) -> SeqRecTask:
    return SeqRecTask(SeqRecOptions.model_validate(options), tmp_path)


# ---------------------------------------------------------------------------------------
# Options


def test_options_default_to_synthetic_data_and_a_50_item_window():
    options = SeqRecOptions.model_validate({})
    assert options.data == SyntheticData() and options.max_len == 50
    assert isinstance(
        SeqRecOptions.model_validate({"data": {"format": "movielens", "path": "x"}}).data, MovieLensData
    )


@pytest.mark.parametrize(
    "raw",
    [
        {"data": {"format": "parquet", "path": "x"}},
        {"data": {"format": "csv", "path": "x", "min_rating": 3}},
        {"protocol": "sampled100"},
        {"data": {"format": "movielens"}},
        {"data": {"format": "synthetic", "min_len": 30, "max_len": 20}},
        {"data": {"format": "synthetic", "usrs": 3}},
        {"max_len": 0},
    ],
)
def test_bad_options_are_rejected(raw):
    with pytest.raises(ValidationError):
        SeqRecOptions.model_validate(raw)


def test_features_follow_the_data(tmp_path):
    assert task_for(tmp_path, data={"format": "movielens", "path": "u.data"}).features() == {"timestamps"}
    assert task_for(tmp_path).features() == {"timestamps"}
    assert task_for(tmp_path, data={"format": "synthetic", "timestamps": False}).features() == frozenset()
    assert synthetic(10, 5, 3, 4, 0.5, 0, timestamps=False).timestamps is None


def test_check_files_resolves_relative_paths_against_the_study_folder(tmp_path):
    task = task_for(tmp_path, data={"format": "movielens", "path": "ml/u.data"})
    assert task.check_files() == f"file not found: {tmp_path / 'ml' / 'u.data'}"
    (tmp_path / "ml").mkdir()
    (tmp_path / "ml" / "u.data").write_text("1\t2\t3\t4\n")
    assert task.check_files() is None
    assert task_for(tmp_path).check_files() is None


def test_loss_options_default_to_bce_with_one_negative():
    assert SeqRecTask.LossOptions.model_validate({}).root == BCE(negatives=1)
    assert LossOptions.model_validate({"kind": "bce", "negatives": 4}).root.negatives == 4
    with pytest.raises(ValidationError, match="does not match any of the expected tags: 'bce'"):
        LossOptions.model_validate({"kind": "softmx"})


@pytest.mark.parametrize(
    "raw,loc", [({"negatives": 0}, ("negatives",)), ({"kind": "bce", "neg": 2}, ("neg",))]
)
def test_loss_option_errors_point_at_the_key_in_the_study_file(raw, loc):
    with pytest.raises(ValidationError) as info:
        LossOptions.model_validate(raw)
    assert info.value.errors()[0]["loc"] == loc


def test_data_option_errors_name_the_key_and_line_in_the_study_file(tmp_path):
    path = tmp_path / "study.yaml"
    path.write_text(
        "name: s\ntask:\n  kind: seqrec\n  data:\n    format: synthetic\n    users: 0\n"
        "metrics: {primary: hr@10}\n"
    )
    with pytest.raises(StudyError, match=r"study\.yaml:6: task\.data\.users: Input should be greater than 0"):
        load_study(path)
    with pytest.raises(ValidationError) as info:
        SeqRecOptions.model_validate({"data": {"format": "movielens", "path": "x", "min_rting": 3}})
    assert info.value.errors()[0]["loc"] == ("data", "min_rting")


# ---------------------------------------------------------------------------------------
# MovieLens loader


def test_movielens_100k_loads_whole_in_stable_time_order(data_file):
    ml100k = data_file("ml-100k")
    data = read_movielens(ml100k)
    assert (data.num_users, data.num_items, data.num_interactions) == (943, 1682, 100_000)
    assert (data.rows_filtered, data.users_dropped) == (0, 0)

    frame = pd.read_csv(ml100k, sep="\t", names=["user", "item", "rating", "timestamp"])
    by_user = dict(zip(data.users.tolist(), range(data.num_users), strict=False))
    # Users whose history has tied timestamps are where a non-stable sort would differ.
    tied = frame[frame.duplicated(["user", "timestamp"], keep=False)]["user"].unique()
    assert len(tied) > 100
    for user in [*tied[:50], 1, 943]:
        rows = frame[frame["user"] == user].sort_values("timestamp", kind="stable")
        index = by_user[user]
        assert data.item_ids[data.sequences[index]].tolist() == rows["item"].tolist()
        np.testing.assert_array_equal(data.timestamps[index], rows["timestamp"].to_numpy())


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_ties_keep_file_order_and_items_map_to_1_to_n(tmp_path):
    path = write(
        tmp_path / "u.data",
        [
            "1\t50\t4\t100",
            "1\t30\t4\t50",
            "2\t90\t1\t7",
            "1\t90\t4\t100",
            "1\t70\t4\t100",
            "2\t30\t2\t7",
            "2\t50\t5\t3",
        ],
    )
    data = read_movielens(path)
    assert data.users.tolist() == [1, 2]
    assert data.item_ids.tolist() == [-1, 30, 50, 70, 90]
    assert data.item_ids[data.sequences[0]].tolist() == [30, 50, 90, 70]
    assert data.item_ids[data.sequences[1]].tolist() == [50, 90, 30]
    assert data.sequences[0].tolist() == [1, 2, 4, 3]


def test_ratings_dat_separator_and_gzip(tmp_path):
    lines = ["1::1193::5::978300760", "1::661::3::978302109", "1::914::3::978301968"]
    plain = read_movielens(write(tmp_path / "ratings.dat", lines))
    (tmp_path / "ratings.dat.gz").write_bytes(gzip.compress("\n".join(lines).encode()))
    packed = read_movielens(tmp_path / "ratings.dat.gz")
    for data in (plain, packed):
        assert data.item_ids[data.sequences[0]].tolist() == [1193, 914, 661]


def test_min_rating_filter_and_short_users_are_counted(tmp_path):
    path = write(
        tmp_path / "u.data",
        ["1\t1\t5\t1", "1\t2\t2\t2", "1\t3\t4\t3", "1\t4\t3\t4", "2\t1\t5\t1", "2\t2\t5\t2", "3\t3\t1\t1"],
    )
    data = read_movielens(path, min_rating=3)
    # User 2 keeps 2 interactions, user 3 none: both are dropped and counted.
    assert (data.rows_filtered, data.users_dropped, data.interactions_dropped) == (2, 2, 2)
    assert data.users.tolist() == [1]
    assert data.item_ids[data.sequences[0]].tolist() == [1, 3, 4]
    assert "2 rows below min_rating" in data.describe() and "2 users left with < 3" in data.describe()


@pytest.mark.parametrize(
    "bad,expected",
    [
        ("4\t5\t3", "got 3: '4\\t5\\t3'"),
        ("4\t5\t3\t9\t1", "got 5"),
        ("4\tabc\t3\t9", "got item 'abc', which is not an integer"),
        ("4\t5\t3\tnoon", "got timestamp 'noon', which is not a number"),
    ],
)
def test_malformed_line_names_file_and_line(tmp_path, bad, expected):
    path = write(tmp_path / "u.data", ["1\t2\t3\t4", "", "2\t3\t4\t5", bad, "5\t6\t7\t8"])
    with pytest.raises(DataError) as info:
        read_movielens(path, ids="integer")  # ids: auto would read 'abc' as a text id
    message = str(info.value)
    assert message.startswith(f"{path}:4: expected 4 fields user, item, rating, timestamp; ")
    assert expected in message and "\n" not in message


def test_malformed_first_line_names_line_1(tmp_path):
    path = write(tmp_path / "u.data", ["1\t2\t3\t4\t5", "2\t3\t4\t5"])
    with pytest.raises(DataError, match=r"u\.data:1: expected 4 fields"):
        read_movielens(path)


def test_empty_file_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match="the file is empty"):
        read_movielens(write(tmp_path / "u.data", []))


# ---------------------------------------------------------------------------------------
# Synthetic data


def test_synthetic_is_deterministic_and_within_bounds():
    a, b, c = (synthetic(50, 30, 5, 9, 0.8, seed=seed, timestamps=True) for seed in (3, 3, 4))
    assert all(np.array_equal(x, y) for x, y in zip(a.sequences, b.sequences, strict=False))
    assert not all(np.array_equal(x, y) for x, y in zip(a.sequences, c.sequences, strict=False))
    assert all(5 <= len(s) <= 9 and s.min() >= 1 and s.max() <= 30 for s in a.sequences)
    assert all((np.diff(t) >= 1).all() for t in a.timestamps)


def test_synthetic_follow_one_is_a_single_successor_cycle():
    data = synthetic(40, 12, 20, 20, follow=1.0, seed=0, timestamps=False)
    successor = {}
    for seq in data.sequences:
        for prev, nxt in zip(seq[:-1], seq[1:], strict=False):
            assert successor.setdefault(int(prev), int(nxt)) == nxt
    # A cyclic permutation: 12 steps from any item return to it, and every item is visited.
    item, seen = 1, []
    for _ in range(12):
        seen.append(item)
        item = successor[item]
    assert item == 1 and sorted(seen) == list(range(1, 13))


# ---------------------------------------------------------------------------------------
# Leave-one-out split and batches

TWO_USERS = Interactions(
    users=np.array([10, 20]),
    sequences=[np.array([1, 2, 3, 4, 5]), np.array([3, 1, 2])],
    timestamps=[np.array([100.0, 110, 130, 160, 200]), np.array([5.0, 7, 9])],
    num_items=5,
    item_ids=np.r_[-1, 1:6],
    source="two users",
)


def test_train_batches_predict_the_next_item_inside_s_minus_2(tmp_path):
    task = task_for(tmp_path)
    batches = list(task.train_batches(TWO_USERS, batch_size=8, generator=torch.Generator().manual_seed(0)))
    # User 20's training part is [3]: no target, so it is left out.
    assert len(batches) == 1
    batch = batches[0]
    assert batch.users.tolist() == [10]
    assert batch.items.tolist() == [[1, 2]] and batch.targets.tolist() == [[2, 3]]
    assert batch.positions.tolist() == [[0, 1]] and batch.valid.all()
    assert batch.timestamps.tolist() == [[0.0, 10.0]]
    assert task.batch_tokens(batch) == 2


def test_train_window_keeps_the_last_max_len_items(tmp_path):
    task = task_for(tmp_path, max_len=1)
    (batch,) = task.train_batches(TWO_USERS, 8, torch.Generator().manual_seed(0))
    assert batch.items.tolist() == [[2]] and batch.targets.tolist() == [[3]]


@pytest.mark.parametrize(
    "split,items,targets,times",
    [
        # Ordered by history length: user 20 first.
        ("valid", [[3, 0, 0], [1, 2, 3]], [[1, 0, 0], [0, 0, 4]], [[0, 0, 0], [0, 10, 30]]),
        ("test", [[3, 1, 0, 0], [1, 2, 3, 4]], [[0, 2, 0, 0], [0, 0, 0, 5]], [[0, 2, 2, 2], [0, 10, 30, 60]]),
    ],
)
def test_eval_batches_hold_the_history_and_target(split, items, targets, times):
    from ablate_plugins.seqrec.batches import eval_batches

    ((batch, histories, rows),) = eval_batches(TWO_USERS, split, max_len=50, batch_size=8)
    assert rows.tolist() == [1, 0]
    assert batch.users.tolist() == [20, 10]
    assert batch.items.tolist() == items and batch.targets.tolist() == targets
    assert batch.valid.tolist() == [[x > 0 for x in row] for row in items]
    assert batch.timestamps.tolist() == times
    assert [h.tolist() for h in histories] == [[i for i in row if i] for row in items]


def test_eval_batches_are_kept_on_the_data_up_to_a_token_budget(monkeypatch):
    from ablate_plugins.seqrec import batches as B

    data = synthetic(30, 20, 4, 12, 0.5, seed=1, timestamps=True)
    monkeypatch.setattr(B, "EVAL_CACHE_TOKENS", 10)  # fewer than the users' history tokens
    made = B.eval_batches(data, "test", 50, 8)
    assert not isinstance(made, list) and data.batch_cache == {}
    expected = [batch.items.tolist() for batch, _, _ in made]
    monkeypatch.setattr(B, "EVAL_CACHE_TOKENS", 1 << 23)
    kept = B.eval_batches(data, "test", 50, 8)
    assert B.eval_batches(data, "test", 50, 8) is kept is data.batch_cache[("test", 50, 8)]
    assert [batch.items.tolist() for batch, _, _ in kept] == expected
    assert B.eval_batches(data, "valid", 50, 8) is not kept


def test_train_batches_shuffle_with_the_generator_and_pad_to_the_batch(tmp_path):
    task = task_for(tmp_path, max_len=50)
    data = synthetic(30, 20, 4, 12, 0.5, seed=1, timestamps=True)

    def epoch(seed):
        return list(task.train_batches(data, 7, torch.Generator().manual_seed(seed)))

    first, again, other = epoch(0), epoch(0), epoch(1)
    users = torch.cat([b.users for b in first]).tolist()
    assert sorted(users) == list(range(1, 31))
    assert users == torch.cat([b.users for b in again]).tolist()
    assert users != torch.cat([b.users for b in other]).tolist()
    for batch in first:
        lengths = [len(data.sequences[u - 1]) - 3 for u in batch.users.tolist()]
        assert batch.items.shape == (len(lengths), max(lengths))
        assert batch.valid.sum(1).tolist() == lengths
        assert ((batch.targets > 0) == batch.valid).all()
        moved = batch.to("cpu")
        assert moved.items.equal(batch.items) and moved.timestamps.equal(batch.timestamps)


# ---------------------------------------------------------------------------------------
# Loss


class IdentityBackbone(nn.Module):
    def forward(self, x, tokens):
        return x


class FixedAuxiliary(Component):
    """A component whose auxiliary loss is ``value`` whatever the forward did."""

    def __init__(self, value: torch.Tensor):
        super().__init__(Options(), BuildContext(dim=2))
        self.value = value

    def auxiliary_loss(self):
        return self.value


def test_negatives_are_uniform_over_the_other_items():
    positives = torch.full((20_000,), 3)
    draws = sample_negatives(positives, num_items=5, count=2, generator=torch.Generator().manual_seed(0))
    counts = torch.bincount(draws.flatten(), minlength=6).tolist()
    assert counts[0] == 0 and counts[3] == 0
    for item in (1, 2, 4, 5):
        assert abs(counts[item] / 40_000 - 0.25) < 0.01


def test_negatives_exclude_the_users_rated_items_and_stay_uniform_over_the_rest():
    # Two batch rows: row 0 rated {1, 2, 3} of 6 items, row 1 rated {5}. Positives are rated items.
    keys = torch.tensor(sorted([0 * 7 + i for i in (1, 2, 3)] + [1 * 7 + 5]))
    rows = torch.tensor([0] * 15_000 + [1] * 15_000)
    positives = torch.tensor([2] * 15_000 + [5] * 15_000)
    seen = SeenItems(keys, width=7, rows=rows)
    draws = sample_negatives(
        positives, num_items=6, count=2, generator=torch.Generator().manual_seed(0), seen=seen
    )
    row0 = torch.bincount(draws[:15_000].flatten(), minlength=7) / 30_000
    row1 = torch.bincount(draws[15_000:].flatten(), minlength=7) / 30_000
    assert row0[[0, 1, 2, 3]].sum() == 0 and row1[[0, 5]].sum() == 0
    for item in (4, 5, 6):  # the unseen items of row 0, 1/3 each
        assert abs(row0[item] - 1 / 3) < 0.01
    for item in (1, 2, 3, 4, 6):
        assert abs(row1[item] - 1 / 5) < 0.01


def test_seen_keys_hold_each_rows_training_items(tmp_path):
    sequences = [np.array([3, 1, 3, 2, 4, 5]), np.array([2, 4, 1, 6])]
    data = Interactions(
        users=np.array([7, 8]),
        sequences=sequences,
        timestamps=None,
        num_items=6,
        item_ids=np.r_[-1, 1:7],
        source="two users",
    )
    (batch,) = task_for(tmp_path).train_batches(data, 4, torch.Generator().manual_seed(0))
    rated = {int(u): set() for u in batch.users}
    for key in batch.seen.tolist():
        rated[int(batch.users[key // 7])].add(key % 7)
    # training parts s[:-2]: user 7 → 3 1 3 2, user 8 → 2 4
    assert rated == {7: {1, 2, 3}, 8: {2, 4}}
    assert batch.seen.tolist() == sorted(batch.seen.tolist())


@pytest.mark.parametrize("negatives", [1, 3])
def test_bce_matches_the_formula_at_a_hand_set_embedding(tmp_path, negatives):
    # With two items the only negative of item 1 is item 2 and vice versa.
    e = [[0.0, 0.0], [0.3, -0.2], [-0.5, 0.4]]
    model = SeqRecModel(IdentityBackbone(), num_items=2, dim=2)
    with torch.no_grad():
        model.items.weight.copy_(torch.tensor(e))
    data = Interactions(
        users=np.array([1]),
        sequences=[np.array([1, 1, 2, 1, 2])],
        timestamps=None,
        num_items=2,
        item_ids=np.r_[-1, 1:3],
        source="two items",
    )
    task = task_for(tmp_path)
    (batch,) = task.train_batches(data, 4, torch.Generator().manual_seed(0))
    assert batch.items.tolist() == [[1, 1]] and batch.targets.tolist() == [[1, 2]]

    def dot(a, b):
        return math.sqrt(2) * (e[a][0] * e[b][0] + e[a][1] * e[b][1])  # hidden = √d · e[input]

    def sig(x):
        return 1 / (1 + math.exp(-x))

    # (input, target) pairs (1, 1) and (1, 2); the negative of target y is 3 - y.
    terms = [
        -math.log(sig(dot(x, y))) - negatives * math.log(1 - sig(dot(x, 3 - y))) for x, y in [(1, 1), (1, 2)]
    ]
    options = LossOptions.model_validate({"negatives": negatives})
    value = task.loss(model, batch, options, torch.Generator().manual_seed(0))
    assert value.item() == pytest.approx(sum(terms) / 2, rel=1e-6)

    # Training adds the components' auxiliary loss once; the task's own loss leaves it out.
    model.backbone.auxiliary = FixedAuxiliary(torch.tensor(1.5))
    trained = backward_parts(task, model, batch, options, torch.Generator().manual_seed(0), NO_AUTOCAST)
    assert trained.item() == pytest.approx(sum(terms) / 2 + 1.5, rel=1e-6)
    assert task.loss(model, batch, options, torch.Generator().manual_seed(0)).item() == pytest.approx(
        sum(terms) / 2, rel=1e-6
    )


# ---------------------------------------------------------------------------------------
# End to end with a real backbone

STUDY = """\
name: seqrec-synthetic
task: {kind: seqrec, data: {format: synthetic, users: 500, items: 200, seed: 0}, max_len: 50}
model:
  dim: 32
  blocks: 2
  dropout: 0.1
  attention: {kind: softmax, heads: 1}
  ffn: {kind: pointwise}
  norm: {kind: layernorm}
  connection: {kind: residual}
  bias: [{kind: abs_pos}]
train: {loss: {kind: bce, negatives: 1}}
metrics: {primary: hr@10, also: [ndcg@10]}
"""


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    path = tmp_path_factory.mktemp("study") / "study.yaml"
    path.write_text(STUDY)
    return load_study(path)


def build(study):
    task = study.task
    data = task.load()
    variant = study.variants["base"]
    ctx = study.build_context(variant, task.max_len(data))
    torch.manual_seed(0)
    return task, data, task.build_model(build_backbone(variant, ctx), ctx, data)


def test_bce_decreases_on_a_fixed_batch(study):
    task, data, model = build(study)
    batch = next(iter(task.train_batches(data, 32, torch.Generator().manual_seed(0))))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    values = []
    for _ in range(15):
        loss = task.loss(model, batch, study.loss, torch.Generator().manual_seed(1))  # same negatives
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        values.append(loss.item())
    assert values[-1] < 0.7 * values[0]


def test_a_trained_backbone_beats_popularity_on_planted_structure(study):
    task, data, model = build(study)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, betas=(0.9, 0.98))
    generator = torch.Generator().manual_seed(0)
    model.train()
    for _ in range(3):
        for batch in task.train_batches(data, 64, generator):
            loss = task.loss(model, batch, study.loss, generator)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    trained = task.evaluate(model, data, "test", study.metrics, torch.device("cpu"), 256)
    popular = popularity_evaluation(data, "test", study.metrics)
    assert len(trained.per_unit) == 500
    model_hr, popular_hr = trained.summary["hr@10"], popular.summary["hr@10"]
    assert model_hr >= 2 * popular_hr and model_hr >= popular_hr + 0.15, (model_hr, popular_hr)


# ---------------------------------------------------------------------------------------
# Micro-batches: length-sorted groups of one batch


def test_length_groups_cut_sorted_rows_to_their_own_length(tmp_path):
    from ablate_plugins.seqrec.batches import length_groups

    data = synthetic(40, 30, 3, 25, 0.5, seed=2, timestamps=True)
    task = task_for(tmp_path, max_len=50)
    batch = next(iter(task.train_batches(data, 40, torch.Generator().manual_seed(0))))
    width = data.num_items + 1
    row_of = {int(u): r for r, u in enumerate(batch.users)}
    rated = {int(u): set() for u in batch.users}
    for key in batch.seen.tolist():
        rated[int(batch.users[key // width])].add(key % width)
    groups = length_groups(batch, 3, width)
    b = len(batch.users)
    assert [len(g.users) for g in groups] == [b // 3 + (i < b % 3) for i in range(3)]
    assert sorted(torch.cat([g.users for g in groups]).tolist()) == sorted(batch.users.tolist())
    lengths = torch.cat([g.lengths for g in groups])
    assert lengths.tolist() == sorted(lengths.tolist(), reverse=True)  # longest rows first
    for group in groups:
        n = int(group.lengths.max())
        assert group.items.shape == (len(group.users), n)
        rows = torch.tensor([row_of[int(u)] for u in group.users])
        for name in ("items", "targets", "valid", "positions", "timestamps"):
            assert getattr(group, name).equal(getattr(batch, name)[rows, :n]), name
        assert not batch.valid[rows, n:].any()  # nothing real was cut off
        regrouped = {int(u): set() for u in group.users}
        for key in group.seen.tolist():
            regrouped[int(group.users[key // width])].add(key % width)
        assert regrouped == {u: rated[u] for u in regrouped}
        assert group.seen.tolist() == sorted(group.seen.tolist())


@pytest.mark.parametrize("jagged", [True, False])
def test_micro_batches_give_the_whole_batch_mean_loss_and_gradients(study, jagged):
    from ablate.jagged import Jagged
    from ablate_plugins.seqrec.model import padded_layout

    task, data, model = build(study)
    model.layout = Jagged.from_valid if jagged else padded_layout
    model.eval()  # no dropout: both routes see the same network
    batch = next(iter(task.train_batches(data, 64, torch.Generator().manual_seed(0))))
    options = LossOptions.model_validate({"kind": "softmax"})  # no sampling: equal draws not needed
    results = []
    for groups in (1, 3):
        model.zero_grad()
        if groups == 1:
            value = task.loss(model, batch, options, torch.Generator().manual_seed(0))
        else:  # the groups' means weighted by their shares, in one graph
            pieces = task.split_batch(model, batch, groups)
            assert len(pieces) == groups and sum(share for _, share in pieces) == pytest.approx(1.0)
            value = sum(
                task.loss(model, piece, options, torch.Generator().manual_seed(0)) * share
                for piece, share in pieces
            )
        value.backward()
        results.append((value.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    # As training runs it: each group's part backpropagated before the next is computed.
    model.zero_grad()
    value = backward_parts(task, model, batch, options, torch.Generator().manual_seed(0), NO_AUTOCAST, 3)
    results.append((value, {n: p.grad.clone() for n, p in model.named_parameters()}))
    (whole, whole_grads), *grouped_routes = results
    assert len(set(batch.lengths.tolist())) > 3  # the groups really differ in length
    for grouped, grouped_grads in grouped_routes:
        assert grouped.item() == pytest.approx(whole.item(), rel=1e-5)
        for name, grad in whole_grads.items():
            torch.testing.assert_close(grouped_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)


class HeldBytes:
    """A saved-tensor hook's record: the bytes autograd graphs hold now, and the most at once."""

    live = peak = 0

    def __init__(self, tensor: torch.Tensor):
        self.tensor, self.size = tensor, tensor.numel() * tensor.element_size()
        HeldBytes.live += self.size
        HeldBytes.peak = max(HeldBytes.peak, HeldBytes.live)

    def __del__(self):
        HeldBytes.live -= self.size


def test_training_holds_one_micro_batch_graph_at_a_time(study):
    task, data, model = build(study)
    batch = next(iter(task.train_batches(data, 64, torch.Generator().manual_seed(0))))
    options = LossOptions.model_validate({"kind": "softmax"})
    peaks = {}
    for groups in (1, 4):
        HeldBytes.live = HeldBytes.peak = 0
        with torch.autograd.graph.saved_tensors_hooks(HeldBytes, lambda held: held.tensor):
            backward_parts(task, model, batch, options, torch.Generator().manual_seed(0), NO_AUTOCAST, groups)
        peaks[groups] = HeldBytes.peak
        assert HeldBytes.live == 0  # every graph was freed by its backward
    # The longest of 4 length-sorted groups holds its quarter of the rows at most at full length.
    assert peaks[4] < 0.4 * peaks[1]


def test_micro_batches_keep_negatives_among_each_users_unseen_items(study):
    task, data, model = build(study)
    batch = next(iter(task.train_batches(data, 64, torch.Generator().manual_seed(0))))
    from ablate_plugins.seqrec import losses
    from ablate_plugins.seqrec.batches import length_groups

    width = data.num_items + 1
    for group in length_groups(batch, 4, width):
        where = group.targets > 0
        seen = losses.SeenItems(group.seen, width, where.nonzero(as_tuple=True)[0])
        generator = torch.Generator().manual_seed(0)
        drawn = sample_negatives(group.targets[where], data.num_items, 8, generator, seen)
        users = group.users[where.nonzero(as_tuple=True)[0]]
        for user, row in zip(users.tolist(), drawn.tolist(), strict=False):
            rated = set(data.sequences[int(np.flatnonzero(data.users == user)[0])][:-2].tolist())
            assert not rated & set(row)


def test_request_times_are_the_time_of_the_item_each_position_predicts(tmp_path):
    """``request_times`` (HSTU's / FuXi-α's request time, for ``time_reference: request``): position
    i's is item i + 1's time, the last position's the target's, from the window's first item as
    ``timestamps``; padding repeats the last; micro-batches keep them."""
    from ablate_plugins.seqrec.batches import eval_batches, length_groups

    (batch,) = task_for(tmp_path).train_batches(TWO_USERS, 8, torch.Generator().manual_seed(0))
    assert batch.request_times.tolist() == [[10.0, 30.0]]  # items [1, 2] at 100, 110; targets at 110, 130
    assert batch.token_context().request_times is batch.request_times
    ((valid, _, _),) = eval_batches(TWO_USERS, "valid", max_len=50, batch_size=8)
    assert valid.request_times.tolist() == [[2, 2, 2], [10, 30, 60]]
    ((test, _, _),) = eval_batches(TWO_USERS, "test", max_len=50, batch_size=8)
    assert test.request_times.tolist() == [[2, 4, 4, 4], [10, 30, 60, 100]]
    ((cut, _, _),) = eval_batches(TWO_USERS, "test", max_len=2, batch_size=8)
    assert cut.timestamps.tolist() == [[0, 2], [0, 30]] and cut.request_times.tolist() == [[2, 4], [30, 70]]
    long, short = length_groups(test, 2, TWO_USERS.num_items + 1)
    assert short.request_times.tolist() == [[2, 4]] and long.request_times.tolist() == [[10, 30, 60, 100]]

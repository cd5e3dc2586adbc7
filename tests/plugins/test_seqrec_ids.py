"""seqrec ids of any form: text ids (Amazon / Yelp dumps) and integers beyond 64 bits map to
indices in sorted order, integer files keep their indices, the map is kept with the run, and a
public-style review dump trains from a study file alone."""

from __future__ import annotations

import csv
import io
import logging
import random
from pathlib import Path

import numpy as np
import pytest
import yaml
from mlflow import MlflowClient

from ablate.errors import DataError
from ablate_plugins.seqrec import (
    SeqRecOptions,
    SeqRecTask,
    cached,
    read_table,
    read_user_item,
    read_user_lines,
)


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def review_dump(path: Path, users: int = 40, seed: int = 0) -> Path:
    """An Amazon-like ``user,item,rating,timestamp`` export: 14-character reviewer ids, ASIN item
    ids (some all digits, as book ASINs are), rows in no particular order."""
    rng = random.Random(seed)
    letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    asins = [f"B0{''.join(rng.choices(letters, k=8))}" for _ in range(25)] + [
        f"{rng.randrange(10**9):010d}" for _ in range(5)
    ]
    rows = []
    for _ in range(users):
        reviewer = "A" + "".join(rng.choices(letters, k=13))
        start = rng.randrange(1_300_000_000, 1_400_000_000)
        for k in range(rng.randrange(4, 9)):
            rows.append((reviewer, rng.choice(asins), float(rng.randrange(1, 6)), start + 86_400 * k))
    rng.shuffle(rows)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["user", "item", "rating", "timestamp"])
    writer.writerows(rows)
    path.write_text(out.getvalue())
    return path


def test_text_ids_map_to_indices_in_sorted_order(tmp_path):
    path = write(
        tmp_path / "r.csv",
        ["user,item,t", "zed,B02,3", "A2IBPI20UZIR0U,B01,1", "zed,0001,1", "A2IBPI20UZIR0U,B02,2"]
        + ["A2IBPI20UZIR0U,0001,3", "zed,B01,2"],
    )
    data = read_table(path, timestamp="t")
    assert data.user_ids.tolist() == ["A2IBPI20UZIR0U", "zed"] and data.users.tolist() == [0, 1]
    assert data.item_ids.tolist() == ["", "0001", "B01", "B02"]  # text: "0001" stays "0001"
    assert [data.item_ids[s].tolist() for s in data.sequences] == [
        ["B01", "B02", "0001"],
        ["0001", "B01", "B02"],
    ]


def test_row_order_does_not_change_the_indices(tmp_path):
    first = read_table(review_dump(tmp_path / "a.csv", seed=1), timestamp="timestamp")
    lines = (tmp_path / "a.csv").read_text().splitlines()
    shuffled = write(tmp_path / "b.csv", [lines[0], *reversed(lines[1:])])
    second = read_table(shuffled, timestamp="timestamp")
    assert first.user_ids.tolist() == second.user_ids.tolist() == sorted(first.user_ids.tolist())
    assert first.item_ids.tolist() == second.item_ids.tolist()
    assert all(np.array_equal(a, b) for a, b in zip(first.sequences, second.sequences, strict=True))


def test_integer_ids_keep_their_indices_and_units(tmp_path):
    lines = ["9 30", "9 7", "9 100", "12 7", "12 30", "12 5"]
    data = read_user_item(write(tmp_path / "d.txt", lines))
    assert data.users.tolist() == [9, 12] and data.user_ids is None
    assert data.item_ids.tolist() == [-1, 5, 7, 30, 100]  # numeric order, not "100" < "30"
    assert data.item_ids.dtype == np.int64
    text = read_user_item(write(tmp_path / "d.txt", lines), ids="text")
    assert text.user_ids.tolist() == ["12", "9"] and text.item_ids.tolist() == ["", "100", "30", "5", "7"]


def test_integers_beyond_64_bits_keep_numeric_order_and_never_overflow(tmp_path):
    big = [str(2**64 + k) for k in (10, 2, 1)]
    lines = [f"{big[0]} 1", f"{big[0]} 2", f"{big[0]} 3", f"{big[1]} 3", f"{big[1]} 1", f"{big[1]} 2"]
    for reader, path in ((read_user_item, "d.txt"), (read_table, "d.csv")):
        rows = (
            lines if reader is read_user_item else ["user,item", *(line.replace(" ", ",") for line in lines)]
        )
        data = reader(write(tmp_path / path, rows))
        assert data.user_ids.tolist() == [big[1], big[0]]
    with pytest.raises(
        DataError, match=r"d.csv:2: user column 'user' holds '18446744073709551626', which does not fit"
    ):
        read_table(tmp_path / "d.csv", ids="integer")


def test_one_line_per_user_with_text_ids(tmp_path):
    data = read_user_lines(write(tmp_path / "u.txt", ["ann b1 b2 b3", "", "bob b2 b9 b1 b2"]))
    assert data.user_ids.tolist() == ["ann", "bob"] and data.item_ids.tolist() == ["", "b1", "b2", "b3", "b9"]


def test_a_stray_text_id_among_integers_is_warned_about(tmp_path, caplog):
    lines = ["user,item"] + [f"{u},{i}" for u in range(1, 40) for i in range(1, 5)] + ["1,7x"]
    with caplog.at_level(logging.WARNING):
        read_table(write(tmp_path / "d.csv", lines))
    assert (
        "d.csv:158: item column 'item' holds '7x', which is not an integer while 99.36% of the ids are"
        in (caplog.text)
    )


def test_remap_off_needs_integer_ids_of_a_sane_size(tmp_path):
    with pytest.raises(DataError, match=r"d.txt:1: .*got item 'a', which is not an integer \(remap: false"):
        read_user_item(write(tmp_path / "d.txt", ["1 a", "1 b", "1 c"]), remap=False)
    with pytest.raises(
        DataError, match=r"item id 99999999999 with remap: false would make an embedding table"
    ):
        read_user_item(write(tmp_path / "d.txt", ["1 99999999999", "1 2", "1 3"]), remap=False)


def test_text_ids_survive_the_cache(tmp_path):
    path = review_dump(tmp_path / "r.csv")

    def load():
        return cached(path, {"format": "csv"}, lambda: read_table(path), tmp_path / "cache")

    first, again = load(), load()
    assert again.from_cache and again.user_ids.tolist() == first.user_ids.tolist()
    assert again.item_ids.tolist() == first.item_ids.tolist() and again.id_maps() == first.id_maps()


def test_the_id_maps_pair_units_and_indices_with_source_ids(tmp_path):
    data = read_table(
        write(tmp_path / "r.csv", ["user,item", *(f"u{u},i{i}" for u in (2, 1) for i in (3, 1, 2))])
    )
    maps = {name: list(csv.reader(io.StringIO(body.decode()))) for name, body in data.id_maps().items()}
    assert maps["users.csv"] == [["unit", "id"], ["0", "u1"], ["1", "u2"]]
    assert maps["items.csv"] == [["index", "id"], ["1", "i1"], ["2", "i2"], ["3", "i3"]]
    task = SeqRecTask(SeqRecOptions.model_validate({"data": {"format": "csv", "path": "r.csv"}}), tmp_path)
    assert set(task.artifacts(data)) == {"users.csv", "items.csv"}
    assert SeqRecTask(SeqRecOptions(), tmp_path).artifacts(data) == {}  # synthetic data: nothing to trace


@pytest.mark.heavy
def test_a_review_dump_with_text_ids_trains_from_a_study_file_alone(tmp_path, cli):
    review_dump(tmp_path / "reviews.csv")
    study = {
        "name": "reviews",
        "task": {
            "kind": "seqrec",
            "data": {"format": "csv", "path": "reviews.csv", "timestamp": "timestamp", "rating": "rating"},
            "max_len": 8,
        },
        "model": {
            "dim": 8,
            "blocks": 1,
            "attention": {"kind": "softmax", "heads": 1},
            "ffn": {"kind": "pointwise"},
        },
        "train": {"epochs": 1, "batch_size": 16},
        "seeds": [0],
        "metrics": {"primary": "ndcg@10"},
        "output": str(tmp_path / "runs/reviews"),
    }
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(study))
    code, _, err = cli("run", tmp_path / "study.yaml", "--quiet", "--reports", tmp_path / "reports")
    assert code == 0, err
    client = MlflowClient(f"sqlite:///{tmp_path / 'runs/reviews/mlflow.db'}")
    experiment = client.get_experiment_by_name("reviews").experiment_id
    (parent,) = client.search_runs([experiment], "tags.`ablate.role` = 'study'")
    assert {a.path for a in client.list_artifacts(parent.info.run_id, "data")} == {
        "data/users.csv",
        "data/items.csv",
    }
    local = client.download_artifacts(parent.info.run_id, "data/users.csv", str(tmp_path / "dl"))
    users = list(csv.DictReader(Path(local).open()))
    assert len(users) == 40 and all(len(u["id"]) == 14 and u["id"].startswith("A") for u in users)

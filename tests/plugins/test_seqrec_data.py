"""seqrec loaders on the real files of named data sets and on small written files: SASRec
``user item`` lines, one line per user, CSV / TSV; k-core, rating threshold, id remapping,
file:line errors, filtered-row counts, and the dataset cache."""

from __future__ import annotations

import gzip
import logging
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest

from ablate.cache import file_digest
from ablate.errors import DataError
from ablate_plugins.seqrec import (
    SeqRecOptions,
    SeqRecTask,
    cached,
    read_movielens,
    read_table,
    read_user_item,
    read_user_lines,
)


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


# ---------------------------------------------------------------------------------------
# Real files


def test_sasrec_ml1m_file_loads_whole_in_file_order(data_file):
    sasrec_ml1m = data_file("ml-1m-sasrec-minus978")
    data = read_user_item(sasrec_ml1m)
    # Counts documented in shared/data/README.md §2b.
    assert (data.num_users, data.num_items, data.num_interactions) == (6040, 3416, 998_633)
    assert data.timestamps is None and (data.users_dropped, data.k_core_rows) == (0, 0)
    # SASRec ids are already 1..3416, so remapping keeps them.
    assert data.item_ids.tolist() == [-1, *range(1, 3417)]
    expected = defaultdict(list)
    with open(sasrec_ml1m) as f:
        for line in f:
            user, item = line.split()
            if user in ("1", "2", "6040"):
                expected[int(user)].append(int(item))
    for user, items in expected.items():
        assert data.sequences[user - 1].tolist() == items


def test_one_line_per_user_beauty_matches_the_published_counts(data_file):
    beauty = data_file("beauty")
    data = read_user_lines(beauty)
    assert (data.num_users, data.num_items, data.num_interactions) == (22_363, 12_101, 198_502)
    first = beauty.read_text().splitlines()[0].split()
    assert data.users[0] == int(first[0])
    assert data.item_ids[data.sequences[0]].tolist() == [int(v) for v in first[1:]]


def test_ml1m_ratings_with_a_rating_threshold_and_k_core(data_file):
    ratings = data_file("ml-1m-users2999")
    data = read_movielens(ratings, min_rating=4, k_core=5)
    # Independent count: rows with rating >= 4, then the k-core fixed point by plain loops.
    rows = []
    with gzip.open(ratings, "rt", encoding="latin-1") as f:
        for line in f:
            user, item, rating, _ = line.split("::")
            if float(rating) >= 4:
                rows.append((int(user), int(item)))
    kept = rows
    while True:
        users, items = Counter(u for u, _ in kept), Counter(i for _, i in kept)
        still = [(u, i) for u, i in kept if users[u] >= 5 and items[i] >= 5]
        if len(still) == len(kept):
            break
        kept = still
    assert data.rows_filtered == 487_650 - len(rows)
    assert data.k_core_rows == len(rows) - len(kept)
    assert data.num_interactions == len(kept)
    assert data.num_items == len({i for _, i in kept}) and data.num_users == len({u for u, _ in kept})
    assert f"{data.k_core_rows} rows removed by k-core" in data.describe()


# ---------------------------------------------------------------------------------------
# Small files


def test_user_item_lines_keep_file_order_and_remap_items(tmp_path):
    path = write(tmp_path / "d.txt", ["1 50", "1 30", "1 90", "2 30", "2 50", "2 70", "1 70"])
    data = read_user_item(path)
    assert data.item_ids.tolist() == [-1, 30, 50, 70, 90]
    assert data.item_ids[data.sequences[0]].tolist() == [50, 30, 90, 70]
    assert data.sequences[1].tolist() == [1, 2, 3]
    kept = read_user_item(path, remap=False)
    assert kept.num_items == 90 and kept.sequences[0].tolist() == [50, 30, 90, 70]


def test_remap_off_needs_positive_ids(tmp_path):
    with pytest.raises(DataError, match="positive integers when remap is off"):
        read_user_item(write(tmp_path / "d.txt", ["1 0", "1 2", "1 3"]), remap=False)


def test_k_core_iterates_to_a_fixed_point(tmp_path):
    # 2-core: users 4, 5 and item 4 go first; then item 9 has one row left (user 3), then user
    # 3 has one row (item 2), then item 2 has one row (user 1). Users 1 and 2 keep 1, 3, 5.
    lines = ["1 1", "1 3", "1 2", "1 5", "2 1", "2 3", "2 5", "3 9", "3 2", "4 9", "5 4"]
    data = read_user_item(write(tmp_path / "d.txt", lines), k_core=2)
    assert data.k_core_rows == 5 and data.users_dropped == 3
    assert [data.item_ids[s].tolist() for s in data.sequences] == [[1, 3, 5], [1, 3, 5]]


@pytest.mark.parametrize(
    "reader,lines,line_no,expected",
    [
        (read_user_item, ["1 2", "1 3", "1 x"], 3, "got item 'x', which is not an integer"),
        (read_user_item, ["1 2", "", "1 3 4"], 3, "expected 2 fields user, item; got 3"),
        (read_user_lines, ["1 2 3", "2 4 y 5"], 2, "got 'y', which is not an integer"),
        (read_user_lines, ["1 2 3", "2"], 2, "a user with no items"),
    ],
)
def test_malformed_lines_name_file_and_line(tmp_path, reader, lines, line_no, expected):
    path = write(tmp_path / "d.txt", lines)
    with pytest.raises(DataError) as info:
        reader(path, ids="integer")  # ids: auto would read 'x' as a text id
    assert str(info.value).startswith(f"{path}:{line_no}: ") and expected in str(info.value)


def test_csv_named_columns_timestamps_sort_stably_and_ratings_filter(tmp_path):
    path = write(
        tmp_path / "r.csv",
        [
            "uid,when,iid,stars,extra",
            "7,5,100,4,a",
            "7,1,200,5,b",
            "7,5,300,1,c",
            "7,5,400,5,d",
            "8,1,100,5,e",
            "8,2,300,5,f",
            "8,3,200,5,g",
        ],
    )
    data = read_table(path, user="uid", item="iid", timestamp="when", rating="stars", min_rating=2)
    assert data.rows_filtered == 1
    # Ties at time 5 keep file order (100 before 400); item 300 fell below min_rating.
    assert data.item_ids[data.sequences[0]].tolist() == [200, 100, 400]
    assert data.timestamps[0].tolist() == [1.0, 5.0, 5.0]
    assert data.item_ids[data.sequences[1]].tolist() == [100, 300, 200]


def test_tsv_without_header_uses_column_indices(tmp_path):
    path = write(tmp_path / "r.tsv", ["9\t1\t3", "9\t2\t1", "9\t3\t2"])
    data = read_table(path, sep="\t", header=False, user=0, item=1, timestamp=2)
    assert data.item_ids[data.sequences[0]].tolist() == [2, 3, 1]


@pytest.mark.parametrize(
    "lines,kwargs,expected",
    [
        (
            ["user,item", "1,2", "1,x", "1,3"],
            {"ids": "integer"},
            ":3: item column 'item' holds 'x', which is not an integer",
        ),
        (["user,item,t", "1,2,5", "1,3,soon"], {"timestamp": "t"}, ":3: timestamp column 't' holds 'soon'"),
        (["user,item", "1,2", "1,3,4"], {}, ":3: expected 2 fields (user, item); got 3"),
        (["user,item", "1,2"], {"item": "movie"}, ":1: no column 'movie' for item (columns: user, item)"),
    ],
)
def test_csv_errors_name_file_and_line(tmp_path, lines, kwargs, expected):
    path = write(tmp_path / "r.csv", lines)
    with pytest.raises(DataError) as info:
        read_table(path, **kwargs)
    assert str(info.value) == f"{path}{expected}" or str(info.value).startswith(f"{path}{expected}")
    assert "\n" not in str(info.value)


def test_filtered_rows_are_logged(tmp_path, caplog):
    path = write(tmp_path / "d.txt", ["1 1", "1 2", "1 3", "2 1"])
    with caplog.at_level(logging.WARNING):
        data = read_user_item(path)
    assert data.users_dropped == 1 and data.interactions_dropped == 1
    assert "1 users left with < 3 interactions dropped" in caplog.text


# ---------------------------------------------------------------------------------------
# Cache


def test_cache_is_keyed_by_file_content_and_options(tmp_path):
    path = write(tmp_path / "d.txt", ["1 5", "1 6", "1 7", "2 5", "2 7", "2 6"])
    calls = []

    def load(**options):
        def run():
            calls.append(options)
            return read_user_item(path, **options)

        return cached(path, {"format": "user_item", **options}, run, tmp_path / "cache")

    first = load()
    again = load()
    assert len(calls) == 1 and again.from_cache and not first.from_cache
    assert [s.tolist() for s in again.sequences] == [s.tolist() for s in first.sequences]
    assert again.item_ids.tolist() == first.item_ids.tolist() and again.users.tolist() == first.users.tolist()
    load(remap=False)
    assert len(calls) == 2  # other options: parsed again
    write(path, ["1 5", "1 6", "1 7", "2 5", "2 7", "2 8"])
    changed = load()
    assert len(calls) == 3 and changed.num_items == 4  # other content: parsed again


def test_task_load_goes_through_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ABLATE_CACHE_DIR", str(tmp_path / "cache"))
    write(tmp_path / "d.txt", ["1 5", "1 6", "1 7"])
    task = SeqRecTask(
        SeqRecOptions.model_validate({"data": {"format": "user_item", "path": "d.txt"}}), tmp_path
    )
    assert not task.load().from_cache and task.load().from_cache
    assert len(list((tmp_path / "cache").glob("seqrec-*.npz"))) == 1
    uncached = SeqRecTask(
        SeqRecOptions.model_validate({"data": {"format": "user_item", "path": "d.txt"}, "cache": False}),
        tmp_path,
    )
    assert not uncached.load().from_cache


def test_bad_data_file_exits_2_with_one_line(write_study, cli, tmp_path):
    write(tmp_path / "d.txt", ["1 5", "1 6", "1 seven"])
    path = write_study(replace={"task.data": {"format": "user_item", "path": "d.txt", "ids": "integer"}})
    code, out, err = cli(
        "run", str(path), "-q", "-o", str(tmp_path / "out"), "--reports", str(tmp_path / "r")
    )
    assert code == 2
    assert "d.txt:3: expected 2 fields user, item; got item 'seven', which is not an integer" in err
    assert "Traceback" not in out + err


def test_an_edited_or_shared_cache_entry_is_parsed_again(tmp_path, caplog):
    path = write(tmp_path / "d.txt", ["1 5", "1 6", "1 7", "2 5", "2 7", "2 6"])
    calls = []

    def load(folder="cache"):
        def run():
            calls.append(1)
            return read_user_item(path)

        return cached(path, {"format": "user_item"}, run, tmp_path / folder)

    first = load()
    (entry,) = (tmp_path / "cache").glob("seqrec-*.npz")
    assert entry.with_suffix(".sha256").read_text() == file_digest(entry)  # the digest beside it
    planted = dict(np.load(entry))
    planted["items"] = planted["items"][::-1].copy()  # someone's edit: the sequences reversed
    np.savez(entry, **planted)
    again = load()
    assert len(calls) == 2 and not again.from_cache  # parsed again, not trained on
    assert [s.tolist() for s in again.sequences] == [s.tolist() for s in first.sequences]
    assert load().from_cache and len(calls) == 2
    (tmp_path / "shared").mkdir(mode=0o777)
    (tmp_path / "shared").chmod(0o777)  # any local user could replace an entry here
    assert not load("shared").from_cache and not load("shared").from_cache and len(calls) == 4
    assert "not using the dataset cache" in caplog.text and not list((tmp_path / "shared").iterdir())

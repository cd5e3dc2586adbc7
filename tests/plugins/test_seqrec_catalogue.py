"""``task.catalogue``: items from a catalogue file (MovieLens movies.dat), the unrated ones included,
so negatives are drawn and rankings made among all of them (issue 37: the HSTU / FuXi-α trainers'
3,883 ML-1M movies against the 3,615 rated in users 1–2999)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from ablate.errors import DataError
from ablate_plugins.seqrec import SeqRecOptions, SeqRecTask
from ablate_plugins.seqrec.metrics import draw_negatives

RATINGS = [  # user::item::rating::time; items 5, 7 and 9 are rated, 2 and 8 only catalogued
    "1::7::5::10",
    "1::5::3::20",
    "1::9::4::30",
    "2::9::4::15",
    "2::5::2::16",
    "2::7::2::17",
]
# movies.dat's layout; a Latin-1 title, as ML-1M's own file has.
MOVIES = b"2::Caf\xe9 (1999)::Drama\n5::B (1995)::Comedy\n7::C (1996)::Drama\n8::D::X\n9::E::Y\n"


def task(tmp_path: Path, catalogue: str | None = "movies.dat", movies: bytes = MOVIES) -> SeqRecTask:
    (tmp_path / "ratings.dat").write_text("\n".join(RATINGS) + "\n")
    (tmp_path / "movies.dat").write_bytes(movies)
    options = {"data": {"format": "movielens", "path": "ratings.dat"}, "cache": False}
    if catalogue is not None:
        options["catalogue"] = catalogue
    return SeqRecTask(SeqRecOptions.model_validate(options), tmp_path)


def test_every_catalogue_item_gets_a_row_and_the_sequences_keep_their_items(tmp_path):
    plain, full = task(tmp_path, None).load(), task(tmp_path).load()
    assert plain.num_items == 3 and plain.item_ids.tolist() == [-1, 5, 7, 9]
    assert full.num_items == 5 and full.item_ids.tolist() == [-1, 2, 5, 7, 8, 9]
    # The same items in the same order, by source id.
    assert [full.item_ids[s].tolist() for s in full.sequences] == [[7, 5, 9], [9, 5, 7]]
    assert [plain.item_ids[s].tolist() for s in plain.sequences] == [[7, 5, 9], [9, 5, 7]]
    assert full.timestamps is not None and full.timestamps[0].tolist() == [10, 20, 30]


def test_negatives_come_from_the_whole_catalogue(tmp_path):
    data = task(tmp_path).load()
    drawn = draw_negatives(data.sequences, data.num_items, 200, seed=0)
    # A user's unrated items are all catalogue rows but theirs: the never-rated 2 and 8 among them.
    assert set(data.item_ids[np.unique(drawn)].tolist()) == {2, 8}
    model_rows = torch.arange(1, data.num_items + 1)
    assert data.item_ids[model_rows.numpy()].tolist() == [2, 5, 7, 8, 9]


def test_the_catalogue_is_a_data_file_of_the_study(tmp_path):
    t = task(tmp_path)
    assert t.data_files() == {"path": tmp_path / "ratings.dat", "catalogue": tmp_path / "movies.dat"}
    assert t.check_files() is None
    assert "not a file" in task(tmp_path, "nowhere.dat").check_files()


def test_an_item_missing_from_the_catalogue_is_named(tmp_path):
    with pytest.raises(DataError, match=r"item 9 of the data is not in the catalogue \(1 of 3"):
        task(tmp_path, movies=b"2::A::X\n5::B::X\n7::C::X\n").load()


def test_a_catalogue_needs_a_data_file_with_remapped_items():
    with pytest.raises(ValidationError, match="synthetic data has none"):
        SeqRecOptions.model_validate({"catalogue": "movies.dat"})
    with pytest.raises(ValidationError, match="set data.remap: true"):
        SeqRecOptions.model_validate(
            {"data": {"format": "movielens", "path": "r.dat", "remap": False}, "catalogue": "m.dat"}
        )


def test_ml1m_users_1_to_2999_against_all_3883_movies(tmp_path, data_file):
    data_file("ml-1m-users2999", beside="movies.dat")  # GroupLens's catalogue beside the ratings
    options = {
        "data": {"format": "movielens", "path": str(data_file("ml-1m-users2999"))},
        "catalogue": "movies.dat",
        "cache": False,
    }
    data = SeqRecTask(SeqRecOptions.model_validate(options), tmp_path).load()
    assert data.num_items == 3883
    assert len(np.unique(np.concatenate(data.sequences))) == 3615

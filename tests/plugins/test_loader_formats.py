"""Data as researchers download it (issue 36): a zip archive read by the loaders directly, UCI's
raw ``adult.test`` (a junk first line, labels with a trailing dot) through the tabular task, JSON
lines (Amazon Reviews) for seqrec, and an ETT split on a series that is not ETT said, not silent.
Every bad input is one line naming the file (and line)."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest

from ablate.errors import DataError
from ablate_plugins.forecast import ForecastOptions, ForecastTask
from ablate_plugins.seqrec.readers import read_json_lines, read_movielens
from ablate_plugins.tabular import TabularOptions, TabularTask
from ablate_plugins.text_files import read_text


def _zip(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path


# ---------------------------------------------------------------------------------------
# Zip archives


def test_a_zip_of_one_data_file_is_read_as_the_file(tmp_path):
    text = "1\t10\t5\t100\n1\t11\t4\t200\n1\t12\t3\t300\n2\t10\t5\t100\n2\t12\t4\t200\n2\t11\t1\t300\n"
    extras = {"ml/": b"", "__MACOSX/ml/._u.data": b"\x00\x05", "ml/.DS_Store": b"\x00\x01"}
    path = _zip(tmp_path / "ml.zip", {"ml/u.data": text.encode(), **extras})
    assert read_text(path) == text
    (tmp_path / "u.data").write_text(text)
    zipped, plain = read_movielens(path), read_movielens(tmp_path / "u.data")
    assert [s.tolist() for s in zipped.sequences] == [s.tolist() for s in plain.sequences]
    assert zipped.sequences[0].tolist() == [1, 2, 3]
    unnamed = tmp_path / "download"  # a zip by its bytes, whatever its name
    unnamed.write_bytes(path.read_bytes())
    assert read_text(unnamed) == text


@pytest.mark.parametrize(
    "members, words",
    [
        (
            {"a.csv": b"x\n1\n", "b.csv": b"x\n2\n"},
            "a zip archive holding 2 files (a.csv, b.csv); a loader reads a zip that holds one",
        ),
        ({"dir/": b""}, "a zip archive holding no data file"),
    ],
)
def test_a_zip_of_several_or_no_files_names_them(tmp_path, members, words):
    path = _zip(tmp_path / "d.zip", members)
    with pytest.raises(DataError) as info:
        read_text(path)
    assert str(info.value).startswith(f"{path}: ") and words in str(info.value)
    assert "\n" not in str(info.value)


def test_a_broken_zip_is_one_line(tmp_path):
    path = tmp_path / "d.zip"
    path.write_bytes(b"PK\x03\x04 cut off")
    with pytest.raises(DataError, match=r"d.zip: not a readable zip archive"):
        read_text(path)
    whole = io.BytesIO()
    _zip(tmp_path / "ok.zip", {"d.csv": b"x\n1\n" * 50})
    whole.write((tmp_path / "ok.zip").read_bytes())
    damaged = bytearray(whole.getvalue())
    damaged[40] ^= 0xFF  # inside the compressed member
    path.write_bytes(bytes(damaged))
    with pytest.raises(DataError, match=r"d.zip: (cannot read d.csv from the archive|not a readable zip)"):
        read_text(path)


# ---------------------------------------------------------------------------------------
# UCI adult.test as shipped

COLUMNS = ["age", "workclass", "hours", "income"]
TRAIN = [
    f"{20 + i}, {'Private' if i % 3 else 'State-gov'}, {30 + i % 20}, {'>50K' if i % 4 else '<=50K'}"
    for i in range(40)
]
# adult.test: a junk first line, the same rows' layout, labels ending in a dot, a blank line at the end
TEST = ["|1x3 Cross validator", *[row + "." for row in TRAIN[:12]], ""]


def _adult(tmp_path: Path, **data) -> TabularTask:
    (tmp_path / "adult.data").write_text("\n".join(TRAIN) + "\n")
    (tmp_path / "adult.test").write_text("\n".join(TEST) + "\n")
    spec = {
        "format": "csv",
        "path": "adult.data",
        "test": "adult.test",
        "header": False,
        "columns": COLUMNS,
        "target": "income",
        "task_type": "binclass",
        "numeric": ["age", "hours"],
        "categorical": ["workclass"],
        "missing": "impute",
        **data,
    }
    return TabularTask(TabularOptions.model_validate({"data": spec, "scaling": "none"}), tmp_path)


def test_raw_uci_adult_test_loads_with_comment_and_label_suffix(tmp_path):
    table = _adult(tmp_path, comment="|", label_suffix=".").load()
    test = table.splits["test"]
    assert len(test) == 12  # the junk line and the blank one skipped
    expected = np.array([1.0 if i % 4 else 0.0 for i in range(12)])  # classes '<=50K' 0, '>50K' 1
    np.testing.assert_array_equal(test.y.astype(np.float64).ravel(), expected)
    assert test.numeric[:, 0].tolist() == [20.0 + i for i in range(12)]


def test_raw_uci_adult_test_errors_point_to_the_options(tmp_path):
    with pytest.raises(DataError) as info:
        _adult(tmp_path).load()
    message = str(info.value)
    assert message.startswith(f"{tmp_path / 'adult.test'}:1: expected 4 fields")
    assert "set data.comment: '|'" in message and "data.sep" not in message  # not the separator
    with pytest.raises(DataError) as info:
        _adult(tmp_path, comment="|").load()
    assert str(info.value).startswith(f"{tmp_path / 'adult.test'}:2: target class '<=50K.' never occurs")
    assert "data.label_suffix: '.' removes it" in str(info.value)


def test_the_new_options_are_checked_and_left_out_of_fingerprints_unset(tmp_path):
    data = {
        "format": "csv",
        "path": "a.csv",
        "target": "y",
        "task_type": "binclass",
        "numeric": ["x"],
        "missing": "error",
    }
    dumped = TabularOptions.model_validate({"data": data}).model_dump(mode="json")["data"]
    assert "comment" not in dumped and "label_suffix" not in dumped  # fingerprints as before
    given = TabularOptions.model_validate({"data": {**data, "comment": "#"}}).model_dump()["data"]
    assert given["comment"] == "#"
    for bad, words in [
        ({"comment": ","}, "would also split or quote fields"),
        ({"comment": "##"}, "at most 1 character"),
        ({"label_suffix": ".", "task_type": "regression"}, "label_suffix is for class labels"),
    ]:
        with pytest.raises(ValueError, match=words):
            TabularOptions.model_validate({"data": {**data, **bad}})


# ---------------------------------------------------------------------------------------
# JSON lines (Amazon Reviews)


def _reviews(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


AMAZON_2018 = {"user": "reviewerID", "item": "asin", "timestamp": "unixReviewTime", "rating": "overall"}


def test_json_lines_read_one_interaction_per_line_in_time_order(tmp_path):
    rows = [
        {"reviewerID": "A2", "asin": "B003", "unixReviewTime": 300, "overall": 5.0, "reviewText": "ok"},
        {"reviewerID": "A1", "asin": "B002", "unixReviewTime": 200, "overall": 4.0},
        {"reviewerID": "A1", "asin": "B001", "unixReviewTime": 100, "overall": 5.0},
        {"reviewerID": "A2", "asin": "B001", "unixReviewTime": 100, "overall": 2.0},
        {"reviewerID": "A1", "asin": "B003", "unixReviewTime": 300, "overall": 3.0},
        {"reviewerID": "A2", "asin": "B002", "unixReviewTime": 200, "overall": 1.0},
    ]
    data = read_json_lines(_reviews(tmp_path / "r.json", rows), **AMAZON_2018)
    assert [s.tolist() for s in data.sequences] == [[1, 2, 3], [1, 2, 3]]  # B001 < B002 < B003, by time
    kept = read_json_lines(tmp_path / "r.json", **AMAZON_2018, min_rating=3.0)
    assert [s.tolist() for s in kept.sequences] == [[1, 2, 3]]  # A2 keeps one: fewer than 3
    ms = [{**r, "unixReviewTime": r["unixReviewTime"] * 1000} for r in rows]
    in_ms = read_json_lines(_reviews(tmp_path / "ms.json", ms), **AMAZON_2018, timestamp_unit="ms")
    assert np.array_equal(np.concatenate(in_ms.timestamps), np.concatenate(data.timestamps))


def test_a_timestamp_unit_the_times_do_not_have_is_one_line_at_the_latest_time(tmp_path):
    """Seconds read as milliseconds would put every time in January 1970 (the time-aware kinds
    then see gaps 1000 times too short), milliseconds read as seconds after the year 5000: the
    line of the latest time is named, with the unit to set; small counters (not Unix times) pass."""
    rows = [
        {"reviewerID": u, "asin": i, "unixReviewTime": t, "overall": 5.0}
        for u in ("A1", "A2")
        for i, t in (("B1", 1_500_000_000), ("B2", 1_500_086_400), ("B3", 1_500_172_800))
    ]
    path = _reviews(tmp_path / "s.json", rows)
    with pytest.raises(
        DataError,
        match=r"s\.json:3: timestamp key 'unixReviewTime' holds '1500172800'.*set timestamp_unit: s$",
    ):
        read_json_lines(path, **AMAZON_2018, timestamp_unit="ms")
    assert read_json_lines(path, **AMAZON_2018).timestamps[0][-1] == 1_500_172_800
    ms = _reviews(tmp_path / "ms.json", [{**r, "unixReviewTime": r["unixReviewTime"] * 1000} for r in rows])
    with pytest.raises(DataError, match=r"ms\.json:3: .*milliseconds .*set timestamp_unit: ms$"):
        read_json_lines(ms, **AMAZON_2018)
    counters = _reviews(tmp_path / "c.json", [{**r, "unixReviewTime": n} for n, r in enumerate(rows)])
    assert len(read_json_lines(counters, **AMAZON_2018, timestamp_unit="ms").sequences) == 2


@pytest.mark.parametrize(
    "line, words",
    [
        ('{"reviewerID": "A1", "asin": "B1", "unixReviewTime": 1, "overall": 5', "not JSON (Expecting"),
        ('["A1", "B1"]', "expected one JSON object per line; got a JSON array"),
        ('{"reviewerID": "A1", "item": "B1", "unixReviewTime": 1, "overall": 5}', "no key 'asin' for item"),
        (
            '{"reviewerID": null, "asin": "B1", "unixReviewTime": 1, "overall": 5}',
            "user key 'reviewerID' holds null",
        ),
        ('{"reviewerID": "A1", "asin": "B1", "unixReviewTime": "soon", "overall": 5}', "timestamp key"),
    ],
)
def test_bad_json_lines_name_the_line(tmp_path, line, words):
    good = json.dumps({"reviewerID": "A0", "asin": "B0", "unixReviewTime": 0, "overall": 1})
    path = tmp_path / "r.json"
    path.write_text(f"{good}\n\n{line}\n")
    with pytest.raises(DataError) as info:
        read_json_lines(path, **AMAZON_2018)
    assert str(info.value).startswith(f"{path}:3: ") and words in str(info.value), info.value


def test_a_study_reads_json_lines_with_time(tmp_path, write_study, cli):
    rows = [
        {"user_id": f"u{u}", "item_id": f"i{(u + k) % 9}", "ts": 1000 * k + u}
        for u in range(12)
        for k in range(5)
    ]
    _reviews(tmp_path / "reviews.jsonl", rows)
    data = {"format": "jsonl", "path": "reviews.jsonl", "timestamp": "ts"}
    study = write_study(replace={"task.data": data, "model.bias": [{"kind": "rel_time"}]})  # needs time
    code, out, err = cli("validate", study)
    assert code == 0, err
    assert "data: users 12, items 9, interactions 60," in out


# ---------------------------------------------------------------------------------------
# An ETT split on a series that is not ETT


def _series(path: Path, rows: int) -> Path:
    t = np.arange(rows)
    lines = [f"t{i},{np.sin(i / 24):.4f},{np.cos(i / 12) + i * 1e-4:.4f}" for i in t]
    path.write_text("date,a,b\n" + "\n".join(lines) + "\n")
    return path


def _forecast(path: Path, split: str) -> ForecastTask:
    options = {"data": {"format": "csv", "path": path.name, "split": split}, "lookback": 24, "horizon": 12}
    return ForecastTask(ForecastOptions.model_validate(options), path.parent)


def test_an_ett_split_on_another_series_is_said_in_a_warning_the_summary_and_the_protocol(tmp_path, capsys):
    task = _forecast(_series(tmp_path / "load.csv", 14_500), "ett_hour")
    series = task.load()
    warned = capsys.readouterr().err
    assert warned.count("warning: ") == 1
    assert (
        "load.csv: data.split ett_hour is the ETT benchmark's fixed split (12 / 4 / 4 months of 30 "
        "days): it uses the first 14400 of the file's 14500 rows and leaves the 100 later rows unused; "
        "split: ratio splits every row"
    ) in warned
    assert task.data_summary(series)["timesteps unused"] == "100 of the file's 14500"
    protocol = task.reference(series, ["mse"])["protocol"]
    assert "(30-day months; rows 1–14,400 of the file's 14,500, the 100 later rows unused)" in protocol
    # The ETT files themselves: no warning (the benchmark's protocol), the rows still counted.
    ett = _forecast(_series(tmp_path / "ETTh9.csv", 14_500), "auto")
    assert ett.load().unused_rows == 100 and "warning" not in capsys.readouterr().err
    whole = _forecast(_series(tmp_path / "other.csv", 2_000), "ratio")
    loaded = whole.load()
    assert loaded.unused_rows == 0 and "timesteps unused" not in whole.data_summary(loaded)
    assert "by time, 70% / 10% / 20% of the rows" in whole.reference(loaded, ["mse"])["protocol"]


def test_run_on_an_archive_it_cannot_read_stops_before_any_store(tmp_path, write_study, cli):
    """As tests/test_drive.py's bad rating: bad data is one line and exit 2, no store left behind."""
    _zip(tmp_path / "two.zip", {"u.data": b"1\t2\t3\t4\n", "u.item": b"2|x\n"})
    study = write_study(replace={"task.data": {"format": "movielens", "path": "two.zip"}})
    code, _, err = cli("run", study, "--quiet")
    assert code == 2 and err.count("\n") == 1 and "two.zip: a zip archive holding 2 files" in err, err
    output = tmp_path / "runs" / "tiny"
    assert not (output / "mlflow.db").exists() and not (output / "optuna.journal").exists()

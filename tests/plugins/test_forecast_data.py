"""Forecast CSV files beyond ETT: encodings, separators, rows in time order, exact lines."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from ablate.errors import DataError
from ablate_plugins.forecast import ForecastOptions, read_csv


def write(tmp_path, text: str, name: str = "s.csv", encoding: str = "utf-8"):
    path = tmp_path / name
    path.write_text(text, encoding=encoding)
    return path


def test_encoding_and_separator(tmp_path):
    path = write(
        tmp_path, "date;température\n2020-01-01;1,5\n2020-01-02;2\n".replace(",", "."), encoding="latin-1"
    )
    with pytest.raises(DataError, match=r"s.csv:1: byte 0xe9 at column 10 is not UTF-8; set data.encoding"):
        read_csv(path, sep=";")
    values, channels = read_csv(path, encoding="latin-1", sep=";")
    assert channels == ["température"] and values[:, 0].tolist() == [1.5, 2.0]


@pytest.mark.parametrize(
    "text, line, words",
    [
        (
            "date,a\n2020-01-01,1\n2020-01-02,2\nsoon,3\n",
            4,
            "'soon' is not a date in the format of the first row",
        ),
        (
            "date,a\n2020-01-01,1\n\n2020-01-03,2\n2020-01-02,3\n",
            5,
            "is earlier than the row before ('2020-01-03')",
        ),
        (
            "date,a\n3,1\n5,2\n4,3\n",
            4,
            "'4' is earlier than the row before ('5'); rows must be in time order",
        ),
        ("date,a\n2020-01-01,1\n\n\n2020-01-02,x\n", 5, "column 'a': 'x' is not a number"),
    ],
)
def test_dates_in_time_order_and_exact_lines(tmp_path, text, line, words):
    path = write(tmp_path, text)
    with pytest.raises(DataError) as info:
        read_csv(path)
    assert str(info.value).startswith(f"{path}:{line}: ") and words in str(info.value)


def test_labels_that_are_not_dates_are_not_checked(tmp_path):
    values, _ = read_csv(write(tmp_path, "date,a\nt1,1\nt0,2\n"))
    assert values[:, 0].tolist() == [1.0, 2.0]


def test_folder_empty_and_header_only_files(tmp_path):
    with pytest.raises(DataError, match=r": is a folder, not a data file$"):
        read_csv(tmp_path)
    with pytest.raises(DataError, match=r"s.csv: the file is empty$"):
        read_csv(write(tmp_path, ""))
    with pytest.raises(DataError, match=r"s.csv: no data rows after the header$"):
        read_csv(write(tmp_path, "date,a\n\n"))


def test_synthetic_sizes_are_checked_with_the_estimate():
    with pytest.raises(
        ValidationError, match=r"1000000000000 rows × 4 channels need about .* this machine has"
    ):
        ForecastOptions.model_validate({"data": {"format": "synthetic", "rows": 10**12}})

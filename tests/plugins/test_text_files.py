"""The text reading every loader shares: encodings, folders, empty and binary files, exact line
numbers (blank lines, quoted fields over several lines), separators, and the option types."""

from __future__ import annotations

import gzip

import pytest
from pydantic import BaseModel, ValidationError

from ablate.errors import DataError
from ablate_plugins.text_files import Encoding, Separator, found, memory_problem, read_records, read_text


def test_utf8_with_or_without_a_byte_order_mark(tmp_path):
    path = tmp_path / "a.csv"
    path.write_bytes("\ufeffuser,item\né,1\n".encode())
    assert read_text(path) == "user,item\né,1\n"


def test_another_encoding_fails_naming_line_column_and_the_option(tmp_path):
    path = tmp_path / "a.csv"
    path.write_bytes(b"user,item\n\nRen" + "é".encode("latin-1") + b",1\n")
    with pytest.raises(DataError) as info:
        read_text(path)
    assert str(info.value) == (
        f"{path}:3: byte 0xe9 at column 4 is not UTF-8; set data.encoding to the file's encoding "
        f"(e.g. latin-1, cp1252)"
    )
    assert read_text(path, "latin-1").splitlines()[2] == "René,1"


def test_utf16_needs_its_encoding(tmp_path):
    path = tmp_path / "a.csv"
    path.write_bytes("user,item\n1,2\n".encode("utf-16"))
    with pytest.raises(DataError, match=r"a\.csv: a binary file, not text .*set data.encoding: utf-16"):
        read_text(path)
    assert read_text(path, "utf-16") == "user,item\n1,2\n"


@pytest.mark.parametrize(
    "content, words",
    [
        (b"", "the file is empty"),
        (b"  \n\n\t\n", "the file is empty"),
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "a binary file, not text (a NUL byte at byte 8)"),
        (gzip.compress(b"1 2\n", mtime=0), "a gzip-compressed file; name it with a .gz suffix"),
    ],
)
def test_empty_binary_and_unnamed_gzip_files_are_one_line(tmp_path, content, words):
    path = tmp_path / "d.txt"
    path.write_bytes(content)
    with pytest.raises(DataError) as info:
        read_text(path)
    assert str(info.value).startswith(f"{path}: ") and words in str(info.value)


def test_folder_missing_and_gzip(tmp_path):
    with pytest.raises(DataError, match=r": is a folder, not a data file"):
        read_text(tmp_path)
    with pytest.raises(DataError, match=r"nope.csv: file not found"):
        read_text(tmp_path / "nope.csv")
    (tmp_path / "d.txt.gz").write_bytes(gzip.compress(b"1 2\n"))
    assert read_text(tmp_path / "d.txt.gz") == "1 2\n"
    (tmp_path / "bad.gz").write_bytes(b"not gzip at all")
    with pytest.raises(DataError, match=r"bad.gz: cannot read"):
        read_text(tmp_path / "bad.gz")


def test_records_carry_the_line_each_starts_on(tmp_path):
    text = 'a,b\n\n1,2\n   \n3,"x\ny"\n\n4,5\n'
    records = read_records(tmp_path / "t.csv", text)
    assert records.header == ["a", "b"] and records.header_line == 1
    assert records.rows == [["1", "2"], ["3", "x\ny"], ["4", "5"]]
    assert records.lines.tolist() == [3, 5, 8]


def test_a_record_with_other_field_counts_names_its_exact_line(tmp_path):
    with pytest.raises(DataError) as info:
        read_records(tmp_path / "t.csv", "a,b\n1,2\n\n\n3\n")
    assert str(info.value) == f"{tmp_path / 't.csv'}:5: expected 2 fields (a, b); got 1"


def test_no_header_names_and_numbered_columns(tmp_path):
    named = read_records(tmp_path / "t.tsv", "1\t2\n3\t4\n", "\t", header=False, names=["x", "y"])
    assert named.header == ["x", "y"] and named.lines.tolist() == [1, 2]
    numbered = read_records(tmp_path / "t.tsv", "1\t2\n3\t4\n", "\t", header=False)
    assert numbered.header == [0, 1] and numbered.column(1).tolist() == ["2", "4"]


def test_regular_expression_separators(tmp_path):
    records = read_records(tmp_path / "r.dat", "u::i\n1::2\n  3::4  \n", "::")
    assert records.rows == [["1", "2"], ["3", "4"]]


@pytest.mark.parametrize(
    "text, words",
    [
        ("user;item\n1;2\n", ":1: the header is one column 'user;item' split at ','; set data.sep: ';'"),
        ("a,b,a\n1,2,3\n", ":1: the header names column 'a' twice"),
        ("a,b\n", ": no data rows after the header"),
    ],
)
def test_header_problems(tmp_path, text, words):
    with pytest.raises(DataError) as info:
        read_records(tmp_path / "t.csv", text)
    assert str(info.value) == f"{tmp_path / 't.csv'}{words}" or words in str(info.value)


def test_option_types_check_encoding_and_separator():
    class Data(BaseModel):
        encoding: Encoding = None
        sep: Separator = ","

    assert Data(encoding="latin-1", sep="::").sep == "::"
    with pytest.raises(ValidationError, match="unknown encoding 'latin-9x'"):
        Data(encoding="latin-9x")
    for bad in ('"', "\n", "a("):
        with pytest.raises(ValidationError):
            Data(sep=bad)


def test_found_lists_what_there_is():
    assert found(["a", "b", "c", "d"]) == "4: a, b, c, d"
    assert found(list(range(20)), 3) == "20: 0, 1, 2, … (20 in all)"


def test_memory_problem_names_the_estimate_and_the_machine():
    assert memory_problem(1e6, "a million bytes") is None
    problem = memory_problem(1e18, "10¹² users")
    assert problem.startswith("10¹² users need about 888 PiB of memory") and "this machine has" in problem


def test_a_gzip_bomb_is_refused_in_one_line_not_inflated(tmp_path, monkeypatch):
    """A small .gz that inflates past a quarter of the machine's memory is refused as it inflates
    (here the machine is made to have 16 MiB: 3 MiB of text passes, 8 MiB does not)."""
    from ablate_plugins import text_files

    monkeypatch.setattr(text_files, "physical_memory", lambda: 16 << 20)
    fits = tmp_path / "fits.dat.gz"
    fits.write_bytes(gzip.compress(b"1\t2\t3\t4\n" * (3 << 17)))
    assert len(text_files.read_bytes(fits)) == 3 << 20
    bomb = tmp_path / "bomb.dat.gz"
    bomb.write_bytes(gzip.compress(b"\0" * (8 << 20)))
    assert bomb.stat().st_size < 20_000
    with pytest.raises(DataError, match=r"bomb.dat.gz: decompresses to more than 4 MiB .*; not read"):
        text_files.read_bytes(bomb)

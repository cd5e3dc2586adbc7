"""Tabular CSV as public benchmarks publish it: no header with named columns, other separators and
encodings, separate validation / test files or a split column; missing values named in file
order; errors that list what they found; the readout that never sees a feature refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from ablate.errors import DataError
from ablate_plugins.tabular import TabularOptions, TabularTask

ROWS = [f"{i},{(i * 7) % 5},{'red' if i % 3 else 'blue'},{'yes' if i % 2 else 'no'}" for i in range(40)]


def write(path: Path, lines: list[str], encoding: str = "utf-8") -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding=encoding)
    return path


def task(tmp_path: Path, **data) -> TabularTask:
    spec = {
        "format": "csv",
        "path": "t.csv",
        "target": "y",
        "task_type": "binclass",
        "numeric": ["a", "b"],
        "categorical": ["color"],
        "missing": "error",
        **data,
    }
    return TabularTask(TabularOptions.model_validate({"data": spec, "scaling": "none"}), tmp_path)


def sizes(table) -> list[int]:
    return [len(table.splits[s]) for s in ("train", "valid", "test")]


def test_no_header_with_named_columns_tab_separated_latin1(tmp_path):
    rows = [r.replace(",", "\t").replace("red", "rouge-é") for r in ROWS]
    write(tmp_path / "t.tsv", rows, encoding="latin-1")
    columns = ["a", "b", "color", "y"]
    table = task(tmp_path, path="t.tsv", header=False, columns=columns, sep="\t", encoding="latin-1").load()
    assert sum(sizes(table)) == 40 and table.cardinalities == [3]
    with pytest.raises(DataError, match=r"t.tsv:2: byte 0xe9 .* set data.encoding"):
        task(tmp_path, path="t.tsv", header=False, columns=columns, sep="\t").load()


def test_the_same_rows_with_a_header_split_the_same(tmp_path):
    write(tmp_path / "t.csv", ["a,b,color,y", *ROWS])
    write(tmp_path / "n.csv", ROWS)
    with_header = task(tmp_path).load()
    without = task(tmp_path, path="n.csv", header=False, columns=["a", "b", "color", "y"]).load()
    for split in ("train", "valid", "test"):
        np.testing.assert_array_equal(with_header.splits[split].numeric, without.splits[split].numeric)


def test_separate_test_file_splits_the_rest_in_proportion(tmp_path):
    write(tmp_path / "t.csv", ["a,b,color,y", *ROWS])
    write(tmp_path / "test.csv", ["y,color,b,a", "yes,red,1,100", "no,blue,2,200"])  # any column order
    table = task(tmp_path, test="test.csv").load()
    assert sizes(table) == [32, 8, 2]  # 40 rows in 0.64 : 0.16
    np.testing.assert_array_equal(table.splits["test"].numeric[:, 0], [100, 200])
    both = task(tmp_path, test="test.csv", valid="test.csv").load()
    assert sizes(both) == [40, 2, 2]


def test_split_column_names_each_rows_split(tmp_path):
    folds = ["train"] * 30 + ["valid"] * 4 + ["test"] * 6
    write(tmp_path / "t.csv", ["a,b,color,y,fold", *(f"{r},{f}" for r, f in zip(ROWS, folds, strict=True))])
    table = task(tmp_path, split_column="fold").load()
    assert sizes(table) == [30, 4, 6] and table.splits["test"].rows.tolist() == list(range(6))
    write(tmp_path / "t.csv", ["a,b,color,y,fold", "1,2,red,yes,train", "", "2,3,red,no,validation"])
    with pytest.raises(DataError) as info:
        task(tmp_path, split_column="fold").load()
    assert str(info.value) == (
        f"{tmp_path / 't.csv'}:4: split column 'fold' holds 'validation'; expected train, valid or test "
        f"(the column holds 2: train, validation)"
    )


def test_split_column_must_name_every_split(tmp_path):
    write(tmp_path / "t.csv", ["a,b,color,y,fold", *(f"{r},train" for r in ROWS[:-1]), f"{ROWS[-1]},test"])
    with pytest.raises(
        DataError, match=r"t.csv: split column 'fold' names no valid rows \(train 39, test 1\)"
    ):
        task(tmp_path, split_column="fold").load()


def test_missing_error_names_the_first_missing_value_in_file_order(tmp_path):
    rows = ROWS.copy()
    rows[30], rows[5] = "30,,red,yes", "5,1,,no"
    write(tmp_path / "t.csv", ["a,b,color,y", "", *rows])
    with pytest.raises(DataError) as info:
        task(tmp_path).load()  # row 5 (line 8) comes first in the file, whichever split it lands in
    assert str(info.value).startswith(f"{tmp_path / 't.csv'}:8: missing value in color")


def test_classes_found_are_listed(tmp_path):
    write(tmp_path / "t.csv", ["a,b,color,y", *(f"{i},1,red,{'abcd'[i % 4]}" for i in range(40))])
    with pytest.raises(
        DataError, match=r"binclass needs exactly 2 target classes in train; found 4: a, b, c, d$"
    ):
        task(tmp_path).load()
    write(tmp_path / "t.csv", ["a,b,color,y", *(f"{i},1,red,{i * 0.37:.2f}" for i in range(400))])
    with pytest.raises(
        DataError, match=r"multiclass target has 256 classes in 256 training rows .*regression"
    ):
        task(tmp_path, task_type="multiclass").load()


def test_infinite_values_and_non_numbers_name_file_and_line(tmp_path):
    write(tmp_path / "t.csv", ["a,b,color,y", ROWS[0], "1,inf,red,no"])
    with pytest.raises(DataError, match=r"t.csv:3: column 'b': 'inf' is not a finite number"):
        task(tmp_path).load()


def test_a_tiny_file_leaves_a_split_empty(tmp_path):
    write(tmp_path / "t.csv", ["a,b,color,y", *ROWS[:3]])
    with pytest.raises(DataError, match=r"t.csv: the valid split gets none of the file's 3 rows"):
        task(tmp_path).load()


def test_check_files_names_a_missing_test_file(tmp_path):
    write(tmp_path / "t.csv", ["a,b,color,y", *ROWS])
    assert task(tmp_path, test="nope.csv").check_files() == f"test: file not found: {tmp_path / 'nope.csv'}"
    assert task(tmp_path).check_files() is None


@pytest.mark.parametrize(
    "data, words",
    [
        ({"header": False}, "header: false needs columns"),
        ({"columns": ["a", "b", "color", "y"]}, "columns names the columns of a file without a header"),
        ({"header": False, "columns": ["a", "b", "y"]}, "declared column(s) color not in columns"),
        ({"split_column": "fold", "test": "t.csv"}, "two ways to split"),
        ({"split_column": "color"}, "is also declared as the target or a feature"),
        ({"split_column": "fold", "ratios": [0.5, 0.25, 0.25]}, "not used with split_column"),
        ({"test": "a.csv", "valid": "b.csv", "ratios": [0.5, 0.25, 0.25]}, "ratios are not used"),
        ({"sep": ""}, "at least 1 character"),
        ({"encoding": "utf-9"}, "unknown encoding 'utf-9'"),
    ],
)
def test_csv_options_are_checked_at_validation(tmp_path, data, words):
    with pytest.raises(ValidationError) as info:
        task(tmp_path, **data)
    assert words in str(info.value)


def test_synthetic_sizes_are_checked_with_the_estimate():
    with pytest.raises(
        ValidationError, match=r"1000000000000 rows × 4 numeric \+ 2 categorical features need about"
    ):
        TabularOptions.model_validate({"data": {"format": "synthetic", "rows": 10**12}})


def test_no_token_mixing_makes_a_constant_predictor_and_is_refused(tmp_path, write_study, cli):
    study = write_study(
        replace={
            "task": {"kind": "tabular", "data": {"format": "synthetic", "rows": 100}},
            "model.bias": [],
            "variants": {"blind": {"attention": {"kind": "none"}}},
            "metrics": {"primary": "rmse"},
            "train.loss": {},
        }
    )
    code, _, err = cli("validate", study)
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1, err
    assert "variants.blind.attention.kind: attention kind 'none' mixes no tokens" in errors[0]
    assert "constant predictor" in errors[0]

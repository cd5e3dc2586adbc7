"""The bad-input corpus, part 2: data files and data options. Every case stops before any training
with exit status 2 and one line naming the data file and line (or the option key) at fault, from
``ablate validate`` as from ``ablate run``."""

from __future__ import annotations

import io

import numpy as np
import pytest
from corpus import Case, check, study_text

# -- the three tasks, each with a data section the cases replace ---------------------------


def seqrec(data: dict) -> str:
    return study_text(replace={"task.data": data})


def reviews(**options) -> str:
    """A seqrec study over r.csv (user, item, rating, timestamp columns)."""
    return seqrec({"format": "csv", "path": "r.csv", "timestamp": "timestamp", "rating": "rating", **options})


def tabular(data: dict, task_type: str = "binclass", csv: bool = True, **patch) -> str:
    """A tabular study; ``data`` patches a CSV section over t.csv (``csv``) or is the whole section."""
    csv_data = {
        "format": "csv",
        "path": "t.csv",
        "target": "y",
        "task_type": task_type,
        "numeric": ["a"],
        "categorical": ["c"],
        "missing": "error",
    }
    data = {**csv_data, **data} if csv else data
    replace = {
        "task": {"kind": "tabular", "data": data},
        "model.bias": [],
        "variants": {},
        "metrics": {"primary": "rmse" if task_type == "regression" else "accuracy"},
        "train.loss": {},
        **patch,
    }
    return study_text(replace=replace)


def forecast(data: dict, csv: bool = True) -> str:
    """A forecast study; ``data`` patches a CSV section over s.csv (``csv``) or is the whole section."""
    data = {"format": "csv", "path": "s.csv", **data} if csv else data
    replace = {
        "task": {"kind": "forecast", "data": data, "lookback": 8, "horizon": 4},
        "model.bias": [],
        "variants": {},
        "metrics": {"primary": "mse"},
        "train.loss": {"kind": "mse"},
    }
    return study_text(replace=replace)


def lines(*rows: str) -> str:
    return "".join(row + "\n" for row in rows)


REVIEW_HEADER = "user,item,rating,timestamp"
REVIEWS = [f"A{u}XQ,B0{i}K,{(u + i) % 5 + 1},{1_300_000_000 + 100 * i}" for u in range(4) for i in range(5)]
TABLE = ["a,c,y", *(f"{i},{'rg'[i % 2]},{'yes' if i % 3 else 'no'}" for i in range(30))]
SERIES = ["date,x,z", *(f"2020-01-{1 + i // 24:02d} {i % 24:02d}:00:00,{i},{i % 7}" for i in range(60))]


def npy_folder(info: str) -> dict[str, str | bytes]:
    """An FT-Transformer folder ``d/`` whose info.json is ``info``."""

    def array(values: np.ndarray) -> bytes:
        out = io.BytesIO()
        np.save(out, values)
        return out.getvalue()

    files: dict[str, str | bytes] = {"d/info.json": info}
    for suffix in ("train", "val", "test"):
        files[f"d/N_{suffix}.npy"] = array(np.arange(20.0).reshape(10, 2))
        files[f"d/y_{suffix}.npy"] = array(np.arange(10.0))
    return files


CASES = [
    # -- seqrec: ids, encodings, lines ----------------------------------------------------------
    Case(
        "seqrec-text-id-under-ids-integer",
        {
            "study.yaml": reviews(ids="integer"),
            "r.csv": lines("user,item,rating,timestamp", "1,2,5,10", "A2IBPI20UZIR0U,2,5,11"),
        },
        ("r.csv:3:", "user column 'user' holds 'A2IBPI20UZIR0U', which is not an integer", "data.ids"),
    ),
    Case(
        "seqrec-id-beyond-64-bits-under-ids-integer",
        {
            "study.yaml": reviews(ids="integer"),
            "r.csv": lines(REVIEW_HEADER, "1,2,5,10", "18446744073709551616,2,5,11"),
        },
        ("r.csv:3:", "which does not fit in 64 bits"),
    ),
    Case(
        "seqrec-latin1-without-encoding",
        {
            "study.yaml": reviews(),
            "r.csv": lines(REVIEW_HEADER, "1,2,5,10").encode() + "Zoë,2,5,11\n".encode("latin-1"),
        },
        ("r.csv:3:", "byte 0xeb", "set data.encoding"),
    ),
    Case(
        "seqrec-error-after-blank-lines-names-the-exact-line",
        {
            "study.yaml": reviews(),
            "r.csv": lines(REVIEW_HEADER, "1,2,5,10", "", "", "1,3,5,12", "1,4,five,13"),
        },
        ("r.csv:6:", "rating column 'rating' holds 'five', which is not a number"),
    ),
    Case(
        "seqrec-row-with-an-extra-field",
        {"study.yaml": reviews(), "r.csv": lines(REVIEW_HEADER, *REVIEWS[:3], "A9,B1,5,10,extra")},
        ("r.csv:5:", "expected 4 fields (user, item, rating, timestamp); got 5"),
    ),
    Case(
        "seqrec-no-header",
        {"study.yaml": reviews(), "r.csv": lines(*REVIEWS)},
        ("r.csv:1:", "no column 'user' for user", "set data.user", "header: false"),
    ),
    Case(
        "seqrec-semicolons-with-the-default-sep",
        {"study.yaml": reviews(), "r.csv": lines(*(r.replace(",", ";") for r in [REVIEW_HEADER, *REVIEWS]))},
        ("r.csv:1:", "set data.sep: ';'"),
    ),
    Case(
        "seqrec-folder-as-data-path",
        {"study.yaml": reviews(path="data"), "data/r.csv": lines(REVIEW_HEADER, *REVIEWS)},
        ("data: is a folder, not a data file",),
    ),
    Case(
        "seqrec-json-lines-read-as-csv",
        {
            "study.yaml": reviews(),
            "r.csv": lines(
                *(f'{{"user": "A{u}", "item": "B{u}", "rating": 5, "timestamp": 1}}' for u in range(3))
            ),
        },
        ("r.csv:1:", "a JSON object, not ','-separated fields", "set data.format: jsonl"),
    ),
    Case("seqrec-empty-file", {"study.yaml": reviews(), "r.csv": ""}, ("r.csv: the file is empty",)),
    Case(
        "seqrec-header-only",
        {"study.yaml": reviews(), "r.csv": lines(REVIEW_HEADER)},
        ("r.csv: no data rows after the header",),
    ),
    Case(
        "seqrec-binary-file",
        {"study.yaml": reviews(), "r.csv": bytes(range(256)) * 8},
        ("r.csv: a binary file, not text",),
    ),
    Case(
        "seqrec-missing-data-file",
        {"study.yaml": reviews(path="nope.csv")},
        ("study.yaml", "task.data", "nope.csv"),
    ),
    Case(
        "seqrec-user-item-field-count-after-blank-lines",
        {
            "study.yaml": seqrec({"format": "user_item", "path": "d.txt"}),
            "d.txt": lines("1 2", "", "1 3", "1 4 5"),
        },
        ("d.txt:4:", "expected 2 fields user, item; got 3"),
    ),
    Case(
        "seqrec-user-lines-user-without-items",
        {
            "study.yaml": seqrec({"format": "user_lines", "path": "d.txt"}),
            "d.txt": lines("u1 a b c", "", "u2"),
        },
        ("d.txt:3:", "a user with no items"),
    ),
    Case(
        "seqrec-movielens-rating-not-a-number",
        {
            "study.yaml": seqrec({"format": "movielens", "path": "u.data"}),
            "u.data": lines("1\t2\t3\t4", "", "1\t3\tx\t5"),
        },
        ("u.data:3:", "got rating 'x', which is not a number"),
    ),
    Case(
        "seqrec-remap-off-with-text-ids",
        {
            "study.yaml": seqrec({"format": "user_item", "path": "d.txt", "remap": False}),
            "d.txt": lines("1 a", "1 b"),
        },
        ("d.txt:1:", "remap: false keeps item ids as indices"),
    ),
    Case(
        "seqrec-sampled-protocol-user-rated-every-item",
        {
            "study.yaml": study_text(
                replace={"task.data": {"format": "user_item", "path": "d.txt"}, "task.protocol": "sampled"}
            ),
            "d.txt": lines(*(f"u1 {i}" for i in "abcd"), "u2 a", "u2 b", "u2 c", "u3 b", "u3 c", "u3 d"),
        },
        ("d.txt", "user u1 rated every one of the 4 items", "task.protocol: full"),
    ),
    # -- seqrec: data options -------------------------------------------------------------------
    Case(
        "seqrec-unknown-encoding",
        {"study.yaml": reviews(encoding="latin-9x")},
        ("task.data.encoding", "unknown encoding"),
    ),
    Case("seqrec-unknown-ids-mode", {"study.yaml": reviews(ids="strings")}, ("task.data.ids",)),
    Case(
        "seqrec-separator-not-a-regex",
        {"study.yaml": reviews(sep="a(")},
        ("task.data.sep", "regular expression"),
    ),
    Case(
        "seqrec-separator-a-quote",
        {"study.yaml": reviews(sep='"')},
        ("task.data.sep", "cannot separate fields"),
    ),
    Case(
        "seqrec-absurd-users",
        {"study.yaml": study_text(patch={"task": {"data": {"users": 10**12}}})},
        ("task.data.users", "1000000000000 users need about", "of memory"),
    ),
    Case(
        "seqrec-absurd-items",
        {"study.yaml": study_text(patch={"task": {"data": {"items": 10**12}}})},
        ("task.data.items", "1000000000000 items need about"),
    ),
    Case(
        "seqrec-absurd-sequence-lengths",
        {"study.yaml": study_text(patch={"task": {"data": {"users": 10**6, "max_len": 10**9}}})},
        ("task.data", "interactions on average", "of memory"),
    ),
    # -- tabular ---------------------------------------------------------------------------------
    Case(
        "tabular-latin1-header-without-encoding",
        {"study.yaml": tabular({}), "t.csv": "a,c,y,café\n".encode("latin-1") + lines(*TABLE[1:]).encode()},
        ("t.csv:1:", "set data.encoding"),
    ),
    Case(
        "tabular-not-a-number-after-blank-lines",
        {"study.yaml": tabular({}), "t.csv": lines(*TABLE[:5], "", "", "oops,r,yes", *TABLE[5:])},
        ("t.csv:8:", "column 'a': 'oops' is not a number"),
    ),
    Case(
        "tabular-first-missing-value-in-file-order",
        {"study.yaml": tabular({}), "t.csv": lines(*TABLE[:4], "7,,no", *TABLE[4:20], ",r,yes", *TABLE[20:])},
        ("t.csv:5:", "missing value in c", "data.missing is 'error'"),
    ),
    Case(
        "tabular-binclass-with-four-classes",
        {"study.yaml": tabular({}), "t.csv": lines("a,c,y", *(f"{i},r,{'abcd'[i % 4]}" for i in range(40)))},
        ("t.csv", "binclass needs exactly 2 target classes in train; found 4: a, b, c, d"),
    ),
    Case(
        "tabular-multiclass-with-a-numeric-target",
        {
            "study.yaml": tabular({}, "multiclass"),
            "t.csv": lines("a,c,y", *(f"{i},r,{i * 1.5}" for i in range(400))),
        },
        ("t.csv", "multiclass target has 256 classes in 256 training rows", "task_type: regression"),
    ),
    Case(
        "tabular-test-class-unseen-in-train",
        {
            "study.yaml": tabular({"test": "test.csv"}),
            "t.csv": lines(*TABLE),
            "test.csv": lines("a,c,y", "1,r,yes", "2,g,maybe"),
        },
        ("test.csv:3:", "target class 'maybe' never occurs in the training rows (they hold 2: no, yes)"),
    ),
    Case(
        "tabular-missing-test-file",
        {"study.yaml": tabular({"test": "test.csv"}), "t.csv": lines(*TABLE)},
        ("task.data", "test: file not found", "test.csv"),
    ),
    Case(
        "tabular-bad-split-column-value",
        {
            "study.yaml": tabular({"split_column": "fold"}),
            "t.csv": lines("a,c,y,fold", "1,r,yes,train", "2,g,no,test", "3,r,no,dev"),
        },
        ("t.csv:4:", "split column 'fold' holds 'dev'; expected train, valid or test", "3: dev, test, train"),
    ),
    Case(
        "tabular-split-column-without-valid-rows",
        {
            "study.yaml": tabular({"split_column": "fold"}),
            "t.csv": lines("a,c,y,fold", "1,r,yes,train", "2,g,no,test"),
        },
        ("t.csv", "split column 'fold' names no valid rows"),
    ),
    Case(
        "tabular-short-row",
        {"study.yaml": tabular({}), "t.csv": lines(*TABLE[:3], "5,r", *TABLE[3:])},
        ("t.csv:4:", "expected 3 fields (a, c, y); got 2"),
    ),
    Case(
        "tabular-declared-column-not-in-header",
        {"study.yaml": tabular({"numeric": ["a", "size"]}), "t.csv": lines(*TABLE)},
        ("t.csv:1:", "declared column(s) size not in the header"),
    ),
    Case(
        "tabular-headerless-file-read-with-a-header",  # adult.data: its first line is data
        {"study.yaml": tabular({}), "t.csv": lines(*TABLE[1:])},
        (
            "t.csv:1:",
            "not in the header (0, r, no)",
            "holds numbers (0): if it is data, set data.header: false",
        ),
    ),
    Case(
        "tabular-no-header-without-columns",
        {"study.yaml": tabular({"header": False})},
        ("task.data", "header: false needs columns"),
    ),
    Case(
        "tabular-split-column-and-test-file",
        {"study.yaml": tabular({"split_column": "fold", "test": "t.csv"})},
        ("task.data", "two ways to split"),
    ),
    Case(
        "tabular-npy-path-is-a-file",
        {"study.yaml": tabular({"format": "npy", "path": "t.csv"}, csv=False), "t.csv": lines(*TABLE)},
        ("t.csv: is a file; format npy reads a folder",),
    ),
    Case(
        "tabular-npy-info-not-an-object",
        {
            "study.yaml": tabular({"format": "npy", "path": "d"}, "regression", csv=False),
            **npy_folder("[1, 2]"),
        },
        ("d/info.json", "expected a JSON object with task_type"),
    ),
    Case(
        "tabular-attention-none-is-a-constant-predictor",
        {
            "study.yaml": tabular(
                {"format": "synthetic"},
                "regression",
                False,
                variants={"blind": {"attention": {"kind": "none"}}},
            ),
        },
        ("study.yaml:", "variants.blind.attention.kind", "constant predictor"),
    ),
    Case(
        "tabular-absurd-rows",
        {"study.yaml": tabular({"format": "synthetic", "rows": 10**12}, "regression", csv=False)},
        ("task.data", "1000000000000 rows", "of memory"),
    ),
    # -- forecast --------------------------------------------------------------------------------
    Case(
        "forecast-a-value-that-is-not-a-date",
        {"study.yaml": forecast({}), "s.csv": lines(*SERIES[:10], "soon,1,2", *SERIES[10:])},
        ("s.csv:11:", "'soon' is not a date in the format of the first row"),
    ),
    Case(
        "forecast-dates-going-back",
        {"study.yaml": forecast({}), "s.csv": lines(*SERIES[:10], SERIES[3], *SERIES[10:])},
        ("s.csv:11:", "is earlier than the row before", "time order"),
    ),
    Case(
        "forecast-field-count-after-blank-lines",
        {
            "study.yaml": forecast({}),
            "s.csv": lines(*SERIES[:5], "", "", "2020-01-01 04:30:00,1", *SERIES[5:]),
        },
        ("s.csv:8:", "expected 3 fields (date, x, z); got 2"),
    ),
    Case(
        "forecast-no-date-column",
        {"study.yaml": forecast({}), "s.csv": lines(*(r.replace("date", "time", 1) for r in SERIES))},
        ("s.csv:1:", "no date column 'date'", "set data.date_column"),
    ),
    Case(
        "forecast-channel-not-in-header",
        {"study.yaml": forecast({"channels": ["x", "OT"]}), "s.csv": lines(*SERIES)},
        ("s.csv:1:", "channel(s) OT not in the header"),
    ),
    Case(
        "forecast-latin1-without-encoding",
        {"study.yaml": forecast({}), "s.csv": lines(*SERIES[:4]).encode() + b"2020-01-01 04:00:00,4,\xb0\n"},
        ("s.csv:5:", "set data.encoding"),
    ),
    Case(
        "forecast-missing-value",
        {"study.yaml": forecast({}), "s.csv": lines(*SERIES[:4], "2020-01-01 03:00:00,nan,3", *SERIES[5:])},
        ("s.csv:5:", "column 'x': 'nan' is not a finite number"),
    ),
    Case(
        "forecast-absurd-rows",
        {"study.yaml": forecast({"format": "synthetic", "rows": 10**13}, csv=False)},
        ("task.data", "10000000000000 rows × 4 channels need about"),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_bad_input(case, tmp_path, cli, monkeypatch):
    check(case, tmp_path, cli, monkeypatch)

"""A stop request (SIGTERM, Ctrl-C) interrupts loading and generating data at the loaders' safe
points; and absurd synthetic sizes are refused before anything is generated."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from pydantic import ValidationError

from ablate import stopping
from ablate.study.load import load_study
from ablate_plugins.forecast import read_csv
from ablate_plugins.seqrec import SeqRecOptions, read_table, read_user_item, read_user_lines, synthetic
from ablate_plugins.tabular import synthetic as tabular_synthetic
from ablate_plugins.text_files import read_records


def test_sigterm_interrupts_generating_a_large_synthetic_set():
    """Generating 10⁷ users takes minutes; SIGTERM 0.3 s in stops it within a second or so."""
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM))
    with stopping.stop_signals():
        start = time.monotonic()
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            synthetic(10**7, 1000, 20, 40, 0.8, seed=0, timestamps=True)
    timer.join()
    assert time.monotonic() - start < 5


@pytest.mark.parametrize(
    "load",
    [
        lambda path: read_user_item(path, ids="text"),
        lambda path: read_user_lines(path),
        lambda path: read_records(path, path.read_text(), " ", header=False),
    ],
    ids=["user_item", "user_lines", "records"],
)
def test_a_stop_request_interrupts_reading_a_file(tmp_path, load):
    path = tmp_path / "d.txt"
    path.write_text("".join(f"u{i % 100} i{i % 37}\n" for i in range(50_000)))
    with stopping.stop_signals():
        stopping.request()
        with pytest.raises(KeyboardInterrupt):
            load(path)
    assert not stopping.requested()


def test_a_stop_request_interrupts_csv_and_forecast_loads(tmp_path):
    (tmp_path / "r.csv").write_text("user,item\n" + "".join(f"{i % 9},{i}\n" for i in range(1000)))
    (tmp_path / "s.csv").write_text("date,a\n" + "".join(f"{i},{i}\n" for i in range(1000)))
    with stopping.stop_signals():
        stopping.request()
        with pytest.raises(KeyboardInterrupt):
            read_table(tmp_path / "r.csv")
        with pytest.raises(KeyboardInterrupt):
            read_csv(tmp_path / "s.csv")
        with pytest.raises(KeyboardInterrupt):
            tabular_synthetic(100, 2, 1, 3, "regression", 3, 0.1, 0)


@pytest.mark.parametrize(
    "data, key, words",
    [
        ({"users": 10**12}, "users", "1000000000000 users need about"),
        ({"items": 10**12}, "items", "1000000000000 items need about"),
        ({"users": 10**6, "max_len": 10**9}, None, "1000000 users × 5e+08 interactions on average"),
    ],
)
def test_absurd_synthetic_sizes_are_refused_with_the_estimate(data, key, words):
    with pytest.raises(ValidationError) as info:
        SeqRecOptions.model_validate({"data": {"format": "synthetic", **data}})
    (error,) = info.value.errors()
    assert error["loc"] == ("data", key) if key else ("data",)
    assert words in error["msg"] and "of memory to generate; this machine has" in error["msg"]


def test_a_study_with_absurd_users_fails_validation_naming_the_key(write_study):
    path = write_study(patch={"task": {"data": {"users": 10**12}}})
    with pytest.raises(Exception) as info:
        load_study(path)
    assert "task.data.users" in str(info.value) and "need about" in str(info.value)

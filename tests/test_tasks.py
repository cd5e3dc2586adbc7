"""ablate.tasks.evaluation_streams: task evaluations spread over single-threaded streams."""

from __future__ import annotations

import threading

import pytest
import torch

from ablate.tasks import evaluation_streams


@pytest.fixture
def two_threads():
    saved = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(saved)


def observe(item: int) -> tuple:
    """What a stream sees while it works on ``item``; slow enough for the streams to overlap."""
    x = torch.randn(64, 64)
    product = x @ x
    for _ in range(20):
        product = torch.tanh(product @ x)
    return (item, threading.current_thread().name, torch.get_num_threads(), torch.is_grad_enabled(),
            product.dtype)


def test_items_are_worked_in_single_threaded_streams_and_come_back_in_order(two_threads):
    with torch.no_grad():
        seen = list(evaluation_streams(observe, range(12), torch.device("cpu")))
    assert [s[0] for s in seen] == list(range(12))
    assert {s[1] for s in seen} == {"ablate-eval_0", "ablate-eval_1"}
    assert {s[2] for s in seen} == {1}
    assert {s[3] for s in seen} == {False}  # the caller's no_grad reached the streams
    assert torch.get_num_threads() == 2


def test_autocast_reaches_the_streams(two_threads):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        seen = list(evaluation_streams(observe, range(3), "cpu"))
    assert {s[4] for s in seen} == {torch.bfloat16}
    assert {s[4] for s in evaluation_streams(observe, range(3), "cpu")} == {torch.float32}


def test_one_thread_or_another_device_runs_in_the_caller(two_threads):
    caller = threading.current_thread().name
    assert {s[1] for s in evaluation_streams(observe, range(3), torch.device("meta"))} == {caller}
    torch.set_num_threads(1)
    assert {s[1] for s in evaluation_streams(observe, range(3), "cpu")} == {caller}


def test_a_failing_item_raises_in_the_caller_and_restores_the_thread_count(two_threads):
    def work(item: int) -> int:
        if item == 5:
            raise ValueError("item 5")
        return item

    with pytest.raises(ValueError, match="item 5"):
        list(evaluation_streams(work, range(10), "cpu"))
    assert torch.get_num_threads() == 2

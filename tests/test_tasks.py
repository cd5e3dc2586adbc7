"""ablate.tasks: evaluations spread over single-threaded streams; the hooks the training loop calls
on the model's components (``auxiliary_loss`` added once per loss part, ``epoch_end``)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
from torch import nn

from ablate.components import BuildContext, Component, Options
from ablate.tasks import Task, cpu_streams
from ablate.training.trainer import backward_parts, training_autocast


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
    return (
        item,
        threading.current_thread().name,
        torch.get_num_threads(),
        torch.is_grad_enabled(),
        product.dtype,
    )


def test_items_are_worked_in_single_threaded_streams_and_come_back_in_order(two_threads):
    # Items 0 and 1 wait for each other, so both streams must be working at once; without it a
    # loaded machine may let one stream drain the queue before the other starts (seen in CI).
    both = threading.Barrier(2, timeout=30)

    def meet_then_observe(item: int) -> tuple:
        if item < 2:
            both.wait()
        return observe(item)

    with torch.no_grad():
        seen = list(cpu_streams(meet_then_observe, range(12), torch.device("cpu")))
    assert [s[0] for s in seen] == list(range(12))
    assert {s[1] for s in seen} == {"ablate-stream_0", "ablate-stream_1"}
    assert {s[2] for s in seen} == {1}
    assert {s[3] for s in seen} == {False}  # the caller's no_grad reached the streams
    assert torch.get_num_threads() == 2
    # The next call reuses the same two threads, still single-threaded; the caller keeps its two.
    again = list(cpu_streams(observe, range(4), torch.device("cpu")))
    assert {s[1] for s in again} <= {"ablate-stream_0", "ablate-stream_1"} and {s[2] for s in again} == {1}
    assert torch.get_num_threads() == 2


def test_autocast_reaches_the_streams(two_threads):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        seen = list(cpu_streams(observe, range(3), "cpu"))
    assert {s[4] for s in seen} == {torch.bfloat16}
    assert {s[4] for s in cpu_streams(observe, range(3), "cpu")} == {torch.float32}


def test_one_thread_or_another_device_runs_in_the_caller(two_threads):
    caller = threading.current_thread().name
    assert {s[1] for s in cpu_streams(observe, range(3), torch.device("meta"))} == {caller}
    torch.set_num_threads(1)
    assert {s[1] for s in cpu_streams(observe, range(3), "cpu")} == {caller}


def test_a_failing_item_raises_in_the_caller_and_restores_the_thread_count(two_threads):
    def work(item: int) -> int:
        if item == 5:
            raise ValueError("item 5")
        return item

    with pytest.raises(ValueError, match="item 5"):
        list(cpu_streams(work, range(10), "cpu"))
    assert torch.get_num_threads() == 2


# ---------------------------------------------------------------------------------------
# Component hooks: auxiliary_loss and epoch_end reach Components, and nothing else


class Scale(Component):
    """``x · w`` with auxiliary loss ``w²``; records what the core asked of it."""

    def __init__(self):
        super().__init__(Options(), BuildContext(dim=1))
        self.w = nn.Parameter(torch.tensor(3.0))
        self.asked, self.epochs = 0, []

    def forward(self, x):
        return x * self.w

    def auxiliary_loss(self):
        self.asked += 1
        return self.w**2

    def epoch_end(self, epoch: int) -> None:
        self.epochs.append(epoch)


class Lookalike(nn.Module):
    """Has both hooks' names but is no Component: the core must not call them."""

    def __init__(self):
        super().__init__()
        self.v = nn.Parameter(torch.tensor(5.0))

    def auxiliary_loss(self):
        raise AssertionError("auxiliary_loss asked of a module that is not a Component")

    def epoch_end(self, epoch: int) -> None:
        raise AssertionError("epoch_end called on a module that is not a Component")


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale, self.lookalike = Scale(), Lookalike()
        self.plain = Component(Options(), BuildContext(dim=1))  # the hooks' defaults: no term, no-op

    def forward(self, x):
        return self.scale(x)


class SumTask(Task):
    def loss(self, model, batch, loss, generator):
        return model(batch).sum()


class HalvesTask(SumTask):
    """Cuts a batch into two micro-batches, each its own mean weighted by its share of the rows."""

    def loss(self, model, batch, loss, generator):
        return model(batch).mean()

    def split_batch(self, model, batch, parts):
        return [(half, len(half) / len(batch)) for half in batch.split([1, 3])]


BATCH = torch.tensor([1.0, 2.0, 3.0, 4.0])
NO_AUTOCAST = training_autocast("fp32", torch.device("cpu"))
GENERATOR = torch.Generator()  # unused by these tasks


def test_the_auxiliary_loss_is_added_once_to_a_whole_batch_part():
    model = Model()
    total = backward_parts(SumTask(Options(), Path()), model, BATCH, Options(), GENERATOR, NO_AUTOCAST)
    w = torch.tensor(3.0)
    assert total.item() == ((BATCH * w).sum() + w**2).item() == 39.0
    assert model.scale.asked == 1
    assert model.scale.w.grad.item() == 10.0 + 2 * 3.0
    assert model.lookalike.v.grad is None


def test_each_micro_batch_part_gets_the_auxiliary_loss_before_its_weighting():
    model = Model()
    total = backward_parts(HalvesTask(Options(), Path()), model, BATCH, Options(), GENERATOR, NO_AUTOCAST, 2)
    w = torch.tensor(3.0)
    first, rest = ((BATCH[:1] * w).mean() + w**2) * 0.25, ((BATCH[1:] * w).mean() + w**2) * 0.75
    assert total.item() == (first + rest).item()  # the same float operations, bit for bit
    assert model.scale.asked == 2
    assert model.scale.w.grad.item() == pytest.approx(0.25 * 1.0 + 0.75 * 3.0 + 2 * 3.0)


def test_a_task_loss_leaves_the_auxiliary_loss_to_training():
    model = Model()
    assert SumTask(Options(), Path()).loss(model, BATCH, Options(), torch.Generator()).item() == 30.0
    assert model.scale.asked == 0


def test_epoch_end_reaches_every_component_and_nothing_else():
    model = Model()
    task = SumTask(Options(), Path())
    task.on_epoch_end(model, 1)
    task.on_epoch_end(model, 2)
    assert model.scale.epochs == [1, 2]

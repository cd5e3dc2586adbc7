"""Loss parts (micro-batches) in parallel CPU streams (ablate.training.parts): the same loss and gradients
in one stream or several, each part's draws its own, a model with auxiliary losses kept serial."""

from __future__ import annotations

import pytest
import torch

from ablate import components
from ablate.study.load import load_study
from ablate.training import parts
from ablate.training.trainer import seeded_model, training_autocast

NO_AUTOCAST = training_autocast("fp32", torch.device("cpu"))


def one_step(study, variant: str, threads: int, seed: int = 0):
    """Loss and gradients of the first training batch of ``variant`` with ``threads`` torch threads."""
    data = study.task.load()
    model, generator = seeded_model(study, study.variants[variant], seed, data, torch.device("cpu"))
    model.train()
    batch = next(iter(study.task.train_batches(data, 64, generator)))
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        loss = parts.backward_parts(
            study.task, model, batch, study.loss, generator, NO_AUTOCAST, study.spec.train.micro_batches
        )
        assert torch.get_num_threads() == threads  # restored after the streams
    finally:
        torch.set_num_threads(saved)
    return loss, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.fixture
def micro_study(write_study):
    # Dropout everywhere and BCE with sampled negatives: every part draws from both generators.
    return load_study(
        write_study(
            {
                "model": {"dropout": 0.3},
                "train": {"micro_batches": 3, "loss": {"kind": "bce", "negatives": 2}},
                "variants": {"moe": {"ffn": {"kind": "moe", "experts": 2, "top_k": 1}}},
            }
        )
    )


def test_two_streams_give_exactly_what_one_stream_gives(micro_study):
    one = one_step(micro_study, "base", threads=1)
    two = one_step(micro_study, "base", threads=2)
    assert torch.equal(one[0], two[0])
    assert one[1].keys() == two[1].keys() and len(one[1]) > 5
    for name, grad in one[1].items():
        assert torch.equal(grad, two[1][name]), name


def test_parts_draw_from_their_own_generators(micro_study):
    """Another step seed changes the draws: the parts' generators come from the step's."""
    first, second = (
        one_step(micro_study, "base", threads=2, seed=0),
        one_step(micro_study, "base", threads=2, seed=1),
    )
    assert not torch.equal(first[0], second[0])


def test_the_parallel_route_adds_up_the_parts_like_the_serial_one(micro_study):
    """With the parts' generators fixed, the streams' gradient sum is what one backward per part
    in turn accumulates."""
    task = micro_study.task
    data = task.load()
    model, generator = seeded_model(micro_study, micro_study.variants["base"], 0, data, torch.device("cpu"))
    model.eval()  # no dropout: the two routes differ only in how gradients are summed
    batch = next(iter(task.train_batches(data, 64, generator)))
    work = parts.loss_work(task, model, batch, micro_study.loss, micro_study.spec.train.micro_batches)
    assert len(work) == 3
    streamed = parts.parallel_parts(model, work, torch.Generator().manual_seed(5), NO_AUTOCAST)
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    seeds = torch.randint(2**62, (3,), generator=torch.Generator().manual_seed(5)).tolist()
    total = 0.0
    for piece, seed in zip(work, seeds, strict=True):
        part = piece(torch.Generator().manual_seed(seed))
        (part.value * part.share).backward()
        total = total + (part.value * part.share).detach()
    torch.testing.assert_close(streamed, total)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, model.get_parameter(name).grad, rtol=1e-5, atol=1e-7, msg=name)


def test_a_model_with_auxiliary_losses_keeps_parts_serial(micro_study, monkeypatch):
    data = micro_study.task.load()
    model, _ = seeded_model(micro_study, micro_study.variants["moe"], 0, data, torch.device("cpu"))
    assert components.has_auxiliary_losses(model)
    base, _ = seeded_model(micro_study, micro_study.variants["base"], 0, data, torch.device("cpu"))
    assert not components.has_auxiliary_losses(base)
    monkeypatch.setattr(
        parts, "parallel_parts", lambda *a: pytest.fail("MoE's balance loss must stay serial")
    )
    loss, grads = one_step(micro_study, "moe", threads=2)
    assert torch.isfinite(loss) and grads


def test_dropout_masks_come_from_the_threads_generator():
    x = torch.ones(1000)
    with components.dropout_generator(torch.Generator().manual_seed(3)):
        first = components.dropout(x, 0.5)
    torch.manual_seed(0)  # the global RNG plays no part
    with components.dropout_generator(torch.Generator().manual_seed(3)):
        again = components.dropout(x, 0.5)
    assert torch.equal(first, again)
    assert 400 < int((first == 0).sum()) < 600

"""``train.vary``: initialisation, data order and dropout vary with the seed separately; a source
held still draws from seed 0 in every trial; the default trains exactly as before the option."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch

from ablate.drive.ledger import fingerprint, legacy_fingerprint
from ablate.errors import StudyError
from ablate.model.build import build_backbone
from ablate.study.load import load_study
from ablate.training.trainer import seed_everything, seeded_model, train_trial

CPU = torch.device("cpu")


def _study(write_study, vary: dict | None = None, name: str = "study.yaml"):
    patch = {"train": {"vary": vary}} if vary is not None else {}
    return load_study(write_study(patch, name=name))


def _start(study, seed: int):
    """(initial weights, first epoch's batch order, global torch RNG state after the setup)."""
    data = study.task.load()
    model, generator = seeded_model(study, study.variants["base"], seed, data, CPU)
    after = torch.get_rng_state()
    order = torch.cat([b.users for b in study.task.train_batches(data, 16, generator)])
    return model.state_dict(), order, after


def _same_weights(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_default_is_one_stream_per_seed_as_before(write_study):
    """The default setup is today's: seed everything, a generator from the seed, build."""
    study = _study(write_study)
    data = study.task.load()
    variant = study.variants["base"]
    seed_everything(2)
    generator = torch.Generator().manual_seed(2)
    ctx = study.build_context(variant, study.task.max_len(data))
    model = study.task.build_model(build_backbone(variant, ctx), ctx, data)
    old_rng = torch.get_rng_state()

    new_model, new_generator = seeded_model(study, variant, 2, data, CPU)
    assert _same_weights(model.state_dict(), new_model.state_dict())
    assert torch.equal(generator.get_state(), new_generator.get_state())
    assert torch.equal(old_rng, torch.get_rng_state())  # dropout masks continue the same stream


def test_explicit_default_trains_the_same_under_the_old_fingerprint(write_study):
    implicit = _study(write_study)
    explicit = _study(write_study, {"init": True, "order": True, "dropout": True}, name="explicit.yaml")
    data = implicit.task.load()
    a = train_trial(implicit, implicit.variants["base"], 1, data, CPU)
    b = train_trial(explicit, explicit.variants["base"], 1, data, CPU)
    assert a.summary == b.summary and a.curves == b.curves
    # The fingerprint as it was before ``vary`` (and ``model.final_norm``, ``TrainSpec.LATER_OPTIONS``)
    # existed: existing output folders resume.
    train = implicit.spec.train.model_dump(
        # threads and pack (added since) train the same numbers: never in a fingerprint
        exclude={"device", "eval_batch_size", "threads", "pack", "vary", *implicit.spec.train.LATER_OPTIONS}
    )
    content = {
        "model": implicit.variants["base"].spec.model_dump(exclude={"final_norm", "config"}),  # added since
        "train": train,
        "task": implicit.spec.task.model_dump(),
        "metrics": implicit.metrics,
    }
    old = hashlib.sha256(json.dumps(content, sort_keys=True, default=str).encode()).hexdigest()[:16]
    assert legacy_fingerprint(implicit, "base") == legacy_fingerprint(explicit, "base") == old
    assert fingerprint(implicit, "base") == fingerprint(explicit, "base")
    held = _study(write_study, {"init": False}, name="held.yaml")
    assert legacy_fingerprint(held, "base") != old
    assert fingerprint(held, "base") != fingerprint(implicit, "base")


def test_init_held_still_same_weights_different_orders(write_study):
    study = _study(write_study, {"init": False})
    weights_1, order_1, _ = _start(study, 1)
    weights_2, order_2, _ = _start(study, 2)
    assert _same_weights(weights_1, weights_2)
    assert not torch.equal(order_1, order_2)
    assert sorted(order_1.tolist()) == sorted(order_2.tolist())  # the same users, shuffled otherwise
    # Seed 0's weights are the default study's seed 0 weights.
    assert _same_weights(weights_1, _start(_study(write_study, name="default.yaml"), 0)[0])


def test_order_held_still_same_batches_different_weights(write_study):
    study = _study(write_study, {"order": False})
    weights_1, order_1, rng_1 = _start(study, 1)
    weights_2, order_2, rng_2 = _start(study, 2)
    assert torch.equal(order_1, order_2)
    assert not _same_weights(weights_1, weights_2)
    assert not torch.equal(rng_1, rng_2)  # dropout still varies, continuing the init stream


@pytest.mark.parametrize(
    ("vary", "same_dropout"), [({"dropout": False}, True), ({"init": False}, False), ({}, False)]
)
def test_dropout_stream(write_study, vary, same_dropout):
    study = _study(write_study, vary)
    weights_1, _, rng_1 = _start(study, 1)
    weights_2, _, rng_2 = _start(study, 2)
    assert torch.equal(rng_1, rng_2) is same_dropout
    assert _same_weights(weights_1, weights_2) is (vary.get("init", True) is False)


def test_nothing_varies_trains_every_seed_alike(write_study):
    study = _study(write_study, {"init": False, "order": False, "dropout": False})
    data = study.task.load()
    a = train_trial(study, study.variants["base"], 1, data, CPU)
    b = train_trial(study, study.variants["base"], 5, data, CPU)
    assert a.summary == b.summary


def test_unknown_source_is_one_line_error(write_study):
    with pytest.raises(StudyError, match=r"train\.vary\.inti"):
        _study(write_study, {"inti": False})

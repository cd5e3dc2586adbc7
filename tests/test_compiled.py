"""``train.compile`` (ablate.training.compiled): a tiny SASRec-like model's training forward traces
as one graph with no break — a trial alone's backbone and a stacked pack's ``vmap`` forward of two
members — and a compiled step's loss and gradients are the eager step's to float32 rounding."""

from __future__ import annotations

import copy
import functools

import pytest
import torch
import torch._dynamo

import ablate.training.compiled as compiled_module
from ablate.components import dropout_generator
from ablate.study.load import load_study
from ablate.training import packed, stacked
from ablate.training.compiled import CompiledForward, _keyed
from ablate.training.packed import train_packed
from ablate.training.randomness import GlobalStates
from ablate.training.trainer import Trainer

CPU = torch.device("cpu")
# SASRec as studies/sasrec_ml1m.yaml builds it, at tiny sizes: pre_skip layer norms, dropout on the
# attention probabilities and after the FFN, end-aligned learned positions, BCE on unseen negatives.
SASREC = {
    "task": {"jagged": False},
    "model": {
        "blocks": 1,  # one block: what a second would add is the same graph again, compiled twice as long
        "dropout": 0.2,
        "ffn": {"kind": "pointwise", "output_dropout": 0.2},
        "norm": {"kind": "layernorm", "placement": "pre_skip", "eps": 1.0e-8},
        "connection": {"kind": "residual", "dropout": 0.0},
        "init": "xavier_normal",
        "bias": [{"kind": "abs_pos", "align": "end"}],
    },
    "train": {"batch_size": 32, "loss": {"kind": "bce", "negatives": 1, "exclude_seen": True}},
}
# float32: the compiled graph fuses and reorders sums (measured ≤ 1.1e-6 relative on the gradients).
RTOL = 1e-5


@pytest.fixture(autouse=True)
def fresh():
    """No compiled function carried between tests (they are cached per structure and mode)."""
    compiled_module._compiled.cache_clear()
    yield
    compiled_module._compiled.cache_clear()


def _study(write_study, compile_mode: str = "off", name: str = "study.yaml"):
    patch = {**SASREC, "train": {**SASREC["train"], "compile": compile_mode}}
    return load_study(write_study(patch, name=name))


def _batches(study, data, count: int) -> list:
    """``count`` training batches of one shape (a new shape would compile again)."""
    drawn = list(study.task.train_batches(data, 32, torch.Generator().manual_seed(5)))
    return [b for b in drawn if b.items.shape == drawn[0].items.shape][:count]


def _explained(function, *args):
    with torch.no_grad():
        found = torch._dynamo.explain(function)(*args)
    return found.graph_count, found.graph_break_count, [b.reason.splitlines()[0] for b in found.break_reasons]


def test_a_trial_alones_training_forward_traces_as_one_graph(write_study):
    study = _study(write_study)
    data = study.task.load()
    model = Trainer.start(study, study.variants["base"], 0, data, CPU).model.train()
    batch = _batches(study, data, 1)[0]
    x = model.items(batch.items) * model.scale  # the task's own forward, up to its backbone
    tokens = batch.token_context()
    keys = torch.arange(4, dtype=torch.int64) * 7919  # the embedding's, attention's and the FFN's dropout
    assert _explained(_keyed, model.backbone, keys, (x, tokens), {}) == (1, 0, [])


def test_a_stacked_forward_of_two_members_traces_as_one_graph(write_study):
    study = _study(write_study)
    data = study.task.load()
    models = [Trainer.start(study, study.variants["base"], s, data, CPU).model for s in (0, 1)]
    batches = _batches(study, data, 2)
    stacker = stacked.Stacker(copy.deepcopy(models[0]).to("meta"), 4)
    aliases, params, buffers = stacked.stack_weights(models, grad=True)
    keys = torch.arange(8, dtype=torch.int64).reshape(2, 4) * 7919
    inputs = (stacker.skeleton.train(), aliases, 4, params, buffers, stacker.stack(batches), keys)
    assert _explained(stacked.stacked_forward, *inputs) == (1, 0, [])


@pytest.mark.heavy
def test_a_compiled_step_is_the_eager_step(write_study):
    """Inductor's compiled step (its first call eager, counting the keys) against the eager
    trainer: the same dropout draws, the loss and gradients to float32 rounding, step by step."""
    eager, compiled = _study(write_study), _study(write_study, "default", name="compiled.yaml")
    data = eager.task.load()
    trainers, states = [], []
    for study in (eager, compiled):
        trainers.append(Trainer.start(study, study.variants["base"], 0, data, CPU))
        states.append(GlobalStates.capture())  # each its own global generator: the dropout keys
    for batch in _batches(eager, data, 3):
        losses = []
        for trainer, state in zip(trainers, states, strict=True):
            with state.active():
                losses.append(float(trainer.step(batch)))
        assert losses[1] == pytest.approx(losses[0], rel=RTOL)
        for a, b in zip(trainers[0].model.parameters(), trainers[1].model.parameters(), strict=True):
            assert float((b.grad - a.grad).abs().max()) <= RTOL * float(a.grad.abs().max())
    assert compiled_module._compiled.cache_info().currsize == 1  # compiled, once


def test_compiled_stacked_members_are_the_eager_ones(write_study, monkeypatch):
    """A pack of two stacked members with ``train.compile``: the vmap forward compiled (here by
    dynamo and AOTAutograd without inductor's code generation, which the test above covers), the
    members' curves and results the eager pack's to float32 rounding."""
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="aot_eager"))
    patch = {**SASREC, "train": {**SASREC["train"], "epochs": 1}}
    results = []
    for mode in ("off", "default"):
        study = load_study(
            write_study({**patch, "train": {**patch["train"], "compile": mode}}, name=f"{mode}.yaml")
        )
        data = study.task.load()
        results.append(train_packed(study, study.variants["base"], [0, 1], data, CPU, stacked=True))
    assert compiled_module._compiled.cache_info().currsize == 1
    for a, b in zip(*results, strict=True):
        assert [v for *_, v in b.curves] == pytest.approx([v for *_, v in a.curves], rel=RTOL)
        assert b.summary == pytest.approx(a.summary, rel=RTOL)


def test_keys_drawn_before_the_forward_are_the_keys_it_would_draw_itself(write_study):
    """The first (eager) call counts the keys; a compiled call takes as many, drawn before, from
    the generator the forward would draw them from: afterwards that stands where it would."""
    study = _study(write_study)
    data = study.task.load()
    model = Trainer.start(study, study.variants["base"], 0, data, CPU).model.train()
    batch = _batches(study, data, 1)[0]
    forward = CompiledForward(model, "default")
    given = []
    which = (id(model.backbone), torch.get_num_threads())
    forward.functions[which] = lambda backbone, keys, args, kwargs: given.append(keys.tolist())
    generator = torch.Generator().manual_seed(3)
    with forward, torch.no_grad(), dropout_generator(generator):
        model(batch)  # eager: its keys counted as drawn
        model(batch)  # the compiled function (here a stand-in): its keys drawn before
    assert forward.keys == {id(model.backbone): 4}
    reference = torch.Generator().manual_seed(3)
    draws = [
        int(torch.empty((), dtype=torch.int64).random_(-(2**63), None, generator=reference)) for _ in range(8)
    ]
    assert given == [draws[4:]]
    assert torch.equal(generator.get_state(), reference.get_state())
    assert "forward" not in vars(model.backbone)  # the backbone's own forward again, once left


def test_a_compiled_forward_that_reads_a_field_the_members_differ_in_steps_in_turns(write_study, monkeypatch):
    """Dynamo wraps the stacked forward's refusal of a field left out of its input: still read as
    that field's, so the pack's steps run in turns from then on, as eager."""
    from ablate_plugins.seqrec.model import SeqRecModel

    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="aot_eager"))
    real = SeqRecModel.forward

    def reads_seen(self, batch, last_only=False):
        if batch.seen is not None:  # a training batch's: each row's seen items, the members' own
            batch.seen.numel()
        return real(self, batch, last_only)

    monkeypatch.setattr(SeqRecModel, "forward", reads_seen)
    made = []
    monkeypatch.setattr(packed, "stacker", lambda run: made.append(stacked.stacker(run)) or made[-1])
    # One epoch of two batches: each member's steps in turns are compiled too (its second).
    train = {**SASREC["train"], "compile": "default", "epochs": 1, "batch_size": 60}
    study = load_study(write_study({**SASREC, "train": train}))
    train_packed(study, study.variants["base"], [0, 1], study.task.load(), CPU, stacked=True)
    ((stacker, _),) = made
    assert stacker.read == {"seen"} and stacker.steps["stacked"] == 0

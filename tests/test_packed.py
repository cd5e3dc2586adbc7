"""Packed trials (ablate.training.packed): k seeds of a variant trained as one pack give, member by
member, what k trials alone give — weights, curves, metrics, per-user results, early stopping —
whether the members take turns or step in parallel threads, with dropout, with members stopping
at different epochs, and after a stop in the middle of an epoch resumed from their checkpoints."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

from ablate.fastpaths import fast_paths
from ablate.study.load import load_study
from ablate.training.packed import steps_in_threads, train_packed
from ablate.training.trainer import Checkpoint, TrialFailed, TrialRun, train_trial

CPU = torch.device("cpu")
SEEDS = (0, 1, 2)
# Dropout on, patience short: the seeds stop early at different epochs (asserted below).
PATCH = {"train": {"epochs": 8, "patience": 1, "lr": 0.05}, "model": {"dropout": 0.3}}


class Interrupt(BaseException):
    """Stands for a worker killed in the middle of an epoch (nothing catches it)."""


@pytest.fixture
def threads():
    """Two torch threads (members may step in parallel streams), restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def float64():
    """Models built in float64 (fbgemm's jagged kernels have no float64 form: torch's instead)."""
    torch.set_default_dtype(torch.float64)
    with fast_paths(fbgemm=False):
        yield
    torch.set_default_dtype(torch.float32)


def _alone(study, data, seeds=SEEDS, threads=2):
    """Each seed's trial alone, at ``threads`` torch threads (a member in a stream of its own runs
    single-threaded: its trial alone at one thread is what it equals bit for bit)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return [train_trial(study, study.variants["mlp"], seed, data, CPU) for seed in seeds]
    finally:
        torch.set_num_threads(before)


def _assert_same(packed, alone, exact=True):
    for a, b in zip(packed, alone, strict=True):
        assert (a.epochs, a.best_epoch) == (b.epochs, b.best_epoch)
        assert [(e, k) for e, k, _ in a.curves] == [(e, k) for e, k, _ in b.curves]
        if exact:
            assert a.curves == b.curves and a.summary == b.summary
            assert a.per_unit.equals(b.per_unit)
        else:  # float32, members single-threaded against trials on two threads
            assert [v for *_, v in a.curves] == pytest.approx([v for *_, v in b.curves], rel=1e-4, abs=1e-6)
            assert a.summary == pytest.approx(b.summary, rel=1e-4, abs=1e-6)


@pytest.mark.heavy
@pytest.mark.parametrize("in_threads", [False, True], ids=["turns", "threads"])
def test_packed_members_are_the_trials_alone_bit_for_bit_in_float64(
    write_study, threads, float64, in_threads
):
    study = load_study(write_study(PATCH))
    data = study.task.load()
    alone = _alone(study, data, threads=1 if in_threads else 2)
    assert len({r.epochs for r in alone}) > 1, "the seeds should stop at different epochs"
    packed = train_packed(study, study.variants["mlp"], SEEDS, data, CPU, threads=in_threads)
    _assert_same(packed, alone, exact=True)


@pytest.mark.heavy
def test_packed_members_in_float32(write_study, threads):
    """float32: bit for bit when members take turns; in parallel threads each member runs its ops
    single-threaded, bit for bit against its trial alone at one thread and within 1e-4 relative
    of it at two."""
    study = load_study(write_study({**PATCH, "train": {**PATCH["train"], "epochs": 4}}))
    data = study.task.load()
    seeds = SEEDS[:2]
    turns = train_packed(study, study.variants["mlp"], seeds, data, CPU, threads=False)
    _assert_same(turns, _alone(study, data, seeds), exact=True)
    assert steps_in_threads(TrialRun(study, study.variants["mlp"], 0, data, CPU))
    in_threads = train_packed(study, study.variants["mlp"], seeds, data, CPU, threads=True)
    _assert_same(in_threads, _alone(study, data, seeds, threads=1), exact=True)
    _assert_same(in_threads, turns, exact=False)


def test_micro_batched_members_in_threads_are_the_trials_alone_at_any_thread_count(write_study, threads):
    """With micro-batches a trial alone runs its parts single-threaded already: bit for bit."""
    study = load_study(write_study({**PATCH, "train": {**PATCH["train"], "epochs": 4, "micro_batches": 2}}))
    data = study.task.load()
    in_threads = train_packed(study, study.variants["mlp"], SEEDS[:2], data, CPU, threads=True)
    _assert_same(in_threads, _alone(study, data, SEEDS[:2], threads=2), exact=True)


def test_a_pack_stopped_mid_epoch_resumes_from_each_members_checkpoint(write_study, tmp_path, threads):
    patch = {"train": {"epochs": 6, "patience": 10}, "model": {"dropout": 0.3}}
    study = load_study(write_study(patch))
    data = study.task.load()
    variant = study.variants["mlp"]
    alone = _alone(study, data, SEEDS[:2], threads=1)
    checkpoints = [Checkpoint(tmp_path / f"seed{s}.pt", signature=f"s{s}", every_s=0) for s in SEEDS[:2]]
    steps = []

    def kill_in_epoch_four():
        steps.append(1)
        if len(steps) == 2 * 3 * 2 + 1:  # 3 epochs of 2 steps for each member, then one step more
            raise Interrupt

    with pytest.raises(Interrupt):
        train_packed(
            study, variant, SEEDS[:2], data, CPU, on_step=kill_in_epoch_four, checkpoints=checkpoints
        )
    assert [torch.load(c.path, weights_only=True)["epoch"] for c in checkpoints] == [3, 3]
    resumed = train_packed(study, variant, SEEDS[:2], data, CPU, checkpoints=checkpoints)
    assert [r.resumed_from for r in resumed] == [3, 3]
    _assert_same(resumed, alone, exact=True)
    assert not any(c.path.exists() for c in checkpoints)


def test_a_members_checkpoint_is_the_trial_alones(write_study, tmp_path):
    """A checkpoint a pack member left resumes as a trial alone (and ends as the trial alone)."""
    patch = {"train": {"epochs": 4, "patience": 10}, "model": {"dropout": 0.3}}
    study = load_study(write_study(patch))
    data = study.task.load()
    variant = study.variants["mlp"]
    (whole,) = _alone(study, data, (1,))
    checkpoint = Checkpoint(tmp_path / "seed1.pt", signature="s1", every_s=0)

    def stop_after_two(epoch, logged):
        if epoch == 2:
            raise Interrupt

    with pytest.raises(Interrupt):
        train_packed(
            study, variant, (0, 1), data, CPU, on_epoch=[None, stop_after_two], checkpoints=[None, checkpoint]
        )
    resumed = train_trial(study, variant, 1, data, CPU, checkpoint=checkpoint)
    assert resumed.resumed_from == 1  # epoch 2's callback stopped it before its save
    _assert_same([resumed], [whole], exact=True)


def test_a_failing_member_fails_alone(write_study, monkeypatch, threads):
    study = load_study(write_study({"train": {"epochs": 3}}))
    data = study.task.load()
    alone = _alone(study, data, (0, 2))
    real = TrialRun.train_epoch

    def diverge_seed_one(run):
        if run.trainer.model is failing[0] and run.progress.epoch == 1:
            raise TrialFailed("loss became nan at epoch 2")
        real(run)

    failing = []
    real_init = TrialRun.__init__

    def remember(self, study, variant, seed, *args, **kwargs):
        real_init(self, study, variant, seed, *args, **kwargs)
        if seed == 1:
            failing.append(self.model)

    monkeypatch.setattr(TrialRun, "__init__", remember)
    monkeypatch.setattr(TrialRun, "train_epoch", diverge_seed_one)
    first, second, third = train_packed(study, study.variants["mlp"], (0, 1, 2), data, CPU, threads=False)
    assert isinstance(second, TrialFailed) and "epoch 2" in str(second)
    _assert_same([first, third], alone, exact=True)


# Stacked packs (ablate.training.stacked): the members' forward as one vmap over stacked parameters.
STACKED = {**PATCH, "task": {"jagged": False}}  # fbgemm's jagged ops have no batching rule


@pytest.fixture
def stackers(monkeypatch):
    """The Stacker each pack gets (None where it takes turns), as the pack made it."""
    import ablate.training.packed as packed

    made = []

    def keep(run):
        found, reason = real(run)
        made.append(found)
        return found, reason

    real = packed.stacker
    monkeypatch.setattr(packed, "stacker", keep)
    return made


def _assert_close(packed, alone):
    """Float64 through vmap's batched products: the same epochs, curves and results to 1e-12."""
    for a, b in zip(packed, alone, strict=True):
        assert (a.epochs, a.best_epoch) == (b.epochs, b.best_epoch)
        assert [(e, k) for e, k, _ in a.curves] == [(e, k) for e, k, _ in b.curves]
        assert [v for *_, v in a.curves] == pytest.approx([v for *_, v in b.curves], rel=1e-12, abs=1e-14)
        assert a.summary == pytest.approx(b.summary, rel=1e-12, abs=1e-14)
        pd.testing.assert_frame_equal(a.per_unit, b.per_unit, rtol=1e-12, atol=1e-14)


def test_stacked_members_are_the_trials_alone_in_float64(write_study, float64, stackers):
    study = load_study(write_study(STACKED))
    data = study.task.load()
    alone = _alone(study, data)
    assert len({r.epochs for r in alone}) > 1, "the seeds should stop at different epochs"
    packed = train_packed(study, study.variants["mlp"], SEEDS, data, CPU, stacked=True)
    (stacker,) = stackers
    assert stacker.keys > 0, "dropout draws keys: each member's own"
    assert stacker.steps["stacked"] > 0 and stacker.steps["in turns"] == 0
    _assert_close(packed, alone)


def test_stacked_steps_of_other_shapes_run_in_turns_and_a_stacked_pack_resumes(
    write_study, tmp_path, float64, stackers
):
    """Batches padded to their longest rows differ in width from member to member: those steps
    run in turns, the others stacked; a pack killed mid-epoch resumes from its checkpoints."""
    patch = {**STACKED, "train": {"epochs": 5, "patience": 10, "batch_size": 16}}
    patch["task"] = {**STACKED["task"], "data": {"min_len": 3, "max_len": 10}}
    study = load_study(write_study(patch))
    data = study.task.load()
    seeds, variant = SEEDS[:2], study.variants["mlp"]
    alone = _alone(study, data, seeds)
    checkpoints = [Checkpoint(tmp_path / f"seed{s}.pt", signature=f"s{s}", every_s=0) for s in seeds]
    steps = []

    def kill_in_epoch_three():
        steps.append(1)
        if len(steps) == 2 * 8 * 2 + 3:  # 2 epochs of 8 steps for each member, then 3 steps more
            raise Interrupt

    with pytest.raises(Interrupt):
        train_packed(
            study,
            variant,
            seeds,
            data,
            CPU,
            on_step=kill_in_epoch_three,
            checkpoints=checkpoints,
            stacked=True,
        )
    assert [torch.load(c.path, weights_only=True)["epoch"] for c in checkpoints] == [2, 2]
    assert stackers[0].steps["stacked"] > 0 and stackers[0].steps["in turns"] > 0
    resumed = train_packed(study, variant, seeds, data, CPU, checkpoints=checkpoints, stacked=True)
    assert [r.resumed_from for r in resumed] == [2, 2]
    _assert_close(resumed, alone)


def test_a_model_that_cannot_stack_takes_turns_saying_why_in_one_line(write_study, capsys, stackers):
    study = load_study(write_study({"train": {"epochs": 2}}))  # jagged layout: fbgemm's ops
    data = study.task.load()
    packed = train_packed(study, study.variants["mlp"], SEEDS[:2], data, CPU, stacked=True, threads=False)
    assert stackers == [None]
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning: the pack's 2 members take turns, not stacked: ")
    _assert_same(packed, _alone(study, data, SEEDS[:2]), exact=True)


def test_a_stacked_member_whose_loss_is_not_finite_fails_alone(write_study, float64, monkeypatch):
    study = load_study(write_study({**STACKED, "train": {"epochs": 3, "patience": 10}}))
    data = study.task.load()
    alone = _alone(study, data, (0, 2))
    task_type, failing, calls = type(study.task), [], []
    real_loss, real_init = task_type.loss, TrialRun.__init__

    def remember(self, study, variant, seed, *args, **kwargs):
        real_init(self, study, variant, seed, *args, **kwargs)
        if seed == 1:
            failing.append(self.model)

    def diverge(self, model, batch, loss, generator):
        value = real_loss(self, model, batch, loss, generator)
        if failing and model is failing[0]:
            calls.append(1)
            if len(calls) == 3:  # its first step of epoch 2 (2 steps an epoch)
                return value * float("nan")
        return value

    monkeypatch.setattr(TrialRun, "__init__", remember)
    monkeypatch.setattr(task_type, "loss", diverge)
    first, second, third = train_packed(study, study.variants["mlp"], (0, 1, 2), data, CPU, stacked=True)
    assert isinstance(second, TrialFailed) and str(second) == "loss became nan at epoch 2"
    _assert_close([first, third], alone)


# One variant of each kind of model the committed studies train, at tiny sizes: the seqrec
# families (shared tables and their one dropout draw a forward, relative time buckets, FuXi-α's
# channels), an lm with mHC streams, T2G-Former's tabular and DUET's forecasting models.
KINDS = [
    ("tisasrec_published_ml1m", "published"),
    ("hstu", "base"),
    ("fuxi_alpha_published", "published"),
    ("mhc_lm", "blocks=4,connection.kind=mhc"),
    ("t2g_california", "base"),
    ("duet_etth1", "base"),
]
TINY_DATA = {
    "seqrec": [
        "task.data={format: synthetic, users: 48, items: 80, min_len: 6, max_len: 12, seed: 0}",
        "task.max_len=12",
        "train.batch_size=16",
        "task.jagged=false",
    ],
    "forecast": [
        "task.data={format: synthetic, channels: 3, rows: 200, seed: 0}",
        "task.lookback=16",
        "task.horizon=8",
        "train.batch_size=32",
    ],
    "tabular": ["task.data={format: synthetic, rows: 200, seed: 0}", "train.batch_size=64"],
    "lm": [
        "task.data={format: synthetic, documents: 8, words: 40, seed: 0}",
        "task.window=16",
        "task.eval_bytes=512",
        "task.windows_per_epoch=8",
        "train.batch_size=4",
    ],
}


@pytest.mark.parametrize("name, variant", KINDS, ids=[n for n, _ in KINDS])
def test_each_kind_of_model_stacks_as_its_trials_alone(name, variant, stackers, shared_forwards):
    """Float64 where the task's data allow it (the synthetic series and tables are float32: there
    to 1e-5), dropout as the study sets it: every step stacked and every evaluation's forward
    shared, the members their trials alone."""
    path = Path(__file__).resolve().parents[1] / "studies" / f"{name}.yaml"
    kind = yaml.safe_load(path.read_text())["task"]["kind"]
    schedule = ["train.epochs=2", "train.eval_every=1", "train.patience=null", "train.second_stage=null"]
    schedule.append("train.micro_batches=1")
    wide = kind in ("seqrec", "lm")
    torch.set_default_dtype(torch.float64 if wide else torch.float32)
    try:
        with fast_paths(fbgemm=False):
            study = load_study(path, overrides=[*TINY_DATA[kind], *schedule])
            data = study.task.load()
            spec = study.variants[variant]
            alone = [train_trial(study, spec, seed, data, CPU) for seed in (0, 1)]
            packed = train_packed(study, spec, (0, 1), data, CPU, stacked=True)
    finally:
        torch.set_default_dtype(torch.float32)
    assert stackers[0] is not None and stackers[0].steps["in turns"] == 0
    assert shared_forwards and all(o.counts["stacked"] > 0 and o.counts["own"] == 0 for o in shared_forwards)
    tolerance = {"rel": 1e-12, "abs": 1e-14} if wide else {"rel": 1e-5, "abs": 1e-6}
    for a, b in zip(packed, alone, strict=True):
        assert [(e, k) for e, k, _ in a.curves] == [(e, k) for e, k, _ in b.curves]
        assert [v for *_, v in a.curves] == pytest.approx([v for *_, v in b.curves], **tolerance)
        assert a.summary == pytest.approx(b.summary, **tolerance)
    assert packed[0].summary != packed[1].summary


SEEN = {"kind": "bce", "negatives": 1, "exclude_seen": True}  # training batches carry each row's seen items


def test_a_forward_that_reads_a_field_the_members_differ_in_steps_in_turns(
    write_study, float64, stackers, monkeypatch
):
    """A field left out of the stacked input (each row's seen items differ between the members)
    is never handed to the forward as if absent: the forward's first read of it sends that step
    to run in turns, and every later step where it differs runs so without trying; the members
    are their trials alone."""
    from ablate_plugins.seqrec.model import SeqRecModel

    real, refused = SeqRecModel.forward, []

    def reads_seen(self, batch, last_only=False):
        if batch.seen is not None:  # a training batch's (None at evaluation)
            refused.append(type(batch.seen).__name__ == "_Unstacked")
            batch.seen.numel()  # raises where the field is left out of the stacked input
        return real(self, batch, last_only)

    monkeypatch.setattr(SeqRecModel, "forward", reads_seen)
    study = load_study(write_study({**STACKED, "train": {"epochs": 3, "patience": 10, "loss": SEEN}}))
    data = study.task.load()
    alone = _alone(study, data, SEEDS[:2])
    packed = train_packed(study, study.variants["mlp"], SEEDS[:2], data, CPU, stacked=True)
    (stacker,) = stackers
    assert stacker.read == {"seen"} and refused.count(True) == 1, "tried once, then known"
    assert stacker.steps["in turns"] > 1
    _assert_close(packed, alone)


def test_auto_measures_stacked_packs_and_leaves_every_draw_where_it_was(write_study):
    """``train.pack: auto``'s measurement (a GPU's; here on the CPU): stacked packs of 1, 2, 4
    copies timed on real batches, the process's random states as they were; a model that cannot
    stack (fbgemm's jagged layout) packs 1 without a timing."""
    import random

    from ablate.training.packsize import measure_pack_size

    study = load_study(write_study(STACKED))
    data = study.task.load()
    before = (torch.get_rng_state(), random.getstate())
    size, timings = measure_pack_size(study, study.variants["mlp"], data, CPU, 4)
    assert torch.equal(torch.get_rng_state(), before[0]) and random.getstate() == before[1]
    sizes = [t.members for t in timings]
    assert sizes in ([1, 2], [1, 2, 4]) and size in sizes and all(t.seconds > 0 for t in timings)
    jagged = load_study(write_study({}))
    assert measure_pack_size(jagged, jagged.variants["mlp"], jagged.task.load(), CPU, 4) == (1, [])


@pytest.mark.parametrize(
    "seconds, memory_mb, expected",
    [
        ({1: 1.0, 2: 1.0, 4: 1.0, 8: 1.0}, None, (8, [1, 2, 4, 8])),  # free until the most asked
        ({1: 1.0, 2: 1.0, 4: 3.9, 8: 1.0}, None, (2, [1, 2, 4])),  # 4 gains under 10 %: stop, keep 2
        ({1: 1.0, 2: 1.0, 4: 1.0, 8: 1.0}, 300.0, (2, [1, 2])),  # 2 × 200 MiB predicted at 4: no room
        ({1: 1.0, 2: 1.0, 4: None, 8: 1.0}, None, (2, [1, 2])),  # out of memory at 4
        ({1: 1.0, 2: 2.1, 4: 1.0, 8: 1.0}, None, (1, [1, 2])),  # 2 slower than alone
        ({1: 1.0, 2: 1.9, 4: 1.0, 8: 1.0}, None, (1, [1, 2])),  # 2 faster, but by under 10 %
    ],
)
def test_auto_doubles_while_it_gains_and_fits(write_study, monkeypatch, seconds, memory_mb, expected):
    import ablate.training.packsize as packsize

    def timed(run, found, members, device, clock):
        if seconds[members] is None:
            raise torch.OutOfMemoryError("CUDA out of memory")
        return packsize.Timing(members, seconds[members], 100.0 * members)

    monkeypatch.setattr(packsize, "_time", timed)
    study = load_study(write_study(STACKED))
    size, timings = packsize.measure_pack_size(
        study, study.variants["mlp"], study.task.load(), CPU, 8, memory_mb
    )
    assert (size, [t.members for t in timings]) == expected


@pytest.fixture
def shared_forwards(monkeypatch):
    """The SharedForwards each evaluation of a stacked pack opens, as the pack opened them."""
    import ablate.training.packed as packed
    from ablate.training.shared_eval import SharedForwards

    opened = []

    class Kept(SharedForwards):
        def __enter__(self):
            opened.append(self)
            return super().__enter__()

    monkeypatch.setattr(packed, "SharedForwards", Kept)
    return opened


def test_a_stacked_packs_evaluations_share_one_forward_per_batch(write_study, float64, shared_forwards):
    """Every validation and the final evaluations of a stacked pack: the first member's forward
    on a batch runs once for all members, the others take their slices; the members' numbers
    are their trials alone (to 1e-12 in float64)."""
    study = load_study(write_study({**STACKED, "train": {"epochs": 3, "patience": 10}}))
    data = study.task.load()
    packed = train_packed(study, study.variants["mlp"], SEEDS, data, CPU, stacked=True)
    _assert_close(packed, _alone(study, data))
    assert len(shared_forwards) == 3 + 1  # each epoch's validation, then the final evaluations
    for opened in shared_forwards:
        assert opened.counts["stacked"] > 0 and opened.counts["own"] == 0
        assert opened.counts["shared"] == 2 * opened.counts["stacked"]  # three members


def test_shared_forwards_answer_each_member_as_its_own_model_would():
    """Calls in the members' order, out of it, on inputs only one member sees, with keyword
    arguments: each answer is the member's own forward's."""
    from ablate.training.shared_eval import SharedForwards

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner, self.outer = torch.nn.Linear(4, 3), torch.nn.Linear(3, 2)

        def forward(self, x, scale=1.0):
            return self.outer(torch.tanh(self.inner(x))) * scale

    torch.manual_seed(0)
    models = [Net().double().eval() for _ in range(3)]
    skeleton = Net().double().to("meta")
    inputs = [
        torch.randn(5, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(i)) for i in range(3)
    ]
    own = [[type(m).forward(m, x, scale=2.0) for x in inputs] for m in models]
    # out of order within a member, an input member 1 alone sees, the last member's own input
    calls = [(0, 0), (0, 1), (1, 1), (1, 0), (1, 2), (2, 1), (2, 0), (2, 2)]
    with torch.no_grad(), SharedForwards(skeleton, models) as shared:
        for j, i in calls:
            torch.testing.assert_close(models[j](inputs[i], scale=2.0), own[j][i], rtol=1e-12, atol=1e-14)
    assert shared.counts == {"stacked": 3, "shared": 5, "own": 0}
    assert all("forward" not in vars(m) for m in models)  # each model's own forward back


def test_shared_forwards_that_vmap_cannot_run_are_each_members_own():
    from ablate.training.shared_eval import SharedForwards

    class Reads(torch.nn.Linear):
        def forward(self, x):
            return super().forward(x) * float(self.weight.detach().sum())  # a value read: no batching rule

    torch.manual_seed(0)
    models = [Reads(4, 2).double().eval() for _ in range(2)]
    x = torch.randn(3, 4, dtype=torch.float64)
    with torch.no_grad(), SharedForwards(Reads(4, 2).double().to("meta"), models) as shared:
        answers = [models[j](x) for j in (0, 1, 0)]
    for answer, j in zip(answers, (0, 1, 0), strict=True):
        torch.testing.assert_close(
            answer, torch.nn.Linear.forward(models[j], x) * float(models[j].weight.detach().sum())
        )
    assert shared.counts == {"stacked": 0, "shared": 0, "own": 3}


def test_shared_forwards_keep_at_most_their_budget_of_outputs(monkeypatch):
    """Outputs wait for the members yet to take them up to a budget; past it, calls are answered
    by each member's own model (an lm's evaluation could keep GiBs otherwise)."""
    import ablate.training.shared_eval as shared_eval

    monkeypatch.setattr(shared_eval, "KEPT_BYTES", 2 * (2 * 5 * 2 * 8))  # two inputs' outputs, 2 members
    models = [torch.nn.Linear(4, 2).double().eval() for _ in range(2)]
    inputs = [torch.randn(5, 4, dtype=torch.float64) for _ in range(3)]
    with torch.no_grad(), shared_eval.SharedForwards(torch.nn.Linear(4, 2).to("meta"), models) as shared:
        answers = [[models[j](x) for x in inputs] for j in (0, 1)]
    for j in (0, 1):
        for x, answer in zip(inputs, answers[j], strict=True):
            torch.testing.assert_close(answer, torch.nn.Linear.forward(models[j], x))
    # member 0: two inputs stacked, the budget full at the third (its own); member 1 takes its two
    # slices and, the last member, runs the third itself
    assert shared.counts == {"stacked": 2, "shared": 2, "own": 2}

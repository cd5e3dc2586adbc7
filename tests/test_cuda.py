"""The GPU path, where CUDA is present: every component kind the ready studies in studies/ use,
trained and evaluated on CUDA, resumed from a checkpoint, in bf16 autocast, agreeing with the
CPU; fbgemm's jagged kernels on CUDA against the pure-torch form; a real out-of-memory error
retried and recorded; ``ablate run --gpus`` placing its workers; ``train.compile``'s CUDA graphs.
Skipped without a CUDA device.

Each study is made tiny by overrides (synthetic data of its task, short sequences, 1-2 epochs),
keeping every model setting; variants that build the same components are tested once.
"""

from __future__ import annotations

import os

# Deterministic cuBLAS (read when cuBLAS starts): a resumed trial must retrace the uninterrupted one.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import re
from pathlib import Path

import pytest
import torch
import yaml
from torch.utils._pytree import tree_leaves

from ablate import jagged as J
from ablate.components import TokenContext
from ablate.model.build import build_backbone
from ablate.study.load import Study, load_study
from ablate.training.packed import train_packed
from ablate.training.trainer import Checkpoint, seeded_model, train_trial, training_autocast

if not torch.cuda.is_available():
    pytest.skip(
        f"no CUDA device is present (torch {torch.__version__}, CUDA build: {torch.version.cuda})",
        allow_module_level=True,
    )

CUDA = torch.device("cuda")
STUDIES = sorted((Path(__file__).resolve().parents[1] / "studies").glob("*.yaml"))

# Per task kind: overrides that keep a study's model and swap its data for a small synthetic set.
TINY = {
    "seqrec": [
        "task.data={format: synthetic, users: 96, items: 150, min_len: 8, max_len: 20, seed: 0}",
        "task.max_len=20",
        "train.batch_size=32",
    ],
    "forecast": [
        "task.data={format: synthetic, channels: 3, rows: 400, seed: 0}",
        "task.lookback=16",
        "task.horizon=8",
        "train.batch_size=32",
    ],
    "tabular": ["task.data={format: synthetic, rows: 300, seed: 0}", "train.batch_size=64"],
    "lm": [
        "task.data={format: synthetic, documents: 16, words: 60, seed: 0}",
        "task.window=32",
        "task.eval_bytes=1024",
        "task.windows_per_epoch=16",
        "train.batch_size=8",
    ],
}
SCHEDULE = ["train.eval_every=1", "train.patience=null", "train.second_stage=null"]


def tiny_study(path: Path, epochs: int = 1, *extra: str) -> Study:
    kind = yaml.safe_load(path.read_text())["task"]["kind"]
    return load_study(path, overrides=[*TINY[kind], *SCHEDULE, f"train.epochs={epochs}", *extra])


def seed_cases() -> list[tuple[Path, str]]:
    """(study file, variant): each distinct set of components of each task, once."""
    seen, cases = set(), []
    for path in STUDIES:
        study = tiny_study(path)
        for name, variant in study.variants.items():
            key = (study.task.kind_name(), tuple(sorted(variant.components().items())))
            if key not in seen:
                seen.add(key)
                cases.append((path, name))
    return cases


CASES = seed_cases()
IDS = [f"{path.stem}-{variant}" for path, variant in CASES]


def first_batch(study: Study, data, generator: torch.Generator):
    return next(iter(study.task.train_batches(data, study.spec.train.batch_size, generator)))


@pytest.fixture
def deterministic():
    torch.use_deterministic_algorithms(True, warn_only=True)
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.use_deterministic_algorithms(False)
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32


@pytest.mark.parametrize("path, variant", CASES, ids=IDS)
def test_trains_and_evaluates_on_cuda(path, variant):
    study = tiny_study(path, 2)
    data = study.task.load()
    result = train_trial(study, study.variants[variant], 0, data, CUDA)
    assert result.epochs == 2 and result.summary
    assert all(torch.isfinite(torch.tensor(v)) for v in result.summary.values()), result.summary
    assert len(result.per_unit) > 0 and result.peak_memory_mb > 0 and result.tokens_per_s > 0


@pytest.mark.parametrize("path, variant", CASES, ids=IDS)
def test_cpu_and_cuda_forward_agree(path, variant, deterministic):
    """The same weights and batch (dropout off, negatives from the same CPU generator) give the
    same loss on both devices in fp32."""
    study = tiny_study(path)
    if "eval_mask=sample" in study.variants[variant].components()["attention"]:  # a fresh draw per device
        study = tiny_study(path, 1, f"variants.{variant}.attention.eval_mask=threshold")
    data = study.task.load()
    model, _ = seeded_model(study, study.variants[variant], 0, data, torch.device("cpu"))
    batch = first_batch(study, data, torch.Generator().manual_seed(1))
    losses = []
    for device in (torch.device("cpu"), CUDA):
        model = model.to(device).eval()
        with torch.no_grad():
            loss = study.task.loss(model, batch.to(device), study.loss, torch.Generator().manual_seed(2))
        losses.append(loss.float().cpu())
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-4, atol=1e-5)


class Interrupt(BaseException):
    """Stands for a worker dying after an epoch (nothing catches it)."""


def first_with(attention: str) -> tuple[Path, str]:
    """The first case whose attention kind is ``attention``."""
    return next(
        c for c in CASES if tiny_study(c[0]).variants[c[1]].components()["attention"].startswith(attention)
    )


# A forecast model, HSTU's and FuXi-α's attention, and T2G's graph (its topology freezes at an epoch).
RESUMED = [CASES[0], first_with("pointwise"), first_with("ams"), first_with("fr_graph")]


@pytest.mark.parametrize("path, variant", RESUMED, ids=[f"{p.stem}-{v}" for p, v in RESUMED])
def test_resumed_trial_equals_the_uninterrupted_one_on_cuda(path, variant, tmp_path, deterministic):
    """Checkpointed after epoch 2 and resumed: the CUDA random state (dropout masks) comes back
    with the model and optimiser, so the curves and metrics are the uninterrupted trial's."""
    study = tiny_study(path, 4)
    data = study.task.load()
    spec = study.variants[variant]

    def train(checkpoint=None, stop_at=None):
        def on_epoch(epoch, logged):
            if epoch == stop_at:
                raise Interrupt

        return train_trial(study, spec, 3, data, CUDA, on_epoch=on_epoch, checkpoint=checkpoint)

    whole = train()
    checkpoint = Checkpoint(tmp_path / "trial.pt", signature="sig", every_s=0)
    with pytest.raises(Interrupt):
        train(checkpoint, stop_at=3)  # epochs 1-2 saved
    resumed = train(checkpoint)
    assert resumed.resumed_from == 2 and resumed.epochs == whole.epochs
    assert [(e, k) for e, k, _ in resumed.curves] == [(e, k) for e, k, _ in whole.curves]
    torch.testing.assert_close(
        torch.tensor([v for *_, v in resumed.curves]),
        torch.tensor([v for *_, v in whole.curves]),
        rtol=1e-5,
        atol=1e-6,
    )
    assert resumed.summary.keys() == whole.summary.keys()
    for key, value in whole.summary.items():
        assert resumed.summary[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key


@pytest.mark.parametrize("path, variant", RESUMED[:2], ids=[f"{p.stem}-{v}" for p, v in RESUMED[:2]])
def test_packed_members_equal_their_trials_alone_on_cuda(path, variant, deterministic):
    """Seeds packed on CUDA taking turns (each with its own CPU and CUDA random states, dropout
    included): each member's curves and metrics are its trial alone's."""
    study = tiny_study(path, 3)
    data = study.task.load()
    spec = study.variants[variant]
    alone = [train_trial(study, spec, seed, data, CUDA) for seed in (0, 1)]
    packed = train_packed(study, spec, (0, 1), data, CUDA, stacked=False)
    _assert_members_alone(packed, alone)


SASREC = Path(__file__).resolve().parents[1] / "studies" / "sasrec_ml1m.yaml"


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_stacked_members_equal_their_trials_alone_on_cuda(precision, deterministic):
    """Seeds packed on CUDA are stacked (one vmap forward for all, ablate.training.stacked). A
    member's dropout there is its own lanes, a trial alone's torch's: without dropout each
    member's curves and metrics are its trial alone's (fp32 to 1e-5; bf16 autocast to 5e-2); a
    trial alone's micro-batches draw their negatives from generators of their own: one batch."""
    overrides = [
        "model.dropout=0",
        "model.ffn.output_dropout=0",
        "train.micro_batches=1",
        f"train.precision={precision}",
    ]
    study = tiny_study(SASREC, 3, *overrides)
    data = study.task.load()
    spec = study.variants["base"]
    alone = [train_trial(study, spec, seed, data, CUDA) for seed in (0, 1)]
    packed = train_packed(study, spec, (0, 1), data, CUDA)
    tolerance = {"rel": 1e-5, "abs": 1e-6} if precision == "fp32" else {"rel": 5e-2, "abs": 5e-2}
    _assert_members_alone(packed, alone, **tolerance)


def test_auto_measures_its_pack_size_on_cuda(deterministic):
    """``train.pack: auto`` on a GPU: stacked packs timed and their memory read (the peaks grow
    with the members), a size chosen among those timed, the random states left as they were."""
    from ablate.training.packsize import measure_pack_size

    study = tiny_study(SASREC, 1, "task.jagged=false", "train.micro_batches=1")
    before = torch.cuda.get_rng_state()
    size, timings = measure_pack_size(study, study.variants["base"], study.task.load(), CUDA, 8)
    assert torch.equal(torch.cuda.get_rng_state(), before)
    assert size in [t.members for t in timings] and timings[0].members == 1
    peaks = [t.peak_mb for t in timings]
    assert all(p > 0 for p in peaks) and peaks == sorted(peaks), timings


def test_compiled_steps_equal_eager_ones_on_cuda(deterministic):
    """``train.compile: reduce-overhead`` on CUDA (inductor's kernels replayed as CUDA graphs): a
    trial alone (its backbone compiled) and two stacked members (their vmap forward compiled) give
    the eager trials' curves and metrics in fp32 to 1e-4. Without dropout: a compiled trial draws
    counter-based lanes, an eager one on CUDA torch's dropout."""
    overrides = [
        "model.dropout=0",
        "model.ffn.output_dropout=0",
        "train.micro_batches=1",
        "train.precision=fp32",
    ]
    eager = tiny_study(SASREC, 2, *overrides)
    compiled = tiny_study(SASREC, 2, *overrides, "train.compile=reduce-overhead")
    data = eager.task.load()
    alone = [train_trial(eager, eager.variants["base"], seed, data, CUDA) for seed in (0, 1)]
    spec = compiled.variants["base"]
    _assert_members_alone(
        [train_trial(compiled, spec, seed, data, CUDA) for seed in (0, 1)], alone, 1e-4, 1e-5
    )
    _assert_members_alone(train_packed(compiled, spec, (0, 1), data, CUDA), alone, 1e-4, 1e-5)


def _assert_members_alone(packed, alone, rel=1e-5, abs=1e-6):
    for member, trial in zip(packed, alone, strict=True):
        assert not isinstance(member, Exception), member
        assert (member.epochs, member.best_epoch) == (trial.epochs, trial.best_epoch)
        assert [(e, k) for e, k, _ in member.curves] == [(e, k) for e, k, _ in trial.curves]
        torch.testing.assert_close(
            torch.tensor([v for *_, v in member.curves]),
            torch.tensor([v for *_, v in trial.curves]),
            rtol=rel,
            atol=abs,
        )
        for key, value in trial.summary.items():
            assert member.summary[key] == pytest.approx(value, rel=rel, abs=abs), key
    assert packed[0].summary != packed[1].summary  # two seeds, two trials


@pytest.mark.parametrize("path, variant", CASES, ids=IDS)
def test_training_runs_in_bf16_autocast_and_evaluation_in_fp32(path, variant):
    """``train.precision: auto`` is bf16 autocast on CUDA: every module's forward in a training
    step runs under it, none in evaluation; linear layers compute in bf16 there; the trial ends
    with finite metrics."""
    study = tiny_study(path, 1)
    assert training_autocast(study.spec.train.precision, CUDA).fast_dtype == torch.bfloat16
    data = study.task.load()
    seen: dict[bool, set] = {True: set(), False: set()}  # grad enabled (training) → (autocast on, dtype)

    def hook(module, args, output):
        if not any(t.is_cuda for t in tree_leaves(output) if isinstance(t, torch.Tensor)):
            return  # the FLOPs probe's step, on a CPU copy of the model (ablate.training.flops)
        on = torch.is_autocast_enabled(CUDA.type)
        seen[torch.is_grad_enabled()].add((on, torch.get_autocast_dtype(CUDA.type) if on else None))
        if isinstance(module, torch.nn.Linear) and torch.is_grad_enabled():
            assert output.dtype == torch.bfloat16, module

    handle = torch.nn.modules.module.register_module_forward_hook(hook)
    try:
        result = train_trial(study, study.variants[variant], 0, data, CUDA)
    finally:
        handle.remove()
    assert seen[True] == {(True, torch.bfloat16)} and seen[False] == {(False, None)}, seen
    assert all(torch.isfinite(torch.tensor(v)) for v in result.summary.values())


# -- fbgemm's jagged kernels on CUDA ----------------------------------------------------------


def fbgemm_on_cuda() -> str | None:
    """None when fbgemm-gpu's jagged kernels run on CUDA tensors here, else why not."""
    if not J.HAVE_FBGEMM:
        return "fbgemm_gpu is not installed (the jagged path uses its pure-torch form)"
    try:
        offsets = torch.tensor([0, 1], device=CUDA)
        torch.ops.fbgemm.jagged_to_padded_dense(torch.ones(1, 1, device=CUDA), [offsets], [2], 0.0)
    except (NotImplementedError, RuntimeError) as exc:
        return f"this fbgemm_gpu build has no CUDA kernels ({str(exc).splitlines()[0][:80]})"
    return None


@pytest.fixture
def fbgemm_cuda():
    """Skips a test where fbgemm's kernels cannot run on CUDA tensors, saying why."""
    why = fbgemm_on_cuda()
    if why is not None:
        pytest.skip(why)


@pytest.mark.parametrize("shape", [(2,), (3, 2)])
def test_fbgemm_conversions_on_cuda_match_pure_torch(shape, fbgemm_cuda):
    lengths = torch.tensor([3, 0, 5, 1], device=CUDA)
    offsets = J.complete_cumsum(lengths, use_fbgemm=True)
    assert offsets.tolist() == J.complete_cumsum(lengths.cpu(), use_fbgemm=False).tolist()
    torch.manual_seed(0)
    values, weights = torch.randn(9, *shape, device=CUDA), torch.randn(4, 6, *shape, device=CUDA)
    runs = {}
    for use in (True, False):
        v = values.clone().requires_grad_(True)
        dense = J.to_padded(v, offsets, 6, use_fbgemm=use)
        back = J.to_values(dense * 2, offsets, use_fbgemm=use)
        ((dense * weights).sum() + back.pow(2).sum()).backward()
        runs[use] = (dense.detach(), back.detach(), v.grad)
    for a, b in zip(runs[True], runs[False], strict=True):
        torch.testing.assert_close(a, b)


SEQREC = [c for c in CASES if yaml.safe_load(c[0].read_text())["task"]["kind"] == "seqrec"]


@pytest.mark.parametrize("path, variant", SEQREC, ids=[f"{p.stem}-{v}" for p, v in SEQREC])
def test_jagged_backbone_on_cuda_matches_padded(path, variant, deterministic, fbgemm_cuda):
    """Each seqrec kind's backbone on jagged values (fbgemm kernels, then pure torch) gives the
    padded path's outputs and gradients at the real tokens, on CUDA (dropout off)."""
    study = tiny_study(path)
    spec = study.variants[variant]
    n = 12
    ctx = study.build_context(spec, n)
    torch.manual_seed(0)
    backbone = build_backbone(spec, ctx).to(CUDA).eval()
    lengths = torch.tensor([12, 3, 7, 1, 9], device=CUDA)
    b = len(lengths)
    valid = torch.arange(n, device=CUDA)[None, :] < lengths[:, None]
    x, weight = torch.randn(b, n, ctx.dim, device=CUDA), torch.randn(b, n, ctx.dim, device=CUDA)
    times = torch.cumsum(torch.randint(1, 1000, (b, n), device=CUDA), 1).float()
    positions = torch.arange(n, device=CUDA).expand(b, n)
    runs = []
    for layout in (J.Padded(), J.Jagged.from_valid(valid, True), J.Jagged.from_valid(valid, False)):
        backbone.zero_grad()
        xin = x.clone().requires_grad_(True)
        tokens = TokenContext(valid=valid, causal=True, positions=positions, timestamps=times, layout=layout)
        out = backbone(xin, tokens)
        (out[valid] * weight[valid]).sum().backward()
        grads = {k: p.grad.clone() for k, p in backbone.named_parameters() if p.grad is not None}
        runs.append((out[valid].detach(), xin.grad[valid], grads))
    padded = runs[0]
    for jagged in runs[1:]:
        torch.testing.assert_close(jagged[0], padded[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(jagged[1], padded[1], rtol=1e-4, atol=1e-5)
        for k in padded[2]:
            torch.testing.assert_close(jagged[2][k], padded[2][k], rtol=1e-4, atol=1e-4, msg=k)


# -- the driver on CUDA ---------------------------------------------------------------------


def test_out_of_memory_is_retried_at_half_the_batch_then_recorded(write_study, cli):
    """A real CUDA out-of-memory error (the allocator capped at a few kB) is caught: the trial is
    retried once at half the batch size, then fails with its reason; the run goes on and exits 1."""
    study = write_study({"seeds": [0], "report": {"calibration": 0, "bootstrap": 200}})
    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(1e-7)
    try:
        code, _, err = cli("run", study, "--quiet")
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
        torch.cuda.empty_cache()
    assert code in (1, 2), err  # 2: no trial finished, so there is no report to write
    code, status, _ = cli("status", study)
    assert (
        "failed: base seed 0: out of memory at batch size 32 (after a retry at half the batch size)" in status
    )


def test_run_with_gpus_places_workers_and_records_cuda(write_study, cli, tmp_path):
    """``ablate run --gpus all``: the probe measures a trial, the workers train on CUDA."""
    study = write_study({"report": {"calibration": 0, "bootstrap": 200}})
    code, _, err = cli("run", study, "--gpus", "all", "--reports", tmp_path / "reports")
    assert code == 0, err
    assert re.search(
        r"gpus: \d+ workers, up to \d+ trial\(s\) at once on .*measured: a trial peaks at", err
    ), err
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'tiny' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("tiny")
    runs = client.search_runs([experiment.experiment_id], "tags.`ablate.role` = 'trial'")
    assert runs and {r.data.tags["device"] for r in runs} == {"cuda"}
    assert {r.data.tags["ablate.precision"] for r in runs} == {"bf16"}  # train.precision: auto

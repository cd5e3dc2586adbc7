"""What is checked once the data are loaded, before any training (``ablate validate`` and every
run's first data load): each variant's size with the task's embedding and head and the data's
tokens per row (:func:`ablate.study.sizes.trained_sizes`), and one forward pass of a small batch through
each variant small enough to build on the CPU — a shape that only a forward pass meets (``rope``
needs an even head width, which the attention kind sets) fails here, not in every trial; and
each ``train.param_groups`` pattern against the variants' parameter names (a pattern no variant
has a parameter for is most likely a typo, which would otherwise train silently without it).
"""

from __future__ import annotations

import re
from typing import Any

import torch
from torch import nn

from ablate import fastpaths
from ablate.components import BuildContext
from ablate.errors import warn
from ablate.model.build import build_backbone
from ablate.study.load import BASE, Study
from ablate.study.sizes import TASK_KEY, ShapeProblem, Size, built, check, parameters
from ablate.training.trainer import resolve_device

# A model this small is built for real and takes one forward pass before training (≈ 0.1 s).
FORWARD_PARAMETERS = 20_000_000
FORWARD_ROWS = 2


def preflight(study: Study, data: Any) -> dict[str, Size]:
    """Each variant's size; raises :class:`~ablate.errors.StudyError` naming the variant's key
    when one is too large, refuses its shapes or fails its first forward pass."""
    check_device(study)
    if study.task.runs_trials:  # its own model: none of ablate's to size or step
        return {name: Size(0, 0) for name in study.variants}
    problem = study.task.loss_problem(study.loss, data)
    if problem is not None:
        where, _ = study.locate(BASE)
        raise where.error(("train", "loss", *problem[0]), problem[1])
    sizes = trained_sizes(study, data)
    for name, size in sizes.items():
        if size.parameters <= FORWARD_PARAMETERS:
            problem = first_forward_problem(study, name, data)
            if problem is not None:
                where, key = study.locate(name)
                raise where.error(key, f"a training step fails: {problem}")
    check_param_groups(study, data)
    return sizes


def check_device(study: Study) -> None:
    """Raise :class:`~ablate.errors.StudyError` at ``train.device`` when it names a device this
    machine does not have (every trial would fail on it). Checked where the trials run: a study
    may be validated on a login node and trained on GPU nodes, each checking its own."""
    name = study.spec.train.device
    device = resolve_device(name)
    missing = None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (device.index or 0) >= count:
            missing = f"{count} CUDA device(s) visible here" if count else "no CUDA device is visible here"
    elif device.type == "mps" and not torch.backends.mps.is_available():
        missing = "MPS (Apple GPU) is not available here"
    if missing:
        where, _ = study.locate(BASE)
        raise where.error(("train", "device"), f"'{name}': {missing}; use 'auto' or 'cpu'")
    if device.type == "cpu" and study.spec.train.precision == "bf16" and not cpu_has_bf16():
        warn(
            "train.precision: bf16 on a CPU without bf16 instructions (AVX-512-BF16 or AMX): torch "
            "emulates them, 6–9× slower than fp32 for SASRec on an AVX2 CPU (benchmarks/RESULTS.md); "
            "fp32 (or auto) trains faster here"
        )
    if device.type != "cuda" and study.spec.train.compile == "reduce-overhead":
        warn(
            "train.compile: reduce-overhead replays the compiled step as CUDA graphs, which need a "
            f"CUDA device: on {device.type} it compiles as default (inductor's kernels, no graphs)"
        )


def cpu_has_bf16() -> bool:
    """Whether this CPU computes in bf16 natively (AVX-512-BF16 or AMX), per torch's own probe."""
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, probe, lambda: True)() for probe in probes)


def check_param_groups(study: Study, data: Any) -> None:
    """Raise :class:`~ablate.errors.StudyError` at ``train.param_groups[i].params`` when that
    pattern matches no parameter of any variant (each variant built on the meta device: no
    memory, no compute). A pattern that matches in some variants only is fine: the others train
    as if the entry were absent (:func:`ablate.optim.schedules.parameter_groups`)."""
    groups = study.spec.train.param_groups
    if not groups:
        return
    names: set[str] = set()
    for variant in study.variants.values():
        try:
            with torch.device("meta"):
                ctx = study.build_context(variant, study.task.max_len(data))
                model = study.task.build_model(build_backbone(variant, ctx), ctx, data)
        except Exception:  # noqa: BLE001 - a model that cannot be built on meta: no verdict
            return
        names |= {parameter for parameter, _ in model.named_parameters()}
    for i, group in enumerate(groups):
        if not any(re.search(group.params, parameter) for parameter in names):
            example = min(names, key=len, default="")
            where, _ = study.locate(BASE)
            raise where.error(
                ("train", "param_groups", i, "params"),
                f"'{group.params}' matches no parameter of any variant (a regular expression "
                f"searched in dotted names such as '{example}')",
            )


def first_forward_problem(study: Study, name: str, data: Any) -> str | None:
    """What a component raised (ValueError, AssertionError: its own checks) on the loss of one
    small training batch in evaluation mode, or None. Other errors are left to training, which
    reports them per trial; the global random state is left as it was. The pure-torch jagged ops:
    importing fbgemm takes longer than the rest of `ablate validate` (both give the same values)."""
    task, variant = study.task, study.variants[name]
    with torch.random.fork_rng(devices=[]), torch.no_grad(), fastpaths.fast_paths(fbgemm=False):
        generator = torch.Generator().manual_seed(0)
        ctx = study.build_context(variant, task.max_len(data))
        try:
            model = task.build_model(build_backbone(variant, ctx), ctx, data).eval()
            batch = next(iter(task.train_batches(data, FORWARD_ROWS, generator)), None)
            if batch is not None:
                task.loss(model, batch, study.loss, generator)
        except (ValueError, AssertionError) as exc:
            return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        except Exception:  # noqa: BLE001 - not a component's own check: training reports it
            return None
    return None


def trained_sizes(study: Study, data: Any) -> dict[str, Size]:
    """Each variant's size with the loaded data: the task's embedding and head counted, the
    data's tokens per row. Raises :class:`StudyError` as :func:`check`."""
    max_len = study.task.max_len(data)
    # The task option that sets the tokens per row, where one holds their number (seqrec's max_len).
    named = [k for k, v in study.task.options.model_dump().items() if type(v) is int and v == max_len]
    tokens_key = ("task", named[0]) if len(named) == 1 else TASK_KEY

    def task_parameters(ctx: BuildContext) -> int:
        try:
            return parameters(built(lambda: study.task.build_model(nn.Identity(), ctx, data), TASK_KEY))
        except ShapeProblem as exc:
            raise ShapeProblem(TASK_KEY, exc.message, absolute=True) from None

    sizes = {}
    for name, variant in study.variants.items():
        where, key = study.locate(name)
        ctx = study.build_context(variant, max_len)
        sizes[name] = check(
            where, key, variant, ctx, study.spec.train.batch_size, task_parameters, tokens_key
        )
    return sizes


def trial_gflop(study: Study, name: str, data: Any) -> float:
    """A trial's training GFLOP before it trains, as the trial will count them (:mod:`.flops`):
    one counted step's FLOPs per real token × the real tokens of one epoch's batches × the
    epochs (every epoch run: early stopping only lowers it)."""
    from ablate.training.flops import flops_per_token
    from ablate.training.trainer import Trainer

    with torch.random.fork_rng(devices=[]):
        probe = Trainer.start(study, study.variants[name], 0, data, torch.device("cpu"))
        per_token = flops_per_token(probe, probe.batches(data))
        tokens = sum(study.task.batch_tokens(batch) for batch in probe.batches(data))
    return per_token * tokens * study.spec.train.epochs / 1e9

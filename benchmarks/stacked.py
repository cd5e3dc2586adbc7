"""Packing by stacked parameters, probed: k seeds of a seqrec study's variant as one model whose
parameters are stacked along a leading axis (``torch.func.stack_module_state``), one step for all
k through ``vmap(grad(loss))`` and one Adam over the stacked tensors, against the product's own
step of one trial alone (``Trainer.step``), on the same device.

    python benchmarks/stacked.py [--study studies/sasrec_ml1m.yaml] [--variant base] [--k 1 4 16]
                                 [--steps 8] [--reps 3] [--threads 2] [--device cpu|cuda]
                                 [--precision fp32|bf16] [--attention auto|math] [--dropout lanes|torch]
                                 [--exact 3] [--no-eval] [--note "..."] [--no-write]

This is the design probe for issue 57's packed model on a GPU (one kernel launch serves k
members, where a trial alone is bound by launches), not a product path yet. Dropout
(``--dropout lanes``, the default) draws each member's own counter-based lanes from keys drawn
beforehand from the member's generator, one per dropout call in the order its forward makes
them (:func:`ablate.components.dropout_keys`): the draws it makes alone, on any device (the
fused CPU kernels cannot run under ``vmap``: their torch forms draw the same lanes, which is
why the stacked step is slower on the CPU). ``--dropout torch`` lets vmap draw instead
(``randomness="different"``: no member's own draws). The loss is the task's BCE (``bce``) in
fixed shapes: each member's negatives drawn beforehand from its own generator by the task's
sampler (among the user's unseen items under ``exclude_seen``) at its target positions, the
mean taken by weights. What the probe leaves out, and what the product form must add before a
packed member is its trial alone:
- the loss of every task and loss kind in such a form (here seqrec's BCE alone);
- batches of one width for every member and for its trial alone (here right-padded to the
  widest member's: dropout's lanes are numbered by position, so a width is part of the draws);
- the positions' range check, which reads values (made once on each batch before the step);
- padded layers only (``task.jagged: false``): fbgemm's jagged ops are C++ autograd functions,
  which ``vmap`` cannot enter;
- early stopping, evaluation, checkpoints and records per member (``ablate.training.packed``).
The exactness check (``--exact``) stacks k members in float64 with dropout on and compares each
member's stacked gradient with the gradient of the task's own loss on its batch (its keys, its
negatives' generator), and one stacked Adam step with the member's own: the largest relative
difference.
Written to benchmarks/RESULTS.md (section "Packing by stacked parameters, probed").
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import itertools
import os
import statistics
import sys
import time
from datetime import date
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from results_file import cpu, publish  # benchmarks/ is on sys.path when run as a script
from torch.func import functional_call, grad, stack_module_state, vmap
from torch.nn.attention import SDPBackend, sdpa_kernel

import ablate_plugins.bias as bias_channels
from ablate import fastpaths
from ablate.components import dropout_keys
from ablate.study.load import load_study
from ablate.training import stacked
from ablate.training.randomness import GlobalStates
from ablate.training.shared_eval import SharedForwards
from ablate.training.trainer import Trainer
from ablate_plugins.seqrec.batches import Batch
from ablate_plugins.seqrec.losses import SeenItems, lookup, sample_negatives

REPO = Path(__file__).resolve().parents[1]
SECTION = "## Packing by stacked parameters, probed"


def members(study, variant: str, data, k: int, device: torch.device) -> list[Trainer]:
    trainers = [Trainer.start(study, study.variants[variant], seed, data, device) for seed in range(k)]
    for trainer in trainers:
        trainer.model.train()
    return trainers


def stacked_loss(skeleton: torch.nn.Module):
    """``loss(params, buffers, items, targets, negatives, keys)`` of one member in fixed shapes
    (vmap): BCE as the task's ``bce`` computes it, its negatives ``[b, n, k]`` drawn beforehand
    at the target positions, the mean taken over those positions by weights (the task selects
    them, a shape vmap cannot follow); ``keys``: the member's dropout keys of this step, in the
    order its forward uses them (None: dropout draws what torch draws)."""

    def loss(params, buffers, items, targets, negatives, keys=None):
        if keys is not None:
            with dropout_keys(keys[i] for i in range(len(keys))):
                return loss(params, buffers, items, targets, negatives)
        rows, width = items.shape
        batch = Batch(
            items=items,
            targets=targets,
            valid=items > 0,
            positions=torch.arange(width, device=items.device).expand(rows, width),  # as collate
            timestamps=None,
            users=items.new_zeros(rows),
        )
        hidden = functional_call(skeleton, (params, buffers), (batch,))  # [b, n, d]
        table = params["items.weight"]
        positive = (hidden * lookup(table, targets)).sum(-1)
        negative = torch.einsum("bnd,bnkd->bnk", hidden, lookup(table, negatives))
        weight = (targets > 0).to(hidden.dtype)
        per_position = F.softplus(-positive) + F.softplus(negative).sum(-1)
        return (per_position * weight).sum() / weight.sum()

    return loss


def padded(batch: Batch, rows: int, width: int, items: int) -> Batch:
    """``batch``'s first ``rows`` rows right-padded to ``width`` columns, as ``collate`` pads (a
    member's batch in the pack's shape; its trial alone reads the same batch); its seen-item
    keys (``row · items + item``) of the rows kept."""
    fill = width - batch.items.shape[1]
    seen = batch.seen[batch.seen < rows * items] if batch.seen is not None else None
    return Batch(
        items=F.pad(batch.items[:rows], (0, fill)),
        targets=F.pad(batch.targets[:rows], (0, fill)),
        valid=F.pad(batch.valid[:rows], (0, fill)),
        positions=torch.arange(width, device=batch.items.device).expand(rows, width).clone(),
        timestamps=None,
        users=batch.users[:rows],
        seen=seen,
    )


def member_negatives(batch: Batch, study, items: int, generator: torch.Generator) -> torch.Tensor:
    """``[b, n, k]`` negatives at ``batch``'s target positions (0 elsewhere), drawn as the task's
    ``bce`` draws them (``sample_negatives``: among the user's unseen items under
    ``exclude_seen``) from the member's generator: the same numbers its trial alone draws."""
    options = study.loss.root
    where = batch.targets > 0
    seen = SeenItems(batch.seen, items, where.nonzero(as_tuple=True)[0]) if batch.seen is not None else None
    drawn = sample_negatives(
        batch.targets[where], items - 1, options.negatives, generator, seen if options.exclude_seen else None
    )
    full = torch.zeros(*batch.targets.shape, options.negatives, dtype=torch.long, device=batch.targets.device)
    full[where] = drawn
    return full


def stacked_batches(batches, k: int, step: int, study, items: int, generators, device):
    """k members' batches of one step (member j takes batch step + j: data orders differ), cut
    to the fewest rows and right-padded to the widest; each member's negatives drawn from its
    generator. Returns the stacked inputs and the members' padded batches."""
    chosen = [batches[(step + j) % len(batches)].to(device) for j in range(k)]
    rows = min(b.items.shape[0] for b in chosen)
    width = max(b.items.shape[1] for b in chosen)
    members_batches = [padded(b, rows, width, items) for b in chosen]
    for b in members_batches:  # the check a member's forward makes, once, outside vmap
        bias_channels.check_positions(b.positions, width)
    pairs = zip(members_batches, generators, strict=True)
    negatives = [member_negatives(b, study, items, g) for b, g in pairs]
    stacked = (
        torch.stack([b.items for b in members_batches]),
        torch.stack([b.targets for b in members_batches]),
        torch.stack(negatives),
    )
    return stacked, members_batches


def keys_per_step(skeleton: torch.nn.Module, params, buffers, inputs) -> int:
    """How many dropout keys one member's step draws (its forward's dropout calls)."""
    drawn = []

    def counted():
        while True:
            drawn.append(0)
            yield 0

    with torch.no_grad(), dropout_keys(counted()):
        stacked_loss(skeleton)(
            {n: p[0] for n, p in params.items()},
            {n: b[0] for n, b in buffers.items()},
            *(t[0] for t in inputs),
        )
    return len(drawn)


def member_keys(generators: list[torch.Generator], count: int, device: torch.device) -> torch.Tensor:
    """``[k, count]`` keys: member j's next ``count`` draws of its generator, one at a time as
    :func:`ablate.components.dropout_key` draws them alone."""
    return torch.tensor(
        [
            [
                int(torch.empty((), dtype=torch.int64).random_(-(2**63), None, generator=g))
                for _ in range(count)
            ]
            for g in generators
        ],
        dtype=torch.int64,
        device=device,
    )


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def seconds_per_step(step, steps: int, device: torch.device) -> float:
    """``step(index)`` timed over ``steps`` calls after one warm-up call."""
    step(0)  # warm-up
    synchronize(device)
    start = time.perf_counter()
    for index in range(steps):
        step(index)
    synchronize(device)
    return (time.perf_counter() - start) / steps


def time_alone(trainer: Trainer, batches: list[Batch], steps: int, device: torch.device) -> float:
    """Seconds per step of one trial alone, the product's step."""
    start = time.perf_counter()
    for step in range(steps):
        trainer.step(batches[step % len(batches)])
    synchronize(device)
    return (time.perf_counter() - start) / steps


def time_stacked(
    study, trainers: list[Trainer], batches, steps: int, device, autocast, attention, lanes: bool
) -> float:
    """Seconds per step of k members stacked; ``attention``: the SDPA backends allowed (None:
    torch's choice; torch has no batching rule for some fused attention backwards: vmap then
    loops over the members); ``lanes``: each member's dropout from its own keys (else torch's)."""
    k = len(trainers)
    skeleton = copy.deepcopy(trainers[0].model).to("meta")
    params, buffers = stack_module_state([t.model for t in trainers])
    optimizer = torch.optim.Adam(list(params.values()), lr=1e-3, betas=(0.9, 0.98))
    gradients = vmap(grad(stacked_loss(skeleton)), randomness="different")
    items = trainers[0].model.num_items + 1
    generators = [torch.Generator(device=device).manual_seed(seed) for seed in range(k)]  # negatives
    keys_from = [torch.Generator().manual_seed(seed) for seed in range(k)] if lanes else None  # dropout
    first, _ = stacked_batches(batches, k, 0, study, items, generators, device)
    count = keys_per_step(skeleton, params, buffers, first) if lanes else 0

    def step(index: int) -> None:
        inputs, _ = stacked_batches(batches, k, index, study, items, generators, device)
        keys = member_keys(keys_from, count, device) if keys_from else None
        with autocast, sdpa_kernel(attention) if attention else contextlib.nullcontext():
            grads = gradients(params, buffers, *inputs, keys)
        for name, p in params.items():
            p.grad = grads[name]
        optimizer.step()

    return seconds_per_step(step, steps, device)


def time_product(study, trainers: list[Trainer], data, batches, steps: int, device) -> tuple[float, str]:
    """Seconds per step of k members through the product's stacked step
    (:class:`ablate.training.stacked.Stacker`: one vmap forward, each member's own loss and
    optimiser), and how its steps ran; member j steps on batch ``step + j`` as in
    :func:`time_stacked`."""
    runs = [SimpleNamespace(study=study, trainer=t, data=data, device=device) for t in trainers]
    stacker, reason = stacked.stacker(runs[0])
    if stacker is None:
        return float("nan"), f"not stacked: {reason}"
    states = [GlobalStates.capture() for _ in trainers]

    def step(index: int) -> None:
        chosen = [batches[(index + j) % len(batches)] for j in range(len(trainers))]
        for result in stacker.step(runs, states, chosen):
            if isinstance(result, Exception):
                raise result

    return seconds_per_step(step, steps, device), ", ".join(f"{n} {c}" for n, c in stacker.steps.items())


def time_evaluations(study, variant: str, data, k: int, device: torch.device) -> tuple[float, float, dict]:
    """One validation of ``k`` members one after another, as a stacked pack's members make it:
    each alone, then with their forwards shared (``SharedForwards``, the product's); seconds each
    (after one untimed pass that caches the split's batches) and the shared pass's counts."""
    models = [trainer.model for trainer in members(study, variant, data, k, device)]
    rows = study.spec.train.eval_rows(device)

    def evaluate_all() -> float:
        synchronize(device)
        start = time.perf_counter()
        for model in models:
            study.task.evaluate(model, data, "valid", study.metrics, device, rows)
        synchronize(device)
        return time.perf_counter() - start

    evaluate_all()
    alone = evaluate_all()
    with SharedForwards(copy.deepcopy(models[0]).to("meta"), models) as shared:
        together = evaluate_all()
    return alone, together, shared.counts


def exactness(study, variant: str, data, k: int, batches) -> tuple[float, int, float]:
    """Float64, dropout on, k ≥ 2 members, each with its own dropout keys and negatives: the
    largest relative difference between a member's stacked gradient and the gradient of its
    trial alone's loss as the task computes it (``task.loss`` on the member's batch, its
    generator, its keys), and between one Adam over the stacked tensors and the member's own
    Adam; the keys a step draws; and the smallest relative difference from a member's gradient
    with another member's keys (that the keys matter: dropout is drawn, and drawn per member)."""
    cpu = torch.device("cpu")
    trainers = members(study, variant, data, k, cpu)
    for trainer in trainers:
        trainer.model.double()
    skeleton = copy.deepcopy(trainers[0].model).to("meta")
    params, buffers = stack_module_state([t.model for t in trainers])
    items = trainers[0].model.num_items + 1
    seeds = range(k)
    inputs, own_batches = stacked_batches(
        batches, k, 0, study, items, [torch.Generator().manual_seed(s) for s in seeds], cpu
    )
    count = keys_per_step(skeleton, params, buffers, inputs)
    keys = member_keys([torch.Generator().manual_seed(100 + s) for s in seeds], count, cpu)
    together = vmap(grad(stacked_loss(skeleton)))(params, buffers, *inputs, keys)

    def alone(j: int, member_keys_: list[int]) -> dict[str, torch.Tensor]:
        """Member j's trial alone: the task's loss on its batch, negatives from its generator."""
        model = trainers[j].model
        model.zero_grad(set_to_none=True)
        with dropout_keys(iter(member_keys_)):
            study.task.loss(model, own_batches[j], study.loss, torch.Generator().manual_seed(j)).backward()
        return {name: p.grad.clone() for name, p in model.named_parameters()}

    def relative(a: dict, b: dict) -> float:
        with torch.no_grad():
            return max(float((a[n] - b[n]).abs().max() / b[n].abs().max().clamp_min(1e-300)) for n in b)

    # One Adam over the stacked tensors is each member's own Adam: its update is element-wise.
    stacked_params = {n: p.detach().clone().requires_grad_() for n, p in params.items()}
    optimizer = torch.optim.Adam(list(stacked_params.values()), lr=1e-3, betas=(0.9, 0.98))
    for name, p in stacked_params.items():
        p.grad = together[name]
    optimizer.step()
    worst, other = 0.0, float("inf")
    for j in range(k):
        own_params = [params[n][j].detach().clone().requires_grad_() for n in params]
        own_optimizer = torch.optim.Adam(own_params, lr=1e-3, betas=(0.9, 0.98))
        for p, name in zip(own_params, params, strict=True):
            p.grad = together[name][j]
        own_optimizer.step()
        for p, name in zip(own_params, params, strict=True):
            worst = max(worst, float((stacked_params[name][j] - p).detach().abs().max()))
        mine = {name: g[j] for name, g in together.items()}
        worst = max(worst, relative(mine, alone(j, [int(key) for key in keys[j]])))
        other = min(other, relative(mine, alone(j, [int(key) for key in keys[(j + 1) % k]])))
    return worst, count, other


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--study", default="studies/sasrec_ml1m.yaml")
    parser.add_argument("--variant", default="base")
    parser.add_argument("--k", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument(
        "--attention",
        default="auto",
        choices=["auto", "math"],
        help="SDPA backends, with --dropout torch (with lanes, attention is ablate's own bmm path)",
    )
    parser.add_argument(
        "--dropout",
        default="lanes",
        choices=["lanes", "torch"],
        help="lanes: each member its own keys (what a packed member needs); torch: vmap's own draws",
    )
    parser.add_argument("--exact", type=int, default=3, help="members in the exactness check (0: none)")
    parser.add_argument("--no-eval", action="store_true", help="skip the validations alone and shared")
    parser.add_argument("--note", default="")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    study = load_study(REPO / args.study)
    # Plain batches: micro-batches are the CPU's streams; the stacked step is one stream.
    train = study.spec.train.model_copy(update={"micro_batches": 1, "precision": args.precision})
    study.spec = study.spec.model_copy(update={"train": train})
    data = study.task.load()
    attention = None if args.attention == "auto" else [SDPBackend.MATH]
    lanes = args.dropout == "lanes"
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.precision == "bf16")
    load_before = os.getloadavg()[0]
    worst = count = other = None
    if args.exact:
        probe = members(study, args.variant, data, 1, torch.device("cpu"))[0]
        first = list(itertools.islice(probe.batches(data), 4))
        worst, count, other = exactness(study, args.variant, data, args.exact, first)
        print(
            f"exactness: largest relative gradient difference {worst:.2e} ({count} keys a step; "
            f"another member's keys: {other:.2e})",
            file=sys.stderr,
        )
    alone_trainer = members(study, args.variant, data, 1, device)[0]
    batches = [b.to(device) for b in itertools.islice(alone_trainer.batches(data), args.steps + 2)]
    time_alone(alone_trainer, batches, 2, device)  # warm-up
    rows, alone_times = [], []
    stacked_times: dict[int, list[float]] = {k: [] for k in args.k}
    product_times: dict[int, list[float]] = {k: [] for k in args.k}
    product_steps: dict[int, str] = {}
    for _ in range(args.reps):
        alone_times.append(time_alone(alone_trainer, batches, args.steps, device))
        # The fused CPU kernels do not run under vmap: their torch forms draw the same lanes.
        with fastpaths.fast_paths(kernels=False) if lanes else fastpaths.fast_paths(False):
            for k in args.k:
                trainers = members(study, args.variant, data, k, device)
                timing = (args.steps, device, autocast, attention, lanes)
                seconds = time_stacked(study, trainers, batches, *timing)
                stacked_times[k].append(seconds)
                del trainers
            for k in args.k:  # the product's stacked step: its own fast-path switches
                trainers = members(study, args.variant, data, k, device)
                seconds, product_steps[k] = time_product(study, trainers, data, batches, args.steps, device)
                product_times[k].append(seconds)
                del trainers
        print(
            f"alone {alone_times[-1] * 1000:.1f} ms; stacked "
            + ", ".join(f"k={k} {v[-1] * 1000:.1f} ms" for k, v in stacked_times.items())
            + "; product "
            + ", ".join(f"k={k} {v[-1] * 1000:.1f} ms" for k, v in product_times.items()),
            file=sys.stderr,
        )
    evaluated = [] if args.no_eval else args.k
    evaluations = [(k, *time_evaluations(study, args.variant, data, k, device)) for k in evaluated]
    for k, alone_s, shared_s, counts in evaluations:
        print(f"validation of {k}: alone {alone_s:.2f} s, shared {shared_s:.2f} s {counts}", file=sys.stderr)
    alone = statistics.median(alone_times)
    rows.append(
        f"| one trial alone (`Trainer.step`) | 1 | {' / '.join(f'{t * 1000:.1f}' for t in alone_times)} "
        f"| {alone * 1000:.1f} | {1 / alone:.2f} | 1.00× |"
    )
    for k, times in stacked_times.items():
        median = statistics.median(times)
        rows.append(
            f"| stacked, `vmap(grad)` + one Adam | {k} | {' / '.join(f'{t * 1000:.1f}' for t in times)} "
            f"| {median * 1000:.1f} | {k / median:.2f} | {k * alone / median:.2f}× |"
        )
    for k, times in product_times.items():
        median = statistics.median(times)
        rows.append(
            f"| product's stacked step (`Stacker.step`; {product_steps[k]}) | {k} | "
            f"{' / '.join(f'{t * 1000:.1f}' for t in times)} | {median * 1000:.1f} | {k / median:.2f} | "
            f"{k * alone / median:.2f}× |"
        )
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu()
    section = "\n".join(
        [
            SECTION,
            "",
            f"`python benchmarks/stacked.py --study {args.study} --variant {args.variant} --k "
            f"{' '.join(map(str, args.k))} --steps {args.steps} --reps {args.reps} --threads {args.threads} "
            f"--device {args.device} --precision {args.precision} --attention {args.attention} "
            f"--dropout {args.dropout}` — "
            f"{date.today()}, {where}, torch "
            f"{torch.__version__}; plain batches of {study.spec.train.batch_size}, {args.steps} steps a "
            f"repetition. Load average (1 min) {load_before:.1f} before, {os.getloadavg()[0]:.1f} after. "
            f"{args.note}".rstrip(),
            "",
            "| how | members | ms per step, by repetition | median ms | member-steps/s | × alone |",
            "|---|---:|---|---:|---:|---:|",
            *rows,
            "",
            *(
                [
                    "One validation of k members one after another (the split's batches cached by an "
                    "untimed pass), each alone and with their forwards shared (`SharedForwards`):",
                    "",
                    "| members | alone s | shared s | × | forwards stacked / shared / own |",
                    "|---:|---:|---:|---:|---|",
                    *(
                        f"| {k} | {a:.2f} | {b:.2f} | {a / b:.2f}× | "
                        f"{c['stacked']} / {c['shared']} / {c['own']} |"
                        for k, a, b, c in evaluations
                    ),
                    "",
                ]
                if evaluations
                else []
            ),
            *(
                [
                    f"Exactness (float64, dropout on, each member its own keys, {args.exact} members): "
                    f"{count} dropout keys a step; largest relative difference "
                    f"between a member's stacked gradient and its gradient alone, and between one stacked "
                    f"Adam step and the member's own, {worst:.2e} (alone with another member's keys: "
                    f"{other:.2e}).",
                    "",
                ]
                if worst is not None
                else []
            ),
        ]
    )
    publish(SECTION, section, write=not args.no_write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

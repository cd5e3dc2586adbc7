"""Members stacked: one training step for several seeds of a pack, their parameters stacked along a
leading axis and the model's forward run once for all of them under ``torch.vmap`` — on a GPU,
where a trial alone is bound by kernel launches (issue 57), one launch then serves every member.

What stays each member's own, so that it is the trial it would have been alone:
- its batch and data order (its trainer's generator): the fields all members have in one shape
  are stacked; one they differ in is left out, and a forward that reads it runs that step (and
  every later one where it differs) member by member;
- its dropout draws: before the step, each member draws the keys its forward takes, in the order
  it takes them, from its own global states (:func:`~ablate.components.dropout_key`), and the
  stacked forward's dropout reads each member's keys (:func:`~ablate.components.dropout_keys`:
  the counter-based lanes a trial alone draws on the CPU; on a GPU a trial alone uses torch's
  dropout, so there a member's draws are its own but not those of its run alone);
- its loss: the task's own ``loss`` on its own batch and generator (sampled negatives), the
  model's output read from the stacked forward (:class:`_MemberLoss`), its head and tables from
  the member's slice of the stacked parameters;
- its update: its gradients are its slices of the stacked gradients (a loss that is not finite
  ends that member alone), then its own trainer's clipping, optimiser and schedule.
The forward runs the kernels' torch forms (the fused CPU kernels cannot run under ``vmap``); with
``train.compile`` the ``vmap`` forward is compiled whole (:mod:`ablate.training.compiled`). A
model stacks where a probe step on copies runs: padded layouts (not fbgemm's jagged ops), no
auxiliary losses, no epoch or stage hooks, no random draw other than dropout's in the forward;
elsewhere :func:`stacker` says why not and the pack's members take turns. A member steps on its
whole batch (``train.micro_batches`` parts run one after another on a GPU anyway; on the CPU,
where they are streams, micro-batched members do not stack).
"""

from __future__ import annotations

import copy
import dataclasses
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call

from ablate import fastpaths
from ablate.components import Component, dropout_generator, dropout_key, dropout_keys, has_auxiliary_losses
from ablate.errors import first_line
from ablate.tasks import Task
from ablate.training.compiled import compiled, torch_mode
from ablate.training.randomness import GlobalStates
from ablate.training.trainer import Trainer, TrialRun


class _MemberLoss(nn.Module):
    """A member's loss as its task computes it alone, with the model's forward answered by the
    stacked forward's output for the member (the task calls ``model(batch)`` once, on the batch
    it was given); run through ``functional_call`` with the member's slices of the stacked
    parameters, so that the head and tables the loss reads carry the gradient there too."""

    def __init__(self, model: nn.Module, trainer: Trainer):
        super().__init__()
        self.model, self.trainer = model, trainer

    def forward(self, batch: Any, output: Tensor) -> Tensor:
        def answer(*args: Any, **kwargs: Any) -> Tensor:
            if len(args) != 1 or args[0] is not batch or kwargs:
                raise RuntimeError("the task's loss calls its model other than once on its batch")
            return output

        self.model.forward = answer  # an instance attribute: nn.Module.__call__ reads it first
        try:
            trainer = self.trainer
            return trainer.study.task.loss(self.model, batch, trainer.study.loss, trainer.generator)
        finally:
            del self.model.forward


def _fields(batch: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(batch):
        return {f.name: getattr(batch, f.name) for f in dataclasses.fields(batch)}
    return {"": batch}


def _rebuild(template: Any, fields: dict[str, Tensor]) -> Any:
    return fields[""] if "" in fields else dataclasses.replace(template, **fields)


def same_value(a: Any, b: Any) -> bool:
    """Whether two values (batch fields, forward inputs) are equal: tensors element for element,
    dataclasses field by field, sequences and mappings item by item, anything else by ``==``
    (an array's elementwise answer, not one truth value: unequal)."""
    if isinstance(a, Tensor) or isinstance(b, Tensor):
        return (
            isinstance(a, Tensor)
            and isinstance(b, Tensor)
            and (a.shape, a.dtype, a.device) == (b.shape, b.dtype, b.device)
            and torch.equal(a, b)
        )
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        return type(a) is type(b) and all(
            same_value(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a)
        )
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same_value, a, b))
    if isinstance(a, dict):
        return type(b) is dict and a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    if a is b:
        return True
    try:
        return bool(a == b)
    except (TypeError, ValueError):
        return False


class FieldNotStacked(RuntimeError):
    """The stacked forward read a batch field that differs between the members."""

    def __init__(self, name: str):
        super().__init__(f"the forward reads the batch's '{name}', which differs between the members")
        self.name = name


def _field_read(exc: BaseException | None) -> FieldNotStacked | None:
    """The :class:`FieldNotStacked` behind ``exc`` (dynamo wraps one raised in a compiled forward)."""
    while exc is not None and not isinstance(exc, FieldNotStacked):
        exc = exc.__cause__ or exc.__context__
    return exc


class _Unstacked:
    """A batch field that differs between the members, in the stacked forward's input in its place:
    any use of it raises :class:`FieldNotStacked` (the step then runs in turns), so a forward that
    reads it can never take it for absent (``None`` could send it down another path)."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        object.__setattr__(self, "name", name)

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise FieldNotStacked(object.__getattribute__(self, "name"))

    __getattr__ = __bool__ = __len__ = __iter__ = __eq__ = __ne__ = __index__ = __float__ = __int__ = _refuse
    __getitem__ = __add__ = __radd__ = __mul__ = __rmul__ = __sub__ = __rsub__ = __truediv__ = _refuse
    __hash__ = object.__hash__


@contextmanager
def quiet_fallbacks() -> Iterator[None]:
    """vmap's warning that an op without a batching rule (the CPU's flash attention) runs member
    by member: slower, not wrong, and said at every stacked forward's first use of it."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="There is a performance drop")
        yield


class Stacker:
    """The stacked step of a pack's members (built by :func:`stacker`); ``keys``: the dropout
    keys one member's forward takes."""

    def __init__(self, skeleton: nn.Module, keys: int, mode: str | None = None):
        self.skeleton, self.keys = skeleton, keys
        # train.compile: torch.compile's mode around the vmap (ablate.training.compiled); None: eager.
        self.forward = compiled(stacked_forward, mode, str(skeleton)) if mode else stacked_forward
        self.graphs = mode == "reduce-overhead"  # CUDA graphs: each step's replay begins anew
        self.steps = {"stacked": 0, "in turns": 0}  # the pack's steps, by how they ran
        self.error: Exception | None = None  # why the last stacked forward could not run
        self.finite: list[bool | None] = []  # each member's loss finite in the last step (None: unread)
        self.read: set[str] = set()  # batch fields the forward was found to read (see stack)

    def stack(self, batches: Sequence[Any]) -> tuple[Any, dict[str, Tensor]] | None:
        """The members' batches as one stacked input: the fields every member has as a tensor of
        one shape, stacked; a field alike in every member (None, a number) as it is; one that
        differs (a per-row list of seen items, token tensors of other widths) replaced by a value
        whose use raises — the forward's first read of it sends the step to run in turns, and
        later steps where it differs run so at once (``self.read``). None: run in turns."""
        first = _fields(batches[0])
        stacked, template = {}, {}
        for name, value in first.items():
            values = [_fields(b)[name] for b in batches]
            if isinstance(value, Tensor) and all(
                isinstance(v, Tensor) and v.shape == value.shape and v.dtype == value.dtype for v in values
            ):
                stacked[name] = torch.stack(values)
            elif not all(same_value(v, value) for v in values):
                if name in self.read or name == "":
                    return None
                template[name] = _Unstacked(name)
        base = dataclasses.replace(batches[0], **template) if template else batches[0]
        return base, stacked

    def outputs(
        self,
        params: dict[str, Tensor],
        aliases: dict[str, str],
        buffers: dict[str, Tensor],
        stacked: tuple[Any, dict],
        keys: Tensor,
    ) -> Tensor:
        """The members' model outputs ``[k, ...]`` from one forward under ``vmap``; ``aliases``:
        every parameter's name → the name it is stacked under."""
        self.skeleton.train()
        if self.graphs:
            torch.compiler.cudagraph_mark_step_begin()  # the last step's graph outputs are spent
        with fastpaths.fast_paths(kernels=False), quiet_fallbacks():
            return self.forward(self.skeleton, aliases, self.keys, params, buffers, stacked, keys)

    def _in_turns(self, runs: Sequence[TrialRun], states: Sequence[GlobalStates], batches: Sequence[Any]):
        self.finite = [None] * len(runs)  # each run's own step reads its loss
        return [_alone(run, state, batch) for run, state, batch in zip(runs, states, batches, strict=True)]

    def step(self, runs: Sequence[TrialRun], states: Sequence[GlobalStates], batches: Sequence[Any]):
        """One step of every run on its batch; returns each run's loss (detached) or the exception
        that ended it, in order. Batches of different shapes: each run steps alone, in turns."""
        stacked = self.stack(batches)
        self.steps["in turns" if stacked is None else "stacked"] += 1
        if stacked is None:
            return self._in_turns(runs, states, batches)
        models = [run.trainer.model for run in runs]
        # Each member's keys from its own CPU random state, as it draws them alone; the state moves on
        # once the forward has run (else the step runs in turns, drawing them itself).
        generators = [state.cpu_generator() for state in states]
        keys = []
        for generator in generators:
            with dropout_generator(generator):
                keys.append([int(dropout_key()) for _ in range(self.keys)])
        device = next(models[0].parameters()).device
        key_tensor = torch.tensor(keys, dtype=torch.int64, device=device).reshape(len(runs), self.keys)
        aliases, params, buffers = stack_weights(models, grad=True)
        names = list(params)
        autocast = runs[0].trainer.autocast
        try:
            with autocast:
                outputs = self.outputs(params, aliases, buffers, stacked, key_tensor)
        except Exception as exc:  # noqa: BLE001 - a forward vmap cannot run (found by the probe, else here)
            read = _field_read(exc)
            if read is not None:
                self.read.add(read.name)
            self.error = exc
            self.steps["stacked"] -= 1
            self.steps["in turns"] += 1
            return self._in_turns(runs, states, batches)
        for state, generator in zip(states, generators, strict=True):
            state.take_cpu(generator)
        losses: list[Tensor | Exception] = []
        for j, (run, state, batch) in enumerate(zip(runs, states, batches, strict=True)):
            run.trainer.optimizer.zero_grad(set_to_none=True)
            own = {f"model.{n}": params[n][j] for n in names}
            try:
                with state.active(), autocast:
                    losses.append(
                        functional_call(_MemberLoss(models[j], run.trainer), own, (batch, outputs[j]))
                    )
            except Exception as exc:  # noqa: BLE001 - one member fails alone
                losses.append(exc)
        # Every member's finiteness read at once: on a GPU one synchronisation a step, not one a member.
        computed = [j for j, loss in enumerate(losses) if isinstance(loss, Tensor)]
        flags = torch.stack([losses[j].detach() for j in computed]).isfinite().tolist() if computed else []
        self.finite = [False] * len(runs)
        for j, flag in zip(computed, flags, strict=True):
            self.finite[j] = flag
        if any(self.finite):
            torch.stack(
                [loss for loss, flag in zip(losses, self.finite, strict=True) if flag]
            ).sum().backward()
        for j, (run, batch, loss) in enumerate(zip(runs, batches, losses, strict=True)):
            if self.finite[j]:
                for n in names:
                    grad = params[n].grad
                    models[j].get_parameter(n).grad = None if grad is None else grad[j]
                run.trainer.update(batch)
                losses[j] = loss.detach()
            elif isinstance(loss, Tensor):
                losses[j] = loss.detach()
        return losses


def stacked_forward(
    skeleton: nn.Module,
    aliases: dict[str, str],
    count: int,
    params: dict[str, Tensor],
    buffers: dict[str, Tensor],
    stacked: tuple[Any, dict],
    keys: Tensor,
) -> Tensor:
    """:meth:`Stacker.outputs`' ``vmap`` of ``skeleton``'s forward (what ``train.compile`` compiles
    whole); ``count``: the dropout keys a member's forward takes."""
    template, fields = stacked

    def forward(params, buffers, fields, keys):
        # Tied names expanded inside vmap: one tensor object under every name (the shared
        # tables' per-forward memo is keyed by it).
        named = {alias: params[name] for alias, name in aliases.items()}
        with dropout_keys(keys[i] for i in range(count)):
            return functional_call(skeleton, (named, buffers), (_rebuild(template, fields),))

    return torch.vmap(forward)(params, buffers, fields, keys)


def stack_weights(
    models: Sequence[nn.Module], grad: bool
) -> tuple[dict[str, str], dict[str, Tensor], dict[str, Tensor]]:
    """The members' weights stacked along a leading axis: every parameter's name → the name it
    is stacked under (a parameter tied across modules, as tables every block shares, is one
    stacked tensor under all its names: the skeleton's copy on the meta device does not keep the
    ties), the stacked parameters (``grad``: needing gradients where the members' do) and buffers."""
    first: dict[int, str] = {}
    aliases = {n: first.setdefault(id(p), n) for n, p in models[0].named_parameters(remove_duplicate=False)}
    params = {
        n: torch.stack([m.get_parameter(n).detach() for m in models]).requires_grad_(
            grad and models[0].get_parameter(n).requires_grad
        )
        for n in first.values()
    }
    buffers = {n: torch.stack([m.get_buffer(n) for m in models]) for n, _ in models[0].named_buffers()}
    return aliases, params, buffers


def _alone(run: TrialRun, state: GlobalStates, batch: Any) -> Tensor | Exception:
    try:
        with state.active():
            return run.trainer.step(batch)
    except Exception as exc:  # noqa: BLE001 - one member fails alone
        return exc


def stacker(run: TrialRun) -> tuple[Stacker | None, str]:
    """A :class:`Stacker` for ``run``'s pack, or None and why the pack's members cannot stack:
    a probe step of two copies of its model (throwaway generators and batch; the process's
    global random states left as they were)."""
    study, model = run.study, run.trainer.model
    if study.spec.train.micro_batches != 1 and run.device.type == "cpu":
        # On a GPU a trial's micro-batches run one after another anyway, so members step whole
        # batches there; on the CPU that would change their draws against their trials alone.
        return None, "train.micro_batches is above 1 (on the CPU its parts run as streams instead)"
    if has_auxiliary_losses(model):
        return None, "the model has auxiliary losses"
    if changes_between_epochs(study.task, model):
        return None, "the model changes between epochs (a component's or the task's epoch hook)"
    before = GlobalStates.capture()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # vmap's fallbacks warn: the reason is the one line said
            return _probe(run)
    except Exception as exc:  # noqa: BLE001 - whatever vmap cannot run, the members take turns
        return None, first_line(exc)
    finally:
        before.restore()


def _probe(run: TrialRun) -> tuple[Stacker | None, str]:
    """:func:`stacker`'s probe: the dropout keys one forward takes, counted, then one stacked step."""
    drawn: list[int] = []

    def counted() -> Iterator[int]:
        while True:
            drawn.append(0)
            yield 0

    model = run.trainer.model
    copies = [
        Trainer(run.study, copy.deepcopy(model), torch.Generator().manual_seed(s), run.device) for s in (0, 1)
    ]
    batch = next(iter(copies[0].batches(run.data))).to(run.device)
    copies[0].model.train()
    with torch.no_grad(), dropout_keys(counted()), fastpaths.fast_paths(kernels=False):
        copies[0].model(batch)
    mode = torch_mode(run.study.spec.train.compile, run.device)
    found = Stacker(copy.deepcopy(model).to("meta"), len(drawn), mode)
    probes = [_Probe(trainer, run) for trainer in copies]
    results = found.step(probes, [GlobalStates.capture() for _ in copies], [batch, batch])
    failed = [r for r in results if isinstance(r, Exception)] + ([found.error] if found.error else [])
    if failed:
        return None, first_line(failed[0])
    found.steps["stacked"] = 0
    return found, ""


def changes_between_epochs(task: Task, model: nn.Module) -> bool:
    """Whether the task or a component of ``model`` has an epoch or stage hook of its own (a
    topology frozen after k epochs): one member's structure would then not be every member's."""
    hooks = ("epoch_end", "stage_end")
    own = any(
        getattr(type(m), hook) is not getattr(Component, hook)
        for m in model.modules()
        if isinstance(m, Component)
        for hook in hooks
    )
    return own or type(task).on_epoch_end is not Task.on_epoch_end


class _Probe:
    """A stand-in :class:`TrialRun` for :func:`stacker`'s probe step: a trainer and the study."""

    def __init__(self, trainer: Trainer, run: TrialRun):
        self.trainer, self.study = trainer, run.study


def train_stacked(active: Sequence[Any], stacker: Stacker) -> None:
    """The active members' next training epoch, step by step, their steps stacked; a member is
    any object with ``run`` (a :class:`TrialRun`), ``states`` and ``failure`` (``packed.Member``).
    Members whose batches run out finish their epoch; one whose step fails ends alone."""
    iterators = {id(m): iter(m.run.begin_epoch()) for m in active}
    going = list(active)
    while going:
        batches, stepping = [], []
        for member in going:
            batch = next(iterators[id(member)], None)
            if batch is None:
                member.run.finish_epoch()
            else:
                batches.append(batch.to(member.run.device))
                stepping.append(member)
        if not stepping:
            return
        results = stacker.step([m.run for m in stepping], [m.states for m in stepping], batches)
        going = []
        for member, result, finite in zip(stepping, results, stacker.finite, strict=True):
            if isinstance(result, Exception):
                member.failure = result
                continue
            try:
                member.run.stepped(result, finite)
            except Exception as exc:  # noqa: BLE001 - a loss that is not finite ends this member alone
                member.failure = exc
                continue
            going.append(member)

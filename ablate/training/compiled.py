"""``train.compile``: a trial's training forward under ``torch.compile`` (issue 57: a step without
launch overhead on a GPU). ``default`` runs inductor's fused kernels; ``reduce-overhead`` replays
them as CUDA graphs (one launch a graph), on CUDA only: on another device it compiles as
``default`` (``ablate validate`` says so).

What is compiled is the part of a step that torch traces whole, as one graph with no break: a
trial alone's backbone (:class:`~ablate.model.blocks.Backbone`, the blocks the core builds), on the
token context its task built outside (:class:`CompiledForward`); a stacked pack's ``vmap`` forward of
the whole model (:mod:`ablate.training.stacked`). The task's embedding and loss, the backward's
eager rest and the optimiser run around it. So that the graph draws nothing and reads no value:

- dropout takes keys drawn before the compiled call from the generator it would draw them from, in
  the order its forward takes them (:func:`~ablate.components.key_source`), so that a compiled
  trial draws the counter-based lanes of its eager self on the CPU (on a GPU, where a trial alone
  uses torch's dropout, a compiled one draws lanes, as a stacked member does). The keys a forward
  takes are counted at its first call, which runs eager. A component that draws from that
  generator itself inside the forward (DUET's Gumbel mask) takes other draws when compiled, as
  the keys come first: a different random stream;
- the fused C kernels (ctypes calls, which dynamo cannot trace) give way to their torch forms inside
  the graph (:func:`ablate.kernels.library`), which draw the same lanes and which inductor fuses;
  the eager rest of the step keeps them;
- values are not read inside it (:func:`~ablate.components.values_readable`): the positions'
  range check runs at the first, eager call, and inductor's own bounds checks stop a later index
  outside its table.

Dynamo keeps at most 8 graphs per function (shapes, autocast, …): one compiled function per mode,
model structure and torch thread count (inductor's CPU kernels are made for the count they are
compiled under: a micro-batched step's parts run single-threaded, :mod:`ablate.training.parts`), so
each has its own 8, and a later trial of a structure this process compiled before compiles nothing.
"""

from __future__ import annotations

import hashlib
import types
from collections.abc import Callable, Iterator
from functools import cache
from typing import Any

import torch
from torch import Tensor, nn

from ablate.components import dropout_keys, key_source
from ablate.model.blocks import Backbone


def torch_mode(setting: str, device: torch.device) -> str | None:
    """``torch.compile``'s mode for ``train.compile: setting`` on ``device``; None: eager.
    CUDA graphs (``reduce-overhead``) need a CUDA device: elsewhere ``default``."""
    if setting == "off":
        return None
    return setting if torch.device(device).type == "cuda" else "default"


def compiled(function: Callable, mode: str, structure: str) -> Callable:
    """``torch.compile(function, mode=mode)`` for models of one ``structure`` (their text) at this
    thread's torch thread count: a copy of ``function``'s code of its own, so that dynamo's graphs
    for it are its own."""
    return _compiled(function, mode, structure, torch.get_num_threads())


@cache
def _compiled(function: Callable, mode: str, structure: str, threads: int) -> Callable:
    # Dynamo keeps its graphs on the code object, and which sizes it found to vary under the code's
    # name (torch's "PGO", kept on disk too): a copy named for what it is compiled for keeps both
    # apart (a micro-batched step's varying widths would otherwise make a plain step's graph dynamic).
    digest = hashlib.sha256(f"{mode}|{threads}|{structure}".encode()).hexdigest()[:12]
    name = f"{function.__name__}_{digest}"
    code = function.__code__.replace(co_name=name, co_qualname=name)
    own = types.FunctionType(code, function.__globals__, name, function.__defaults__)
    return torch.compile(own, mode=mode)


def _keyed(module: nn.Module, keys: Tensor, args: tuple, kwargs: dict[str, Any]) -> Any:
    """``module``'s own forward with dropout's keys ``keys [c]`` supplied: what is compiled."""
    with dropout_keys(iter(keys.unbind())):
        return type(module).forward(module, *args, **kwargs)


def _taking(source: Iterator[Any], taken: list[Any]) -> Iterator[Any]:
    for key in source:
        taken.append(key)
        yield key


class CompiledForward:
    """While entered (:meth:`ablate.training.trainer.Trainer.step`), every
    :class:`~ablate.model.blocks.Backbone` in ``model`` answers its calls through its compiled
    forward, with the keys its dropout takes drawn before (its first call eager: the keys counted)."""

    def __init__(self, model: nn.Module, mode: str):
        self.mode = mode
        self.backbones = [m for m in model.modules() if isinstance(m, Backbone)]
        self.keys: dict[int, int] = {}  # keys a forward takes, by backbone (id)
        self.functions: dict[tuple[int, int], Callable] = {}  # by backbone (id) and thread count

    def __enter__(self) -> CompiledForward:
        if self.mode == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()  # the last step's graph outputs are spent
        for backbone in self.backbones:
            backbone.forward = self._answer(backbone)  # an instance attribute: nn.Module.__call__ reads it
        return self

    def __exit__(self, *exc: object) -> None:
        for backbone in self.backbones:
            del backbone.forward

    def _answer(self, backbone: nn.Module) -> Callable[..., Any]:
        def forward(*args: Any, **kwargs: Any) -> Any:
            source = key_source()
            count = self.keys.get(id(backbone))
            if count is None:  # eager, its keys counted as they are drawn
                taken: list[Any] = []
                with dropout_keys(_taking(source, taken)):
                    out = type(backbone).forward(backbone, *args, **kwargs)
                self.keys[id(backbone)] = len(taken)
                return out
            drawn = [int(next(source)) for _ in range(count)]
            keys = torch.tensor(drawn, dtype=torch.int64, device=args[0].device)  # args[0]: the tokens x
            which = (id(backbone), torch.get_num_threads())  # parts in streams: 1 thread each
            if which not in self.functions:
                self.functions[which] = compiled(_keyed, self.mode, str(backbone))
            return self.functions[which](backbone, keys, args, kwargs)

        return forward

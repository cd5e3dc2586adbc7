"""Fused CPU kernels, compiled from C on first use with the machine's C compiler.

* ``dropout``: inverted dropout in one pass forward and one backward (dropout.c), where torch's
  form draws a mask, compares, converts it and multiplies; the mask is never stored, the backward
  pass regenerates it.
* ``softmax_dropout``: a causal mask, softmax and dropout over attention logits in one pass per
  row forward and one backward (softmax_dropout.c), where torch makes about eight passes over
  the ``[b, h, n, n]`` probabilities and over the masked upper triangle too.
* ``sinkhorn``: Sinkhorn-Knopp normalisation of many small square matrices, one matrix at a time
  in cache forward and backward (sinkhorn.c), where torch's form makes four passes over the whole
  batch per iteration and autograd keeps every iterate.
* ``mix_in``, ``mix_out``: hyper-connection stream mixing per token (streams.c), where torch
  runs one tiny batched matrix product per token.
* ``gathered_dot``: each row's dot products with its own gathered table rows (gathered.c), where
  torch materialises the ``[t, k, d]`` gathered vectors or scores the whole table.

The first two draw their dropout from counter-based lanes (lanes.h, and :mod:`.lanes` in torch
ops): an entry's draw is a function of a key and its index, so the fused and unfused forms keep
exactly the same entries.

Each op here is the one function its callers call: it runs the kernel where one applies (CPU
tensors of a dtype it has, the library built, the ``kernels`` fast path on:
:mod:`ablate.fastpaths`, not inside a ``torch.compile`` trace) and its torch form
(:mod:`.unfused`) otherwise. The library is
compiled on first use with ``$CC`` or ``cc`` and cached in a private folder under
:func:`ablate.cache.cache_dir` (where parsed data sets are cached too); whatever keeps it from
being built or loaded, the torch forms run, after one warning line (:mod:`.build`).

A foundation: it imports ``cache`` and ``fastpaths`` only, so that plugins may import it.
"""

from __future__ import annotations

import ctypes
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path

import torch
from torch import Tensor

from ablate import fastpaths
from ablate.cache import cache_dir
from ablate.kernels import build, unfused

HERE = Path(__file__).parent
SOURCES = [HERE / f"{name}.c" for name in ("softmax_dropout", "dropout", "sinkhorn", "streams", "gathered")]
HEADERS = [HERE / "lanes.h", HERE / "vector_math.h"]
_C_TYPES = {torch.float32: "float", torch.float64: "double"}  # kernels made for both
_DROPOUT_DTYPES = {torch.float32: "dropout_float32", torch.bfloat16: "dropout_bfloat16"}
_BUILDING = threading.Lock()  # parallel loss parts' first calls: one build


def folder() -> Path:
    """Where the library is built: this user's own folder in the cache."""
    return cache_dir() / f"kernels-{os.getuid()}"


@cache
def _built() -> ctypes.CDLL | None:
    with _BUILDING:
        return build.load(SOURCES, HEADERS, folder())


def library() -> ctypes.CDLL | None:
    """The compiled kernels, or None (the ``kernels`` fast path off, no library: no working C
    compiler, an unsafe cache folder, ..., or while ``torch.compile`` traces: ctypes calls cannot be
    traced, the torch forms are, with the same draws). Built on the first call that wants it."""
    if torch.compiler.is_compiling():
        return None
    return _built() if fastpaths.enabled("kernels") else None


@cache
def _pool(threads: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(threads, thread_name_prefix="ablate-kernel")


def _run(function, pointers: list[int], count: int, parts: int, args: list) -> None:
    """``function(*pointers, lo, hi, *args)`` over ``[0, count)`` (matrices or entries) in at most
    ``parts`` pieces, one per torch intra-op thread (ctypes releases the GIL, so they run in
    parallel)."""
    threads = max(1, min(torch.get_num_threads(), parts))
    bounds = [count * i // threads for i in range(threads + 1)]
    calls = [[*pointers, lo, hi, *args] for lo, hi in zip(bounds, bounds[1:], strict=False)]
    if threads == 1:
        function(*calls[0])
        return
    for future in [_pool(threads).submit(function, *call) for call in calls]:
        future.result()


def _unsigned(key: int) -> int:
    return key & (2**64 - 1)


def _typed(name: str, tensors: list[Tensor], count: int, grain: int, args: list) -> None:
    """Run kernel ``name`` for the first tensor's dtype (``name_float``, ``name_double``) over
    ``count`` items, one part per ``grain`` items at most; ``tensors`` contiguous, in the
    kernel's argument order."""
    function = getattr(library(), f"{name}_{_C_TYPES[tensors[0].dtype]}")
    _run(function, [t.data_ptr() for t in tensors], count, count // grain + 1, args)


class _SoftmaxDropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: Tensor, lanes: tuple, threshold: int, scale: float, offset: int, causal: bool):
        matrices, rows, m = logits.shape
        y, out = torch.empty_like(logits), torch.empty_like(logits)
        key, *strides = lanes  # signed until here: the profiler records apply()'s arguments as int64
        args = [rows, m, offset, int(causal), _unsigned(key), *strides, threshold, scale]
        pointers = [t.data_ptr() for t in (logits, y, out)]
        _run(library().softmax_dropout_forward, pointers, matrices, matrices, args)
        ctx.save_for_backward(y)
        ctx.args = args
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        (y,) = ctx.saved_tensors
        grad = grad.contiguous()
        grad_logits = torch.empty_like(y)
        pointers = [t.data_ptr() for t in (grad, y, grad_logits)]
        _run(library().softmax_dropout_backward, pointers, y.shape[0], y.shape[0], ctx.args)
        return grad_logits, None, None, None, None, None


def softmax_dropout(
    logits: Tensor,
    key: int,
    lane_strides: tuple[int, int, int],
    threshold: int,
    scale: float,
    offset: int = 0,
    causal: bool = True,
) -> Tensor:
    """``where(lane ≥ threshold, softmax(logits masked causally) · scale, 0)`` for ``logits [r,
    rows, m]``; row ``i`` sees keys ``j ≤ offset + i`` when ``causal``. Entry ``[b, i, j]`` draws
    lane ``base + b · matrix_stride + i · row_stride + j`` of ``key`` (``lane_strides = (base,
    matrix_stride, row_stride)``: where these logits sit in the whole probabilities the lanes
    number). The kernel computes in float32 (bfloat16 and float16 logits widened, the result
    in their dtype); float64 logits, kept for reference checks, take the torch form."""
    if logits.device.type != "cpu" or logits.dtype == torch.float64 or library() is None:
        return unfused.softmax_dropout(logits, key, lane_strides, threshold, scale, offset, causal)
    wide = logits.float().contiguous()
    out = _SoftmaxDropout.apply(wide, (key, *lane_strides), threshold, scale, offset, causal)
    return out.to(logits.dtype)


# Entries per thread below which splitting a dropout call costs more than it saves.
_DROPOUT_GRAIN = 1 << 16


class _Dropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, key: int, threshold: int, scale: float):
        ctx.args = [_unsigned(key), threshold, scale]
        return _dropout(x.contiguous(), ctx.args)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return _dropout(grad.contiguous(), ctx.args), None, None, None


def _dropout(x: Tensor, args: list) -> Tensor:
    out = torch.empty_like(x)
    function = getattr(library(), _DROPOUT_DTYPES[x.dtype])
    _run(function, [x.data_ptr(), out.data_ptr()], x.numel(), x.numel() // _DROPOUT_GRAIN + 1, args)
    return out


def dropout(x: Tensor, key: int, threshold: int, scale: float) -> Tensor:
    """``where(lane ≥ threshold, x · scale, 0)``, entry ``i`` of ``x`` (row-major) drawing lane
    ``i`` of ``key``; its gradient is the same on the incoming gradient. The kernel for CPU
    float32 and bfloat16 (:func:`takes`)."""
    if not takes(x):
        return unfused.dropout(x, key, threshold, scale)
    return _Dropout.apply(x, key, threshold, scale)


def takes(x: Tensor) -> bool:
    """Whether :func:`dropout` has a kernel for ``x``: a CPU tensor of a dtype it has, library built."""
    return x.device.type == "cpu" and x.dtype in _DROPOUT_DTYPES and library() is not None


# Matrices per thread below which splitting a Sinkhorn call costs more than it saves.
_SINKHORN_GRAIN = 1 << 12


class _Sinkhorn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: Tensor, iters: int):
        x = logits.contiguous()
        out, s = torch.empty_like(x), x.shape[-1]
        _typed("sinkhorn_forward", [x, out], x.numel() // (s * s), _SINKHORN_GRAIN, [s, iters])
        ctx.save_for_backward(x)
        ctx.iters = iters
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        (x,) = ctx.saved_tensors
        grad_x, s = torch.empty_like(x), x.shape[-1]
        tensors = [x, grad.contiguous(), grad_x]
        _typed("sinkhorn_backward", tensors, x.numel() // (s * s), _SINKHORN_GRAIN, [s, ctx.iters])
        return grad_x, None


def sinkhorn(logits: Tensor, iters: int) -> Tensor:
    """Sinkhorn-Knopp over the last two dims of ``logits [..., s, s]``: ``M = exp(logits)``, then
    ``iters`` rounds of column then row normalisation; differentiable. The kernel where
    :func:`takes_all` holds."""
    if not takes_all(logits):
        return unfused.sinkhorn(logits, iters)
    return _Sinkhorn.apply(logits, iters)


def takes_all(*tensors: Tensor) -> bool:
    """Whether :func:`sinkhorn`, :func:`mix_in` and :func:`mix_out` have a kernel for these
    tensors: all on the CPU, all float32 or all float64, and the library built."""
    dtypes = {t.dtype for t in tensors}
    return (
        all(t.device.type == "cpu" for t in tensors)
        and len(dtypes) == 1
        and dtypes <= _C_TYPES.keys()
        and library() is not None
    )


# Tokens per thread below which splitting a stream-mixing call costs more than it saves.
_STREAMS_GRAIN = 1 << 10


def _streams(name: str, tensors: list[Tensor], s: int, d: int) -> None:
    """Run ``mix_*`` kernel ``name`` over the tokens of ``tensors`` (inputs then outputs, all
    contiguous, tokens leading)."""
    _typed(name, tensors, tensors[0].numel() // (s * d), _STREAMS_GRAIN, [s, d])


class _MixIn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, pre: Tensor):
        x, pre = x.contiguous(), pre.contiguous()
        h = x.new_empty(x.shape[:-2] + x.shape[-1:])
        _streams("mix_in_forward", [x, pre, h], *x.shape[-2:])
        ctx.save_for_backward(x, pre)
        return h

    @staticmethod
    def backward(ctx, grad_h: Tensor):
        x, pre = ctx.saved_tensors
        grad_x, grad_pre = torch.empty_like(x), torch.empty_like(pre)
        _streams("mix_in_backward", [x, pre, grad_h.contiguous(), grad_x, grad_pre], *x.shape[-2:])
        return grad_x, grad_pre


class _MixOut(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, res: Tensor, post: Tensor, y: Tensor):
        x, res, post, y = (t.contiguous() for t in (x, res, post, y))
        out = torch.empty_like(x)
        _streams("mix_out_forward", [x, res, post, y, out], *x.shape[-2:])
        ctx.save_for_backward(x, res, post, y)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, res, post, y = ctx.saved_tensors
        grads = [torch.empty_like(t) for t in (x, res, post, y)]
        _streams("mix_out_backward", [x, res, post, y, grad.contiguous(), *grads], *x.shape[-2:])
        return tuple(grads)


def mix_in(x: Tensor, pre: Tensor) -> Tensor:
    """``h = Σ_s pre_s x_s`` per token for streams ``x [..., s, d]`` and ``pre [..., s]``
    (``[..., d]``); differentiable. The kernel where :func:`takes_all` holds."""
    if not takes_all(x, pre):
        return unfused.mix_in(x, pre)
    return _MixIn.apply(x, pre)


def mix_out(x: Tensor, res: Tensor, post: Tensor, y: Tensor) -> Tensor:
    """``out_t = Σ_s res_ts x_s + post_t y`` per token for streams ``x [..., s, d]``, ``res
    [..., s, s]``, ``post [..., s]`` and ``y [..., d]``; differentiable. The kernel where
    :func:`takes_all` holds for ``x``, ``res`` and ``post`` (``y``, e.g. a branch's bfloat16
    output under autocast, is converted to their dtype)."""
    if not takes_all(x, res, post):
        return unfused.mix_out(x, res, post, y)
    return _MixOut.apply(x, res, post, y.to(x.dtype))


# Positions (or table rows) per thread below which splitting a gathered-dot call costs more than
# it saves.
_GATHERED_GRAIN = 1 << 9


class _GatheredDot(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h: Tensor, table: Tensor, index: Tensor):
        h, table, index = h.contiguous(), table.contiguous(), index.contiguous()
        (t, d), k = h.shape, index.shape[1]
        out = h.new_empty(t, k)
        _typed("gathered_dot_forward", [h, table, index, out], t, _GATHERED_GRAIN, [k, d])
        ctx.save_for_backward(h, table, index)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        h, table, index = ctx.saved_tensors
        (t, d), k, m = h.shape, index.shape[1], table.shape[0]
        grad = grad.contiguous()
        grad_h, grad_table = torch.empty_like(h), torch.empty_like(table)
        # The first tensor's dtype picks the kernel (float or double): grad, not the int64 index.
        _typed("gathered_dot_backward_h", [grad, table, index, grad_h], t, _GATHERED_GRAIN, [k, d])
        _typed("gathered_dot_backward_table", [grad, h, index, grad_table], m, _GATHERED_GRAIN, [t, k, d])
        return grad_h, grad_table, None


def gathered_dot(h: Tensor, table: Tensor, index: Tensor) -> Tensor:
    """``out[t, j] = h[t] · table[index[t, j]]`` for ``h [t, d]``, ``table [m, d]`` and integer
    ``index [t, k]``, every entry in ``[0, m)``; differentiable in ``h`` and ``table``. The
    kernel where :func:`takes_all` holds for ``h`` and ``table`` (each table row's gradient
    summed in ``(t, j)`` order whatever the thread count)."""
    if not takes_all(h, table):
        return unfused.gathered_dot(h, table, index)
    _check_gather(h, table, index)
    return _GatheredDot.apply(h, table, index.long())


def _check_gather(h: Tensor, table: Tensor, index: Tensor) -> None:
    """The kernel reads ``table`` rows at ``index`` unchecked: refuse what would read outside it."""
    m = table.shape[0]
    if (
        h.dim() != 2
        or table.dim() != 2
        or index.dim() != 2
        or h.shape[1] != table.shape[1]
        or len(index) != len(h)
    ):
        raise ValueError(
            f"gathered_dot takes h [t, d], table [m, d] and index [t, k], got {tuple(h.shape)}, "
            f"{tuple(table.shape)} and {tuple(index.shape)}"
        )
    if index.numel():
        low, high = (int(v) for v in torch.aminmax(index))
        if low < 0 or high >= m:
            raise ValueError(
                f"gathered_dot: index holds {low} … {high}, outside the table's {m} rows [0, {m})"
            )

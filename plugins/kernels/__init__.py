"""Fused CPU kernels, compiled from C on first use with the machine's C compiler.

``softmax_dropout`` fuses a causal mask, softmax and dropout over attention logits into one pass
per row forward and one backward (softmax_dropout.c), where torch makes about eight passes over
the ``[b, h, n, n]`` probabilities and over the masked upper triangle too. Its dropout reads the
lanes of :func:`ablate.components.keep_mask`, so it keeps exactly the entries the unfused form
keeps. Where no compiler is found the callers use the unfused form (one warning line); set
``ABLATE_FUSED_KERNELS=0`` to use it anyway. The library is cached under
``kernels/`` of :func:`ablate.tasks.cache_dir` (where parsed data sets are cached too), keyed by
the source, the compiler flags and the CPU's feature flags (it is built with ``-march=native``).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import warnings
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path

import torch
from torch import Tensor

from ablate.tasks import cache_dir

SOURCE = Path(__file__).with_name("softmax_dropout.c")
# -ffast-math lets the compiler vectorise expf (glibc's vector maths) and the row sums.
FLAGS = ["-O3", "-march=native", "-ffast-math", "-fPIC", "-shared"]
_I64, _F32, _I32, _INT = ctypes.c_int64, ctypes.c_float, ctypes.c_int32, ctypes.c_int
_ARGS = [ctypes.c_void_p] * 4 + [_I64] * 5 + [_INT, _I64, _I64, _I32, _F32]


def _cpu_flags() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return os.uname().machine
    return next((line for line in text.splitlines() if line.startswith(("flags", "Features"))), "")


@cache
def library() -> ctypes.CDLL | None:
    """The compiled kernels, or None (kernels switched off, or no working C compiler)."""
    if os.environ.get("ABLATE_FUSED_KERNELS", "1") == "0":
        return None
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        warnings.warn("no C compiler found: attention uses torch's unfused ops", stacklevel=2)
        return None
    source = SOURCE.read_bytes()
    key = hashlib.sha256(source + " ".join([compiler, *FLAGS, _cpu_flags()]).encode()).hexdigest()[:16]
    path = cache_dir() / "kernels" / f"softmax_dropout-{key}.so"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
            built = Path(tmp) / path.name
            done = subprocess.run(
                [compiler, *FLAGS, str(SOURCE), "-o", str(built), "-lm"], capture_output=True, text=True
            )
            if done.returncode != 0:
                warnings.warn(
                    f"compiling {SOURCE.name} failed ({done.stderr.strip()[:200]}): attention uses "
                    "torch's unfused ops",
                    stacklevel=2,
                )
                return None
            os.replace(built, path)  # atomic: concurrent workers may build it at the same time
    lib = ctypes.CDLL(str(path))
    for name in ("softmax_dropout_forward", "softmax_dropout_backward"):
        getattr(lib, name).argtypes = _ARGS
        getattr(lib, name).restype = None
    return lib


@cache
def _pool(threads: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(threads, thread_name_prefix="ablate-kernel")


def _run(function, tensors: list[Tensor], matrices: int, shape_args: list, lane_args: list) -> None:
    """Call ``function`` over the matrices, split across torch's intra-op thread count (ctypes
    releases the GIL, so the parts run in parallel)."""
    pointers = [t.data_ptr() for t in tensors]
    threads = max(1, min(torch.get_num_threads(), matrices))
    bounds = [matrices * i // threads for i in range(threads + 1)]
    calls = [
        (pointers + [lo, hi, *shape_args, *lane_args]) for lo, hi in zip(bounds, bounds[1:], strict=False)
    ]
    if threads == 1:
        function(*calls[0])
        return
    for future in [_pool(threads).submit(function, *args) for args in calls]:
        future.result()


class _SoftmaxDropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: Tensor, lanes: Tensor, threshold: int, scale: float, offset: int, causal: bool):
        lib = library()
        matrices, rows, m = logits.shape
        y, out = torch.empty_like(logits), torch.empty_like(logits)
        shape_args = [rows, m, offset, int(causal)]
        lane_args = [lanes.stride(0), lanes.stride(1), threshold, scale]
        _run(lib.softmax_dropout_forward, [logits, lanes, y, out], matrices, shape_args, lane_args)
        ctx.save_for_backward(y, lanes)
        ctx.args = (shape_args, lane_args)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        y, lanes = ctx.saved_tensors
        shape_args, lane_args = ctx.args
        grad = grad.contiguous()
        grad_logits = torch.empty_like(y)
        _run(
            library().softmax_dropout_backward,
            [grad, y, lanes, grad_logits],
            y.shape[0],
            shape_args,
            lane_args,
        )
        return grad_logits, None, None, None, None, None


def softmax_dropout(
    logits: Tensor, lanes: Tensor, threshold: int, scale: float, offset: int = 0, causal: bool = True
) -> Tensor:
    """``where(lanes >= threshold, softmax(logits masked causally) * scale, 0)`` for contiguous
    float32 ``logits [r, rows, m]``; row ``i`` sees keys ``j ≤ offset + i`` when ``causal``.
    ``lanes`` is int16 ``[r, rows, m]`` with unit stride in its last dimension (a slice of
    :func:`ablate.components.keep_mask`'s draws). Call only where :func:`library` is not None."""
    if logits.dtype != torch.float32 or not logits.is_contiguous() or lanes.stride(2) != 1:
        raise ValueError("softmax_dropout takes contiguous float32 logits and unit-stride lanes")
    return _SoftmaxDropout.apply(logits, lanes, threshold, scale, offset, causal)

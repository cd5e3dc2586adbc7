"""The fused CPU kernels against the unfused forms they replace: the counter-based lanes (C and
torch ops against splitmix64 written out in Python integers), dropout (float32 and bfloat16,
forward and backward), causal mask + softmax + dropout in float64, forward and backward; and
softmax attention with them against the plain math, chunked or not."""

from __future__ import annotations

import math
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

import ablate_plugins.attention as attention
from ablate import components, fastpaths, kernels
from ablate.kernels import unfused

pytestmark = pytest.mark.skipif(
    kernels.library() is None, reason="no C compiler: the fused kernels are not built"
)
CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def fast_paths_as_they_were():
    with fastpaths.fast_paths():
        yield


def splitmix_lane(key: int, i: int) -> int:
    """Entry ``i``'s lane under ``key``, in Python's unbounded integers: 16-bit lane ``i mod 4``
    (signed) of splitmix64's output for counter ``i // 4`` (Steele, Lea & Flood 2014)."""
    m = 2**64 - 1
    z = (key + (i // 4 + 1) * 0x9E3779B97F4A7C15) & m
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
    z ^= z >> 31
    lane = (z >> (16 * (i % 4))) & 0xFFFF
    return lane - 65536 if lane >= 32768 else lane


@pytest.mark.parametrize("key", [0, 1, -1, 2**63 - 1, -(2**63), 0x1234_5678_9ABC_DEF0])
def test_lanes_are_splitmix64_in_torch_and_in_the_kernel(key):
    n = 1001
    lanes = components.keep_lanes((n,), CPU, key)
    assert lanes.tolist() == [splitmix_lane(key % 2**64, i) for i in range(n)]
    # The kernel's lanes, read back through dropout of ones at threshold 0 (kept: lane ≥ 0).
    kept = kernels.dropout(torch.ones(n), key, 0, 1.0) != 0
    assert torch.equal(kept, lanes >= 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1,), (7, 5), (300, 301)])
def test_dropout_kernel_equals_the_unfused_form_forward_and_backward(dtype, shape):
    torch.manual_seed(0)
    x = torch.randn(shape).to(dtype).requires_grad_()
    key, threshold, scale = 12345, components.keep_threshold(0.75), 1 / 0.75
    out = kernels.dropout(x, key, threshold, scale)
    keep = components.keep_lanes(shape, CPU, key) >= threshold
    # Kept entries: the float product with the scale, rounded to the dtype (nearest even).
    assert torch.equal(out, torch.where(keep, (x.detach().float() * scale).to(dtype), 0))
    weights = torch.randn(shape).to(dtype)
    (grad,) = torch.autograd.grad((out * weights).sum(), x)
    assert torch.equal(grad, torch.where(keep, (weights.float() * scale).to(dtype), 0))


def test_dropout_kernel_splits_work_across_threads_without_changing_it():
    x = torch.randn(3 * kernels._DROPOUT_GRAIN + 17)
    threads = torch.get_num_threads()
    try:
        results = []
        for count in (1, 3):
            torch.set_num_threads(count)
            results.append(kernels.dropout(x, 99, components.keep_threshold(0.5), 2.0))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(results[0], results[1])


def test_dropout_kernel_reads_a_non_contiguous_input_as_its_row_major_copy():
    x = torch.randn(40, 30).t()
    assert torch.equal(kernels.dropout(x, 7, 0, 1.5), kernels.dropout(x.contiguous(), 7, 0, 1.5))


def reference(logits, lanes, threshold, scale, offset, causal):
    """``where(lane ≥ threshold, softmax(logits, causally masked) · scale, 0)`` in float64."""
    rows, m = logits.shape[-2:]
    see = (
        torch.arange(m)[None, :] <= torch.arange(rows)[:, None] + offset
        if causal
        else torch.ones(rows, m, dtype=torch.bool)
    )
    probs = logits.double().masked_fill(~see, -math.inf).softmax(-1)
    return torch.where(lanes >= threshold, probs * scale, 0.0)


@pytest.mark.parametrize(
    ("rows", "m", "offset", "causal"),
    # the last: rows longer than the kernels' block of lanes (1024), not starting at a multiple of 4
    [(7, 7, 0, True), (3, 9, 4, True), (5, 6, 0, False), (1, 4, 3, True), (3, 1501, 1499, True)],
)
def test_kernel_matches_the_unfused_form_forward_and_backward(rows, m, offset, causal):
    torch.manual_seed(0)
    logits = (3 * torch.randn(4, rows, m)).requires_grad_()
    key = 2024
    lanes = components.keep_lanes((4, rows, m), CPU, key)
    threshold, scale = components.keep_threshold(0.7), 1 / 0.7
    out = kernels.softmax_dropout(logits, key, (0, rows * m, m), threshold, scale, offset, causal)
    leaf = logits.detach().double().requires_grad_()
    expected = reference(leaf, lanes, threshold, scale, offset, causal)
    torch.testing.assert_close(out.double(), expected, atol=1e-6, rtol=1e-5)
    weights = torch.randn(4, rows, m, dtype=torch.float64)
    (grad,) = torch.autograd.grad((out * weights.float()).sum(), logits)
    (grad_expected,) = torch.autograd.grad((expected * weights).sum(), leaf)
    torch.testing.assert_close(grad.double(), grad_expected, atol=1e-5, rtol=1e-4)
    # Entries a causal row cannot see, and dropped ones, are exact zeros.
    assert torch.equal(out == 0, expected == 0)


def test_kernel_splits_work_across_threads_without_changing_it():
    torch.manual_seed(1)
    logits = torch.randn(9, 12, 12)
    threads = torch.get_num_threads()
    try:
        results = []
        for count in (1, 3):
            torch.set_num_threads(count)
            results.append(
                kernels.softmax_dropout(logits, 5, (0, 144, 12), components.keep_threshold(0.8), 1.25)
            )
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(results[0], results[1])


def test_kernel_runs_under_the_profiler_recording_shapes():
    """``torch.profiler`` with ``record_shapes`` records ``apply()``'s arguments as int64: a key
    drawn negative (≥ 2⁶³ as the kernel's unsigned one) must reach ``apply`` signed; it failed
    to cast ("Unable to cast Python instance of type int") when converted before the call."""
    logits = torch.randn(2, 5, 5, requires_grad=True)
    threshold, scale = components.keep_threshold(0.8), 1.25
    plain = kernels.softmax_dropout(logits, -(2**62), (0, 25, 5), threshold, scale)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True):
        profiled = kernels.softmax_dropout(logits, -(2**62), (0, 25, 5), threshold, scale)
        profiled.sum().backward()
    assert torch.equal(plain, profiled)


def test_softmax_dropout_takes_any_layout_and_float64_through_the_torch_form():
    logits = torch.randn(2, 3, 3)
    transposed = logits.transpose(1, 2)  # not contiguous: the kernel reads a contiguous copy
    assert torch.equal(
        kernels.softmax_dropout(transposed, 4, (0, 9, 3), 0, 1.0),
        kernels.softmax_dropout(transposed.contiguous(), 4, (0, 9, 3), 0, 1.0),
    )
    wide = logits.double()  # float64: reference checks, kept in torch's ops
    expected = unfused.softmax_dropout(wide, 4, (0, 9, 3), 0, 1.0)
    assert torch.equal(kernels.softmax_dropout(wide, 4, (0, 9, 3), 0, 1.0), expected)


def plain(q, k, v, attn_mask, is_causal, p):
    """The written-out form (before the kernel): full logits, masks, softmax, the keep mask of the
    same draws, probabilities times values."""
    b, h, n, e = q.shape
    logits = q @ k.transpose(-1, -2) / math.sqrt(e)
    if is_causal:
        logits = logits.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), -math.inf)
    if attn_mask is not None:
        logits = (
            logits.masked_fill(~attn_mask, -math.inf) if attn_mask.dtype == torch.bool else logits + attn_mask
        )
    keep = components.keep_mask((b * h, n, n), 1 - p, q.device).view(b, h, n, n)
    return (logits.softmax(-1) * keep / (1 - p)) @ v


@pytest.mark.parametrize("chunks", [1, 2, 3])
@pytest.mark.parametrize("masking", ["causal", "causal+bias", "bias", "boolean"])
@pytest.mark.parametrize("fused", [True, False])
def test_attention_with_dropout_equals_the_plain_form(chunks, masking, fused, monkeypatch):
    monkeypatch.setattr(attention, "CAUSAL_QUERY_CHUNKS", chunks)
    fastpaths.set_fast_paths(kernels=fused)  # undone by the autouse fixture
    torch.manual_seed(2)
    b, h, n, e = 3, 2, 11, 4
    q, k, v = (torch.randn(b, h, n, e, requires_grad=True) for _ in range(3))
    bias = torch.randn(b, h, n, n)
    allowed = torch.ones(n, n, dtype=torch.bool).tril() | (torch.rand(n, n) < 0.3)
    attn_mask, is_causal = {
        "causal": (None, True),
        "causal+bias": (bias, True),
        "bias": (bias, False),
        "boolean": (allowed, False),
    }[masking]
    torch.manual_seed(3)
    out = attention.scaled_dot_product_attention(q, k, v, attn_mask, is_causal, 0.3)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    torch.manual_seed(3)
    expected = plain(q, k, v, attn_mask, is_causal, 0.3)
    expected_grads = torch.autograd.grad(expected.square().sum(), (q, k, v))
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_attention_under_bf16_autocast_stays_close_to_fp32():
    torch.manual_seed(4)
    q, k, v = (torch.randn(2, 1, 16, 8) for _ in range(3))
    torch.manual_seed(5)
    exact = attention.scaled_dot_product_attention(q, k, v, None, True, 0.2)
    torch.manual_seed(5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = attention.scaled_dot_product_attention(q, k, v, None, True, 0.2)
    assert low.dtype == torch.bfloat16
    torch.testing.assert_close(low.float(), exact, atol=0.1, rtol=0.05)


def test_a_built_wheel_carries_the_kernel_source(tmp_path):
    """A non-editable install compiles from the installed package: the C source must ship in it."""
    source = tmp_path / "source"  # a copy: building in the checkout would leave build/ behind
    shutil.copytree(
        Path(__file__).resolve().parents[1],
        source,
        ignore=shutil.ignore_patterns(
            ".git", ".venv", "runs", "reports", "build", "*.egg-info", "__pycache__"
        ),
    )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(source),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    sources = {f"ablate/kernels/{path.name}" for path in kernels.SOURCES + kernels.HEADERS}
    assert len(sources) == 7 and sources <= set(names)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dropout_keeps_the_same_entries_fused_or_not(dtype):
    """:func:`ablate.components.dropout` through the kernel and through torch ops (no compiler):
    the same draws of the same generator keep the same entries."""
    x = torch.randn(33, 17).to(dtype)
    torch.manual_seed(8)
    fused = components.dropout(x, 0.3)
    torch.manual_seed(8)
    with fastpaths.fast_paths(kernels=False):
        plain = components.dropout(x, 0.3)
    assert torch.equal(fused != 0, plain != 0) and 0 < int((fused != 0).sum()) < x.numel()
    torch.testing.assert_close(fused, plain, atol=0, rtol=1e-2)  # bfloat16: the scale's rounding


# ---------------------------------------------------------------------------------------------
# Sinkhorn-Knopp


def sinkhorn_by_numpy(logits: np.ndarray, iters: int) -> np.ndarray:
    """Sinkhorn-Knopp as its definition reads, one matrix at a time: exp, then ``iters`` rounds
    of dividing each column by its sum and then each row by its sum."""
    out = np.empty_like(logits)
    for index in np.ndindex(logits.shape[:-2]):
        m = np.exp(logits[index])
        for _ in range(iters):
            m = m / m.sum(axis=0, keepdims=True)
            m = m / m.sum(axis=1, keepdims=True)
        out[index] = m
    return out


@pytest.mark.parametrize("s", [1, 2, 4, 5])
@pytest.mark.parametrize("count", [1, 16, 37])  # one, one full block of 16, a partial last block
def test_sinkhorn_kernel_is_the_definition_in_float64(s, count):
    torch.manual_seed(s * 100 + count)
    logits = torch.randn(count, s, s, dtype=torch.float64) * 2
    out = kernels.sinkhorn(logits, 7)
    np.testing.assert_allclose(out.numpy(), sinkhorn_by_numpy(logits.numpy(), 7), rtol=1e-12, atol=0)


def test_sinkhorn_kernel_gradient_is_the_finite_difference_one():
    torch.manual_seed(3)
    for s in (2, 4):
        logits = torch.randn(19, s, s, dtype=torch.float64, requires_grad=True)
        assert torch.autograd.gradcheck(lambda t: kernels.sinkhorn(t, 5), (logits,))


def test_sinkhorn_kernel_float32_follows_float64_forward_and_backward():
    torch.manual_seed(4)
    logits = torch.randn(3, 50, 4, 4, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(3, 50, 4, 4, dtype=torch.float64)
    low = logits.detach().float().requires_grad_()
    out, out_low = kernels.sinkhorn(logits, 20), kernels.sinkhorn(low, 20)
    torch.testing.assert_close(out_low.double(), out, atol=1e-6, rtol=1e-5)
    (grad,) = torch.autograd.grad((out * weights).sum(), logits)
    (grad_low,) = torch.autograd.grad((out_low * weights.float()).sum(), low)
    torch.testing.assert_close(grad_low.double(), grad, atol=1e-5, rtol=1e-4)


def test_sinkhorn_kernel_splits_work_across_threads_and_reads_any_layout():
    logits = torch.randn(3 * kernels._SINKHORN_GRAIN + 5, 4, 4)
    threads = torch.get_num_threads()
    try:
        results = []
        for count in (1, 3):
            torch.set_num_threads(count)
            results.append(kernels.sinkhorn(logits, 20))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(results[0], results[1])
    transposed = logits.transpose(-1, -2)  # not contiguous
    assert torch.equal(kernels.sinkhorn(transposed, 20), kernels.sinkhorn(transposed.contiguous(), 20))
    assert kernels.takes_all(logits) and not kernels.takes_all(logits.bfloat16())
    assert not kernels.takes_all(logits, logits.double())


# ---------------------------------------------------------------------------------------------
# Hyper-connection stream mixing


def stream_inputs(tokens: int, s: int, d: int, dtype=torch.float64):
    torch.manual_seed(tokens + s + d)
    return [
        torch.randn(*shape, dtype=dtype, requires_grad=True)
        for shape in ((tokens, s, d), (tokens, s), (tokens, s, s), (tokens, s), (tokens, d))
    ]  # x, pre, res, post, y


@pytest.mark.parametrize("tokens,s,d", [(1, 1, 1), (7, 4, 50), (33, 3, 17)])
def test_stream_mixing_is_its_definition_in_float64(tokens, s, d):
    x, pre, res, post, y = stream_inputs(tokens, s, d)
    xs, pres, ress, posts, ys = (t.detach().numpy() for t in (x, pre, res, post, y))
    h = np.array([sum(pres[b, i] * xs[b, i] for i in range(s)) for b in range(tokens)])
    out = np.array(
        [
            [sum(ress[b, t, i] * xs[b, i] for i in range(s)) + posts[b, t] * ys[b] for t in range(s)]
            for b in range(tokens)
        ]
    )
    np.testing.assert_allclose(kernels.mix_in(x, pre).detach().numpy(), h, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(kernels.mix_out(x, res, post, y).detach().numpy(), out, rtol=1e-12, atol=1e-12)


def test_stream_mixing_gradients_are_the_finite_difference_ones():
    x, pre, res, post, y = stream_inputs(5, 3, 4)
    assert torch.autograd.gradcheck(kernels.mix_in, (x, pre))
    assert torch.autograd.gradcheck(kernels.mix_out, (x, res, post, y))


def test_stream_mixing_splits_work_across_threads_and_takes_leading_dims():
    x, pre, res, post, y = (t.detach().float() for t in stream_inputs(3 * kernels._STREAMS_GRAIN + 3, 4, 8))
    threads = torch.get_num_threads()
    try:
        results = []
        for count in (1, 3):
            torch.set_num_threads(count)
            results.append((kernels.mix_in(x, pre), kernels.mix_out(x, res, post, y)))
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(*results, strict=True))
    # [b, n, s, d] streams are the same tokens laid out in two leading dims.
    split = [t.unflatten(0, (3, -1)) for t in (x, pre, res, post, y)]
    assert torch.equal(kernels.mix_out(split[0], split[2], split[3], split[4]).flatten(0, 1), results[0][1])
    assert torch.equal(kernels.mix_in(split[0], split[1]).flatten(0, 1), results[0][0])


# ---------------------------------------------------------------------------------------------
# Dot products with gathered table rows


def test_gathered_dot_is_its_definition_in_float64_forward_and_backward():
    torch.manual_seed(5)
    t, m, d, k = 23, 9, 7, 6  # few rows: many repeats per row, whose gradients add up
    h = torch.randn(t, d, dtype=torch.float64, requires_grad=True)
    table = torch.randn(m, d, dtype=torch.float64, requires_grad=True)
    index = torch.randint(0, m, (t, k))
    weights = torch.randn(t, k, dtype=torch.float64)
    out = kernels.gathered_dot(h, table, index)
    hs, ts, ix, ws = h.detach().numpy(), table.detach().numpy(), index.numpy(), weights.numpy()
    expected = np.array([[hs[r] @ ts[ix[r, j]] for j in range(k)] for r in range(t)])
    np.testing.assert_allclose(out.detach().numpy(), expected, rtol=1e-12, atol=1e-12)
    grad_h, grad_table = torch.autograd.grad((out * weights).sum(), [h, table])
    expected_h = np.array([sum(ws[r, j] * ts[ix[r, j]] for j in range(k)) for r in range(t)])
    expected_table = np.zeros((m, d))
    for r in range(t):
        for j in range(k):
            expected_table[ix[r, j]] += ws[r, j] * hs[r]
    np.testing.assert_allclose(grad_h.numpy(), expected_h, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(grad_table.numpy(), expected_table, rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(lambda a, b: kernels.gathered_dot(a, b, index), (h, table))


def test_gathered_dot_is_the_same_on_any_number_of_threads():
    torch.manual_seed(6)
    t, m, d, k = 3 * kernels._GATHERED_GRAIN + 11, 2 * kernels._GATHERED_GRAIN + 5, 12, 9
    h, table = torch.randn(t, d, requires_grad=True), torch.randn(m, d, requires_grad=True)
    index, weights = torch.randint(0, m, (t, k)), torch.randn(t, k)
    threads = torch.get_num_threads()
    try:
        results = []
        for count in (1, 3):
            torch.set_num_threads(count)
            out = kernels.gathered_dot(h, table, index)
            results.append((out, *torch.autograd.grad((out * weights).sum(), [h, table])))
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(*results, strict=True))

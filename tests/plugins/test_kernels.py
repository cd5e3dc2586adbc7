"""The fused CPU kernel (causal mask, softmax and dropout in one pass per row) against the
unfused form it replaces, in float64, forward and backward; and softmax attention with it
against the plain math, chunked or not."""

from __future__ import annotations

import math
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

import ablate_plugins.attention as attention
from ablate import components
from ablate_plugins import kernels

pytestmark = pytest.mark.skipif(
    kernels.library() is None, reason="no C compiler: the fused kernel is not built"
)


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
    ("rows", "m", "offset", "causal"), [(7, 7, 0, True), (3, 9, 4, True), (5, 6, 0, False), (1, 4, 3, True)]
)
def test_kernel_matches_the_unfused_form_forward_and_backward(rows, m, offset, causal):
    torch.manual_seed(0)
    logits = (3 * torch.randn(4, rows, m)).requires_grad_()
    lanes = components.keep_lanes((4, rows, m), torch.device("cpu"))
    threshold, scale = components.keep_threshold(0.7), 1 / 0.7
    out = kernels.softmax_dropout(logits, lanes, threshold, scale, offset, causal)
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
    lanes = components.keep_lanes((9, 12, 12), torch.device("cpu"))
    threads = torch.get_num_threads()
    try:
        results = []
        for count in (1, 3):
            torch.set_num_threads(count)
            results.append(kernels.softmax_dropout(logits, lanes, components.keep_threshold(0.8), 1.25))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(results[0], results[1])


def test_kernel_refuses_what_it_cannot_read():
    lanes = components.keep_lanes((2, 3, 3), torch.device("cpu"))
    with pytest.raises(ValueError, match="contiguous float32"):
        kernels.softmax_dropout(torch.randn(2, 3, 3, dtype=torch.float64), lanes, 0, 1.0)
    with pytest.raises(ValueError, match="contiguous float32"):
        kernels.softmax_dropout(torch.randn(2, 3, 3).transpose(1, 2), lanes, 0, 1.0)


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
    if not fused:
        monkeypatch.setattr(kernels, "library", lambda: None)
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
        Path(__file__).resolve().parents[2],
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
    assert "ablate_plugins/kernels/softmax_dropout.c" in zipfile.ZipFile(wheel).namelist()

"""Norm kinds against explicit mean / variance math, and their pre / post placement.

Dimensions: ``b`` batch, ``n`` tokens, ``d`` model width.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from ablate import registry
from ablate.model.blocks import PostNorm, PreNorm
from ablate_plugins.connection import Residual
from ablate_plugins.norm import LayerNorm, NoNorm, RMSNorm, rms_norm_reference

D = 6


def layer_norm(x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float) -> Tensor:
    """``(x − μ) / √(σ² + eps) · γ + β`` with the biased variance."""
    mu = x.sum(-1, keepdim=True) / x.shape[-1]
    var = ((x - mu) ** 2).sum(-1, keepdim=True) / x.shape[-1]
    y = (x - mu) / torch.sqrt(var + eps)
    return y if weight is None else y * weight + bias


def rms_norm(x: Tensor, weight: Tensor | None, eps: float) -> Tensor:
    """``x / √(mean(x²) + eps) · w`` (no ``w`` without affine parameters)."""
    y = x / torch.sqrt((x * x).sum(-1, keepdim=True) / x.shape[-1] + eps)
    return y if weight is None else y * weight


def reference(norm, x: Tensor) -> Tensor:
    if isinstance(norm, RMSNorm):
        return rms_norm(x, norm.weight, norm.options.eps)
    return layer_norm(x, norm.norm.weight, norm.norm.bias, norm.options.eps)


def randomise(norm):
    """Move learned gains / biases away from their (1, 0) initialisation."""
    with torch.no_grad():
        for p in norm.parameters():
            p.copy_(torch.randn_like(p))
    return norm


KINDS = [
    pytest.param(LayerNorm, {}, id="layernorm"),
    pytest.param(LayerNorm, {"eps": 0.5}, id="layernorm-eps"),
    pytest.param(LayerNorm, {"affine": False}, id="layernorm-no-affine"),
    pytest.param(RMSNorm, {}, id="rmsnorm"),
    pytest.param(RMSNorm, {"eps": 0.5}, id="rmsnorm-eps"),
    pytest.param(RMSNorm, {"affine": False}, id="rmsnorm-no-affine"),
]


@pytest.mark.parametrize("kind, options", KINDS)
def test_matches_reference(build, kind, options):
    norm = randomise(build(kind, D, **options))
    x = 3 * torch.randn(2, 5, D, dtype=torch.float64) + 1
    torch.testing.assert_close(norm(x), reference(norm, x))


def test_rmsnorm_starts_as_pure_normalisation(build):
    norm = build(RMSNorm, D)
    torch.testing.assert_close(norm.weight, torch.ones(D, dtype=torch.float64))
    assert norm.options.eps == 1e-6


def test_layernorm_without_affine_has_no_parameters(build):
    assert list(build(LayerNorm, D, affine=False).parameters()) == []


def test_rmsnorm_without_affine_has_no_parameters(build):
    """FuXi-α's ``rms_norm`` has no learned gain."""
    assert list(build(RMSNorm, D, affine=False).parameters()) == []
    x = torch.randn(2, 5, D, dtype=torch.float64)
    torch.testing.assert_close(rms_norm_reference(x, (D,), None, 1e-3), rms_norm(x, None, 1e-3))


def test_rms_norm_fallback_matches_reference():
    x, w = torch.randn(2, 5, D, dtype=torch.float64), torch.randn(D, dtype=torch.float64)
    torch.testing.assert_close(rms_norm_reference(x, (D,), w, 1e-3), rms_norm(x, w, 1e-3))


@pytest.mark.parametrize("kind, options", KINDS)
def test_position_wise(build, position_wise, kind, options):
    norm = randomise(build(kind, D, **options))
    position_wise(norm, torch.randn(2, 5, D, dtype=torch.float64))


@pytest.mark.parametrize("kind, options", KINDS)
def test_padding_invariance(build, make_tokens, padding_invariant, kind, options):
    norm = randomise(build(kind, D, **options))
    x = torch.randn(2, 5, D, dtype=torch.float64)
    padding_invariant(lambda x, tokens: norm(x), x, make_tokens([5, 3], 5, causal=True))


@pytest.mark.parametrize("kind", [LayerNorm, RMSNorm])
def test_gradcheck(build, gradcheck_all, kind):
    norm = randomise(build(kind, 4))
    gradcheck_all(norm, norm, torch.randn(2, 3, 4, dtype=torch.float64))


# -- placement through ablate.model.build --------------------------------------------------------


def branch(h: Tensor) -> Tensor:
    """A fixed non-linear sub-layer ``[b, n, d] -> [b, n, d]`` (stands in for attention / FFN)."""
    w = torch.linspace(-1, 1, D * D, dtype=h.dtype).reshape(D, D)
    return torch.tanh(h @ w) + h.sum(-1, keepdim=True)


@pytest.mark.parametrize("kind", [LayerNorm, RMSNorm])
def test_pre_norm_placement(build, kind):
    norm = randomise(build(kind, D))
    layer = PreNorm(norm, build(Residual, D))
    x = torch.randn(2, 5, D, dtype=torch.float64)
    torch.testing.assert_close(layer(x, branch), x + branch(reference(norm, x)))


@pytest.mark.parametrize("kind", [LayerNorm, RMSNorm])
def test_post_norm_placement(build, kind):
    norm = randomise(build(kind, D))
    layer = PostNorm(norm, build(Residual, D))
    x = torch.randn(2, 5, D, dtype=torch.float64)
    torch.testing.assert_close(layer(x, branch), reference(norm, x + branch(x)))


# -- no normalisation -------------------------------------------------------------------------


def test_no_norm_is_identity_without_parameters(build, position_wise, make_tokens, padding_invariant):
    norm = build(NoNorm, D)
    assert list(norm.parameters()) == []
    x = 3 * torch.randn(2, 5, D, dtype=torch.float64) + 1
    torch.testing.assert_close(norm(x), x)
    position_wise(norm, x)
    padding_invariant(lambda x, tokens: norm(x), x, make_tokens([5, 3], 5, causal=True))


def test_no_norm_placement(build):
    x = torch.randn(2, 5, D, dtype=torch.float64)
    pre = PreNorm(build(NoNorm, D), build(Residual, D))
    post = PostNorm(build(NoNorm, D), build(Residual, D))
    torch.testing.assert_close(pre(x, branch), x + branch(x))
    torch.testing.assert_close(post(x, branch), x + branch(x))


def test_no_norm_gradient_is_identity(build):
    x = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(build(NoNorm, 4), (x,))


def test_no_norm_is_registered_as_none():
    assert registry.get("norm", "none") is NoNorm

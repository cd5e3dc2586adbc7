"""``ablate.components.linear`` / ``Linear``: torch's linear layer, the bias added after the product."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ablate.components import Linear, linear


@pytest.mark.parametrize("shape", [(7, 5), (3, 4, 5)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_values_and_gradients_equal_torch(shape, with_bias):
    torch.manual_seed(0)
    x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    w = torch.randn(6, 5, dtype=torch.float64, requires_grad=True)
    b = torch.randn(6, dtype=torch.float64, requires_grad=True) if with_bias else None
    ours = linear(x, w, b)
    # The formula, written out: y = x Wᵀ + b.
    expected = torch.einsum("...i,oi->...o", x, w) + (b if with_bias else 0)
    torch.testing.assert_close(ours, expected)
    grad = torch.randn_like(ours)
    inputs = [x, w] + ([b] if with_bias else [])
    got = torch.autograd.grad(ours, inputs, grad)
    want = torch.autograd.grad(F.linear(x, w, b), inputs, grad)
    for g, h in zip(got, want):
        torch.testing.assert_close(g, h)
    if with_bias:  # the bias gradient sums the output gradient over every leading position
        torch.testing.assert_close(got[2], grad.reshape(-1, 6).sum(0))


def test_module_is_a_drop_in_for_nn_linear():
    torch.manual_seed(0)
    ours = Linear(5, 3)
    theirs = nn.Linear(5, 3)
    theirs.load_state_dict(ours.state_dict())
    assert isinstance(ours, nn.Linear)  # initialisers that look for nn.Linear find it
    x = torch.randn(4, 5)
    torch.testing.assert_close(ours(x), theirs(x))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert ours(x).dtype == theirs(x).dtype == torch.bfloat16

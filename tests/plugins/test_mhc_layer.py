"""Seed 004's ``MHCLayer`` as the connection kind ``mhc_layer``: float64 reference against the seed's
formulas, written out here in NumPy loop by loop (its ``sinkhorn_knopp`` and ``forward``)."""

from __future__ import annotations

from importlib.metadata import entry_points

import numpy as np
import pytest
import torch

from ablate.components import BuildContext
from ablate_plugins.mhc_layer import SeedMHCLayer, seed_sinkhorn


def numpy_sinkhorn(m: np.ndarray, iterations: int) -> np.ndarray:
    """The seed's sinkhorn_knopp, element by element."""
    p = m + 1e-6
    rows, cols = p.shape
    for _ in range(iterations):
        p = np.array([[p[i, j] / (sum(p[i, :]) + 1e-10) for j in range(cols)] for i in range(rows)])
        p = np.array([[p[i, j] / (sum(p[:, j]) + 1e-10) for j in range(cols)] for i in range(rows)])
    return p


def seed_forward(inputs, mask, weights, w_o, b_o, iterations):
    """The seed's MHCLayer.forward without dropout: one output per head, masked, stacked, mean,
    out_proj, plus the input."""
    heads = [numpy_sinkhorn(w, iterations) for w in weights]
    outputs = []
    for h in heads:
        out = inputs @ h
        out = np.where(mask[..., None] == 0, 0.0, out)
        outputs.append(out)
    combined = np.stack(outputs, axis=-1).mean(axis=-1)
    return inputs + combined @ w_o.T + b_o


def layer(layer_index: int = 0, dim: int = 6, **options) -> SeedMHCLayer:
    ctx = BuildContext(dim=dim, dropout=0.0, layer=layer_index)
    return SeedMHCLayer(SeedMHCLayer.Options(**options), ctx).double().eval()


def test_sinkhorn_by_hand():
    # One iteration on [[1, 2], [3, 4]]: rows → [[1/3, 2/3], [3/7, 4/7]], columns sum to 16/21 and
    # 26/21 → [[7/16, 14/26], [9/16, 12/26]] (to the 1e-6 the seed adds first).
    got = seed_sinkhorn(torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.float64), iterations=1)
    np.testing.assert_allclose(got.numpy(), [[7 / 16, 14 / 26], [9 / 16, 12 / 26]], atol=1e-6)


def test_sinkhorn_of_a_positive_matrix_is_doubly_stochastic_and_matches_the_loops():
    m = np.random.default_rng(0).uniform(0.1, 2.0, size=(5, 5))
    got = seed_sinkhorn(torch.from_numpy(m), iterations=20).numpy()
    np.testing.assert_allclose(got, numpy_sinkhorn(m, 20), rtol=1e-12)
    np.testing.assert_allclose(got.sum(0), 1.0, atol=1e-12)  # the last step normalises columns
    np.testing.assert_allclose(got.sum(1), 1.0, atol=1e-6)


# The seed's own weights are signed, where the iteration is chaotic (rounding differences of 1e-16
# grow to O(1) by the 5th iteration: seed_sinkhorn's docstring), so the loops and torch agree only
# for a few iterations there; exp(W), the non-negative matrix the seed's text asks for, at its 20.
@pytest.mark.parametrize("positive,iterations", [("none", 2), ("exp", 20)])
def test_layer_matches_the_seed_after_the_residual_join(positive, iterations):
    torch.manual_seed(3)
    mhc = layer(dim=6, heads=3, positive=positive, iterations=iterations)
    x = torch.randn(2, 4, 6, dtype=torch.float64)
    a = torch.randn(6, 6, dtype=torch.float64)
    got = mhc(x, lambda h: torch.tanh(h @ a)).detach().numpy()
    y = (x + torch.tanh(x @ a)).numpy()  # the join; dropout 0
    weights = mhc.hyper_weights.detach().numpy()
    weights = np.exp(weights) if positive == "exp" else weights
    w_o, b_o = mhc.out_proj.weight.detach().numpy(), mhc.out_proj.bias.detach().numpy()
    mask = np.ones((2, 4))
    np.testing.assert_allclose(
        got, seed_forward(y, mask, weights, w_o, b_o, iterations), rtol=1e-9, atol=1e-9
    )
    # The seed's mask only touches padded positions; real ones are the same with a padded tail.
    mask[1, 2:] = 0
    masked = seed_forward(y, mask, weights, w_o, b_o, iterations)
    np.testing.assert_allclose(got[mask == 1], masked[mask == 1], rtol=1e-9, atol=1e-9)
    assert not np.allclose(got[1, 2:], masked[1, 2:])


def test_initialisation_as_the_seed():
    torch.manual_seed(0)
    mhc = SeedMHCLayer(SeedMHCLayer.Options(heads=4), BuildContext(dim=64))
    assert mhc.hyper_weights.shape == (4, 64, 64)
    w = mhc.hyper_weights.detach()
    assert abs(float(w.mean())) < 0.02 and abs(float(w.std()) - 1.0) < 0.02  # torch.randn
    bound = (6 / 128) ** 0.5  # Xavier-uniform, fan_in = fan_out = 64
    w_o = mhc.out_proj.weight.detach()
    assert float(w_o.abs().max()) <= bound and float(w_o.std()) > bound / 2
    assert torch.equal(mhc.out_proj.bias, torch.zeros(64))


@pytest.mark.parametrize("after,active", [("attention", [True, False, True, False]), ("every", [True] * 4)])
def test_after_picks_the_sub_layers(after, active):
    layers = [layer(layer_index=i, after=after) for i in range(4)]
    assert [m.active for m in layers] == active
    x = torch.randn(1, 3, 6, dtype=torch.float64)
    for m in layers:
        if not m.active:  # the plain residual, without parameters
            assert not list(m.parameters())
            assert torch.equal(m(x, lambda h: 2 * h), 3 * x)


def test_registered_as_a_connection_kind():
    (point,) = [p for p in entry_points(group="ablate.connection") if p.name == "mhc_layer"]
    assert point.load() is SeedMHCLayer


def test_gradients_reach_the_mixing_weights():
    mhc = layer(dim=4, heads=2)
    x = torch.randn(2, 3, 4, dtype=torch.float64)
    mhc(x, torch.sin).sum().backward()
    assert mhc.hyper_weights.grad is not None and bool(mhc.hyper_weights.grad.abs().sum() > 0)

"""The kinds' dropout (:func:`ablate.components.dropout`) against its definition: each entry
zeroed with probability p independently of the others, the rest scaled by 1 / (1 − p)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from ablate.components import Dropout, dropout, keep_mask
from ablate_plugins.attention import scaled_dot_product_attention


@pytest.mark.parametrize("p", [0.05, 0.2, 0.5, 0.9])
def test_each_entry_is_kept_with_probability_one_minus_p(p):
    torch.manual_seed(0)
    n = 2_000_001  # not a multiple of the four lanes a draw gives
    kept = dropout(torch.ones(n), p) != 0
    sigma = math.sqrt(p * (1 - p) / n)
    assert abs(kept.double().mean().item() - (1 - p)) < 5 * sigma
    # Each of the four 16-bit lanes of a 64-bit draw keeps with the same probability.
    lanes = kept[: n - 1].view(-1, 4).double().mean(0)
    assert ((lanes - (1 - p)).abs() < 5 * math.sqrt(p * (1 - p) / (n // 4))).all(), lanes


def test_entries_are_independent_of_their_neighbours():
    torch.manual_seed(1)
    n = 4_000_000
    kept = keep_mask((n,), 0.5, torch.device("cpu")).double()
    for lag in (1, 2, 3, 4, 5, 8):
        r = torch.corrcoef(torch.stack([kept[:-lag], kept[lag:]]))[0, 1].item()
        assert abs(r) < 5 / math.sqrt(n), (lag, r)


def test_kept_entries_are_scaled_and_the_gradient_uses_the_same_mask():
    torch.manual_seed(2)
    x = torch.randn(300, 70, requires_grad=True)
    y = dropout(x, 0.3)
    kept = y != 0
    assert 0 < kept.sum() < x.numel()
    torch.testing.assert_close(y[kept], x[kept] / 0.7)
    weights = torch.randn_like(x)
    (y * weights).sum().backward()
    torch.testing.assert_close(x.grad, torch.where(kept, weights / 0.7, 0.0))


def test_dropout_zeroes_exactly_where_keep_mask_from_the_same_draws_is_false():
    torch.manual_seed(5)
    kept = keep_mask((123, 45), 0.75, torch.device("cpu"))
    torch.manual_seed(5)
    y = dropout(torch.ones(123, 45), 0.25)
    assert torch.equal(y != 0, kept)
    assert torch.equal(y[kept], torch.full((int(kept.sum()),), 1 / 0.75))


def test_eval_mode_and_p_zero_are_the_identity_and_draw_nothing():
    x = torch.randn(10, 10)
    module = Dropout(0.4).eval()
    state = torch.get_rng_state()
    assert module(x) is x and dropout(x, 0.0) is x and dropout(x, 0.4, training=False) is x
    assert torch.equal(torch.get_rng_state(), state)
    assert not torch.equal(Dropout(0.4).train()(x), x)


def test_the_seed_fixes_the_mask_and_calls_differ():
    x = torch.ones(1000)
    torch.manual_seed(3)
    first, second = dropout(x, 0.5), dropout(x, 0.5)
    torch.manual_seed(3)
    assert torch.equal(dropout(x, 0.5), first) and not torch.equal(first, second)


def test_probability_must_be_below_one():
    with pytest.raises(ValueError, match=r"dropout probability must be in \[0, 1\), got 1.0"):
        Dropout(1.0)


@pytest.mark.parametrize("masking", ["causal", "additive", "boolean"])
def test_attention_with_dropout_drops_probabilities(masking):
    """The CPU attention with probability dropout: ``dropout(softmax(q kᵀ / √e + mask)) v`` with
    the mask :func:`dropout` draws, replayed; without dropout, torch's kernel."""
    torch.manual_seed(4)
    b, h, n, e = 2, 2, 6, 4
    q, k, v = torch.randn(3, b, h, n, e, dtype=torch.float64).unbind(0)
    allowed = torch.ones(n, n, dtype=torch.bool).tril() | (torch.rand(n, n) < 0.3)
    masks = {
        "causal": (None, True),
        "additive": (torch.zeros(n, n, dtype=q.dtype).masked_fill(~allowed, -math.inf), False),
        "boolean": (allowed, False),
    }
    attn_mask, is_causal = masks[masking]
    see = torch.ones(n, n, dtype=torch.bool).tril() if is_causal else allowed
    logits = torch.einsum("bhie,bhje->bhij", q, k) / math.sqrt(e)
    probs = logits.masked_fill(~see, -math.inf).softmax(-1)
    torch.manual_seed(5)
    out = scaled_dot_product_attention(q, k, v, attn_mask, is_causal, 0.25)
    torch.manual_seed(5)
    replayed = dropout(torch.ones_like(probs), 0.25)
    torch.testing.assert_close(out, (probs * replayed) @ v)
    torch.testing.assert_close(scaled_dot_product_attention(q, k, v, attn_mask, is_causal, 0.0), probs @ v)
    torch.testing.assert_close(
        scaled_dot_product_attention(q, k, v, attn_mask, is_causal, 0.0),
        F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal),
    )

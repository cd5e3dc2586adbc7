"""The plugin test kit (ablate/testkit.py): every installed kind passes every check that applies
to it, and each check fails a kind written to break it (a softmax attention without its causal
mask, an FFN that reads padded tokens, a parameter no gradient reaches, an unseeded draw, a
changed dtype)."""

from __future__ import annotations

import os

import pytest
import torch.nn.functional as F
from torch import nn

from ablate import registry, testkit
from ablate.components import Attention, FeedForward, Norm

INSTALLED = [(slot, kind) for slot in registry.COMPONENT_SLOTS for kind in registry.kinds(slot)]


@pytest.mark.parametrize("slot, kind", INSTALLED, ids=[f"{slot}-{kind}" for slot, kind in INSTALLED])
def test_every_installed_kind_passes_every_check(slot, kind):
    """Every check on every kind found through the entry points (tiny sizes: about a second for
    all of them in one process)."""
    failed = []
    for name in testkit.CHECKS:
        try:
            testkit.check(registry.get(slot, kind), name)
        except AssertionError as exc:
            failed.append(str(exc))
    assert not failed, "\n".join(failed)


def test_the_kinds_checked_are_every_installed_one():
    assert tuple(testkit.SLOTS) == registry.COMPONENT_SLOTS  # a caller for every slot
    assert len(INSTALLED) >= 25 and {"softmax", "moe", "mhc", "rel_time"} <= {kind for _, kind in INSTALLED}


class NoCausalMask(Attention):
    """A softmax attention that forgets ``tokens.causal`` (the mask of the valid keys only)."""

    def __init__(self, options, ctx):
        super().__init__(options, ctx)
        self.qkv = nn.Linear(ctx.dim, 3 * ctx.dim)

    def forward(self, x, tokens):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        keys = tokens.valid[:, None, :].expand(-1, x.shape[1], -1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keys)


class MaskedAttention(NoCausalMask):
    def forward(self, x, tokens):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        mask, causal = tokens.attention_mask(x.dtype)  # [b, 1, n, n] or None with is_causal
        mask = None if mask is None else mask[:, 0]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)


class MeanOverTokens(FeedForward):
    """Adds the mean over every token of the row, padded ones included."""

    def forward(self, x, valid=None):
        return x + x.mean(dim=1, keepdim=True)


class UnusedParameter(FeedForward):
    def __init__(self, options, ctx):
        super().__init__(options, ctx)
        self.used, self.unused = nn.Linear(ctx.dim, ctx.dim), nn.Linear(ctx.dim, ctx.dim)

    def forward(self, x, valid=None):
        return self.used(x)


class UnseededNoise(Norm):
    def forward(self, x):
        return x + int.from_bytes(os.urandom(2), "little") * 1e-3


class Float64(Norm):
    def forward(self, x):
        return x.double()


@pytest.mark.parametrize(
    "cls, failing",
    [
        (NoCausalMask, "causality"),
        (MeanOverTokens, "padding"),
        (UnusedParameter, "gradients"),
        (UnseededNoise, "determinism"),
        (Float64, "shapes"),
    ],
)
def test_each_check_fails_a_kind_that_breaks_it(cls, failing):
    with pytest.raises(AssertionError, match=rf"kind {cls.__name__} fails '{failing}': "):
        testkit.check(cls, failing)


def test_the_mask_the_context_gives_passes_and_unknown_checks_are_named():
    testkit.check_all(MaskedAttention)
    with pytest.raises(ValueError, match="unknown check 'speed' \\(checks: shapes, gradients"):
        testkit.check(MaskedAttention, "speed")
    with pytest.raises(TypeError, match="subclasses none of Attention, FeedForward"):
        testkit.check(nn.Linear, "shapes")


def test_a_kind_is_built_with_the_options_given():
    softmax = registry.get("attention", "softmax")
    harness = testkit.build(softmax, {"heads": 4})
    assert harness.kind.options.heads == 4 and harness.ctx.dim == testkit.D
    assert testkit.build(softmax).kind.options.heads == testkit.SMALL["heads"]

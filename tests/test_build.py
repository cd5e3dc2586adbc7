"""Model assembly against hand-written math: norm placements, block order, layer indices,
initialisers, and the last-token path of a block.

Placements are checked on a tiny model of hand-written kinds (formulas below), so a reference
needs nothing but the kinds' own parameters. Dimensions: ``b`` batch, ``n`` tokens, ``d`` width.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from torch import Tensor, nn

from ablate import registry
from ablate.components import Attention, BuildContext, Connection, FeedForward, Norm, Options, TokenContext
from ablate.model.blocks import (
    INITIALISERS,
    PLACEMENTS,
    Placed,
    PostNorm,
    PreNorm,
    PreNormSkip,
    PreNormSkipSource,
)
from ablate.model.build import build_backbone, count_parameters
from ablate.model.spec import ModelSpec
from ablate.model.variant import Part, Variant
from ablate.study.resolve import placement_problem

B, N, D = 2, 5, 4


class Scaled(Norm):
    """``(x − mean) / √(var + 1e-5) · g_l`` with ``g_l = 1 + 0.1 (l + 1)``: each sub-layer's norm
    is told apart by its layer index ``l``."""

    def __init__(self, options, ctx):
        super().__init__(options, ctx)
        self.gain = nn.Parameter(torch.full((ctx.dim,), 1 + 0.1 * (ctx.layer + 1)))

    def forward(self, x: Tensor) -> Tensor:
        return normalise(x) * self.gain


def normalise(x: Tensor) -> Tensor:
    return (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + 1e-5)


class GatedMean(Attention):
    """``A(q, s)_i = tanh(q_i) ⊙ mean_{j ≤ i} s_j W`` (queries from ``q``, keys / values from ``s``)."""

    takes_source = True

    def __init__(self, options, ctx):
        super().__init__(options, ctx)
        self.weight = nn.Parameter(torch.randn(ctx.dim, ctx.dim))

    def forward(self, x: Tensor, tokens: TokenContext, source: Tensor | None = None) -> Tensor:
        s = (x if source is None else source) @ self.weight
        counts = torch.arange(1, x.shape[1] + 1, dtype=x.dtype)[:, None]
        return torch.tanh(x) * s.cumsum(1) / counts


class Sine(FeedForward):
    """``F(x) = sin(x W)``."""

    def __init__(self, options, ctx):
        super().__init__(options, ctx)
        self.weight = nn.Parameter(torch.randn(ctx.dim, ctx.dim))

    def forward(self, x: Tensor, valid: Tensor | None = None) -> Tensor:
        return torch.sin(x @ self.weight)


class Add(Connection):
    """``x + f(x)``."""

    def forward(self, streams: Tensor, branch) -> Tensor:
        return streams + branch(streams)


def hand_variant(placement: str, blocks: int = 2) -> Variant:
    spec = ModelSpec(
        dim=D, blocks=blocks, dropout=0.0, bias=[], norm={"kind": "scaled", "placement": placement}
    )
    return Variant(
        name="hand",
        spec=spec,
        attention=Part("attention", GatedMean, Options()),
        ffn=Part("ffn", Sine, Options()),
        norm=Part("norm", Scaled, Options()),
        connection=Part("connection", Add, Options()),
        bias=(),
    )


def full_rows() -> TokenContext:
    return TokenContext(
        valid=torch.ones(B, N, dtype=torch.bool), causal=True, positions=torch.arange(N).expand(B, N)
    )


def reference(backbone, placement: str, x: Tensor) -> Tensor:
    """The documented formula of ``placement``, block by block, from the kinds' parameters."""
    for block in backbone.blocks:
        g_mix, g_feed = block.mix.norm.gain, block.feed.norm.gain
        w_a, w_f = block.attention.weight, block.ffn.weight
        counts = torch.arange(1, N + 1, dtype=x.dtype)[:, None]

        def attend(q, s, w_a=w_a, counts=counts):
            return torch.tanh(q) * (s @ w_a).cumsum(1) / counts

        def ffn(h, w_f=w_f):
            return torch.sin(h @ w_f)

        ln_mix, ln_feed = (lambda h, g=g_mix: normalise(h) * g), (lambda h, g=g_feed: normalise(h) * g)
        if placement == "pre":  # x + f(LN(x))
            x = x + attend(ln_mix(x), ln_mix(x))
            x = x + ffn(ln_feed(x))
        elif placement == "post":  # LN(x + f(x))
            x = ln_mix(x + attend(x, x))
            x = ln_feed(x + ffn(x))
        elif placement == "pre_skip":  # LN(x) + f(LN(x))
            x = ln_mix(x) + attend(ln_mix(x), ln_mix(x))
            x = ln_feed(x) + ffn(ln_feed(x))
        else:  # pre_skip_kv: LN(x) + Attn(q = LN(x), k = v = x); the FFN as pre_skip
            x = ln_mix(x) + attend(ln_mix(x), x)
            x = ln_feed(x) + ffn(ln_feed(x))
    return normalise(x) * backbone.final_norm.gain


@pytest.mark.parametrize("placement", list(PLACEMENTS))
def test_placements_give_their_formulas(placement):
    torch.manual_seed(0)
    backbone = build_backbone(hand_variant(placement), BuildContext(dim=D, max_len=N)).double().eval()
    with torch.no_grad():
        for p in backbone.parameters():  # norms' gains away from their initial values
            p.add_(0.1 * torch.randn_like(p))
    x = torch.randn(B, N, D, dtype=torch.float64)
    torch.testing.assert_close(backbone(x, full_rows()), reference(backbone, placement, x))


def test_placement_vocabulary_names_the_sub_layer_classes():
    assert PLACEMENTS["pre"] == (PreNorm, PreNorm)
    assert PLACEMENTS["post"] == (PostNorm, PostNorm)
    assert PLACEMENTS["pre_skip"] == (PreNormSkip, PreNormSkip)
    assert (PLACEMENTS["pre_skip_kv"].mix, PLACEMENTS["pre_skip_kv"].feed) == (PreNormSkipSource, PreNormSkip)
    # Only the key / value-source placement hands the attention the un-normalised stream.
    giving = [name for name, p in PLACEMENTS.items() if p.mix.gives_source or p.feed.gives_source]
    assert giving == ["pre_skip_kv"]


def test_placement_problem_reads_what_the_placement_declares():
    softmax, pointwise = registry.get("attention", "softmax"), registry.get("attention", "pointwise")
    residual, hyper = registry.get("connection", "residual"), registry.get("connection", "hyper")
    for name in PLACEMENTS:
        if not PLACEMENTS[name].mix.gives_source:
            assert placement_problem(name, pointwise, hyper) is None
    assert placement_problem("pre_skip_kv", softmax, residual) is None
    assert "does not support" in placement_problem("pre_skip_kv", pointwise, residual)
    assert "single-stream" in placement_problem("pre_skip_kv", softmax, hyper)


@pytest.mark.parametrize("placement", list(PLACEMENTS))
def test_build_backbone_gives_each_sub_layer_its_index(placement):
    """Block ``i``: attention and its placed sub-layer at layer ``2i``, the FFN's at ``2i + 1``;
    every sub-layer gets its own norm and connection."""
    backbone = build_backbone(hand_variant(placement, blocks=3), BuildContext(dim=D, max_len=N))
    assert len(backbone.blocks) == 3
    mix_cls, feed_cls = PLACEMENTS[placement]
    for i, block in enumerate(backbone.blocks):
        assert type(block.mix) is mix_cls and type(block.feed) is feed_cls
        assert isinstance(block.mix, Placed) and isinstance(block.feed, Placed)
        mix, feed = block.mix, block.feed
        assert block.attention.ctx.layer == mix.norm.ctx.layer == mix.connection.ctx.layer == 2 * i
        assert block.ffn.ctx.layer == feed.norm.ctx.layer == feed.connection.ctx.layer == 2 * i + 1
    norms = [m for m in backbone.modules() if isinstance(m, Scaled)]
    assert len(norms) == len({id(m) for m in norms}) == 2 * 3 + 1  # one per sub-layer, and the final norm
    assert backbone.final_norm.ctx.layer == 0


def test_no_blocks_is_the_final_norm_alone():
    backbone = build_backbone(hand_variant("pre", blocks=0), BuildContext(dim=D, max_len=N)).double()
    x = torch.randn(B, N, D, dtype=torch.float64)
    torch.testing.assert_close(backbone(x, full_rows()), normalise(x) * backbone.final_norm.gain)
    assert count_parameters(backbone) == D


@pytest.mark.parametrize("placement", list(PLACEMENTS))
def test_without_a_final_norm_the_backbone_ends_with_its_last_block(placement):
    """``model.final_norm: false`` (HSTU and FuXi-α only L2-normalise their output): the documented
    formula of the blocks alone; the default puts the norm after them."""
    variant = hand_variant(placement)
    bare = replace(variant, spec=variant.spec.model_copy(update={"final_norm": False}))
    torch.manual_seed(0)
    normed = build_backbone(variant, BuildContext(dim=D, max_len=N)).double()
    torch.manual_seed(0)
    backbone = build_backbone(bare, BuildContext(dim=D, max_len=N)).double()
    assert isinstance(backbone.final_norm, nn.Identity)
    assert count_parameters(normed) - count_parameters(backbone) == D  # the final norm's gain
    x = torch.randn(B, N, D, dtype=torch.float64)
    y = backbone(x, full_rows())  # the same blocks (same seed), without the norm after them
    torch.testing.assert_close(normalise(y) * normed.final_norm.gain, reference(normed, placement, x))
    assert not torch.allclose(y, normed(x, full_rows()))


def test_default_initialiser_keeps_every_parameter():
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8), nn.Embedding(4, 8))
    before = [p.detach().clone() for p in module.parameters()]
    INITIALISERS["default"](module)
    assert all(torch.equal(p, q) for p, q in zip(module.parameters(), before, strict=True))


def test_xavier_normal_redraws_linear_weights_only():
    torch.manual_seed(0)
    fan_in, fan_out = 300, 200
    module = nn.Sequential(nn.Linear(fan_in, fan_out), nn.LayerNorm(fan_out), nn.Embedding(4, fan_out))
    nn.init.normal_(module[1].weight)
    before = {name: p.detach().clone() for name, p in module.named_parameters()}
    INITIALISERS["xavier_normal"](module)
    weight = module[0].weight
    assert abs(weight.std().item() / math.sqrt(2 / (fan_in + fan_out)) - 1) < 0.02
    assert abs(weight.mean().item()) < 0.01
    for name, p in module.named_parameters():
        if name != "0.weight":
            assert torch.equal(p, before[name]), name  # biases, norms, embeddings keep theirs


def registry_variant(placement: str, connection: str = "residual", **conn_options) -> Variant:
    spec = ModelSpec(dim=8, blocks=2, dropout=0.0, norm={"kind": "layernorm", "placement": placement})

    def part(slot, kind, **options):
        cls = registry.get(slot, kind)
        return Part(slot, cls, cls.Options(**options))

    return Variant(
        name="real",
        spec=spec,
        attention=part("attention", "softmax", heads=2),
        ffn=part("ffn", "pointwise"),
        norm=part("norm", "layernorm"),
        connection=part("connection", connection, **conn_options),
        bias=(part("bias", "rel_pos"),),
    )


@pytest.mark.parametrize("placement,connection", [(p, "residual") for p in PLACEMENTS] + [("pre", "hyper")])
def test_last_token_path_equals_the_full_forward(placement, connection):
    """``Backbone(last_only=True)`` runs the final block's :meth:`Block.last`: the same numbers as the
    full forward at each row's last real token (rows of different lengths)."""
    torch.manual_seed(0)
    options = {"streams": 2} if connection == "hyper" else {}
    variant = registry_variant(placement, connection, **options)
    backbone = build_backbone(variant, BuildContext(dim=8, max_len=N)).double().eval()
    lengths = torch.tensor([N, N - 2])
    tokens = TokenContext(
        valid=torch.arange(N)[None, :] < lengths[:, None], causal=True, positions=torch.arange(N).expand(B, N)
    )
    x = torch.randn(B, N, 8, dtype=torch.float64)
    with torch.no_grad():
        full = backbone(x, tokens)
        last = backbone(x, tokens, last_only=True)
    torch.testing.assert_close(last, full[torch.arange(B), lengths - 1])

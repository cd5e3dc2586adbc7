"""Feed-forward kinds against explicit two-layer, gated and mixture-of-experts math.

Dimensions: ``b`` batch, ``n`` tokens, ``d`` model width, ``k`` hidden width, ``t`` tokens
(batch and sequence flattened), ``E`` experts.
"""

from __future__ import annotations

import math

import pydantic
import pytest
import torch
from torch import Tensor, nn

from ablate import registry
from ablate.components import BuildContext, Stem, TokenContext, dropout
from ablate.model.blocks import Backbone, Block, PreNorm
from ablate_plugins.connection import Residual
from ablate_plugins.ffn import GEGLU, MFFN, MLPFFN, MoEFFN, NoFFN, PointwiseFFN, ReGLU, SwiGLU, glu_hidden
from ablate_plugins.norm import NoNorm, RMSNorm

D = 6

HAND_ACTIVATIONS = {
    "relu": lambda u: u.clamp(min=0),
    "gelu": lambda u: 0.5 * u * (1 + torch.erf(u / math.sqrt(2))),
    "silu": lambda u: u / (1 + torch.exp(-u)),
}

KINDS = [
    pytest.param(PointwiseFFN, {}, "relu", D, id="pointwise"),
    pytest.param(MLPFFN, {"mult": 2.5, "activation": "relu"}, "relu", 15, id="mlp-relu"),
    pytest.param(MLPFFN, {"mult": 2.0}, "gelu", 12, id="mlp-gelu-default"),
]


def reference(ffn, x: Tensor, activation: str) -> Tensor:
    """``W₂ σ(W₁ x + b₁) + b₂`` with the module's own weights."""
    u = torch.einsum("bnd,kd->bnk", x, ffn.w1.weight) + ffn.w1.bias
    return torch.einsum("bnk,dk->bnd", HAND_ACTIVATIONS[activation](u), ffn.w2.weight) + ffn.w2.bias


@pytest.mark.parametrize("kind, options, activation, hidden", KINDS)
def test_matches_reference(build, kind, options, activation, hidden):
    ffn = build(kind, D, **options)
    assert ffn.w1.weight.shape == (hidden, D) and ffn.w2.weight.shape == (D, hidden)
    x = torch.randn(2, 5, D, dtype=torch.float64)
    torch.testing.assert_close(ffn(x), reference(ffn, x, activation))


@pytest.mark.parametrize("kind, options, activation, hidden", KINDS)
def test_position_wise(build, position_wise, kind, options, activation, hidden):
    ffn = build(kind, D, **options)
    position_wise(ffn, torch.randn(2, 5, D, dtype=torch.float64))


@pytest.mark.parametrize("kind, options, activation, hidden", KINDS)
def test_padding_invariance(build, make_tokens, padding_invariant, kind, options, activation, hidden):
    ffn = build(kind, D, **options)
    x = torch.randn(2, 5, D, dtype=torch.float64)
    padding_invariant(lambda x, tokens: ffn(x), x, make_tokens([5, 3], 5, causal=True))


@pytest.mark.parametrize("kind, options", [(PointwiseFFN, {}), (MLPFFN, {"activation": "gelu", "mult": 1.5})])
def test_gradcheck(build, gradcheck_all, kind, options):
    ffn = build(kind, 4, **options)
    gradcheck_all(ffn, ffn, torch.randn(2, 3, 4, dtype=torch.float64))


@pytest.mark.parametrize("kind", [PointwiseFFN, MLPFFN])
def test_dropout_defaults_to_model_dropout(build, kind):
    assert build(kind, D, model_dropout=0.3).dropout.p == 0.3
    assert build(kind, D, model_dropout=0.3, dropout=0.1).dropout.p == 0.1


def test_dropout_acts_on_the_hidden_units(build):
    ffn = build(PointwiseFFN, D, dropout=0.5).train()
    x = torch.randn(2, 5, D, dtype=torch.float64)
    u = (torch.einsum("bnd,kd->bnk", x, ffn.w1.weight) + ffn.w1.bias).clamp(min=0)
    # W₂ is square for pointwise: recover the hidden units after dropout from the output.
    hidden = torch.linalg.solve(ffn.w2.weight, (ffn(x) - ffn.w2.bias).unsqueeze(-1)).squeeze(-1)
    dropped = hidden.abs() < 1e-9
    assert (dropped & (u > 0)).any(), "no live hidden unit was dropped"
    torch.testing.assert_close(hidden[~dropped], 2 * u[~dropped])  # kept units scale by 1 / (1 − p)
    ffn.eval()
    torch.testing.assert_close(ffn(x), reference(ffn, x, "relu"))


def test_pointwise_output_dropout_drops_the_output(build):
    ffn = build(PointwiseFFN, D, output_dropout=0.5).train()  # hidden dropout 0: the model's
    x = torch.randn(2, 5, D, dtype=torch.float64)
    torch.manual_seed(1)
    y = ffn(x)
    torch.testing.assert_close(y, reference(ffn, x, "relu") * dropout_mask(1, x.shape, 0.5))
    assert build(PointwiseFFN, D).output_dropout.p == 0.0  # off unless asked for


def test_unknown_activation_is_rejected(build):
    with pytest.raises(pydantic.ValidationError, match="activation"):
        build(MLPFFN, D, activation="swish")


# -- gated linear units --------------------------------------------------------------------

GLUS = [
    pytest.param(SwiGLU, "silu", id="swiglu"),
    pytest.param(GEGLU, "gelu", id="geglu"),
    pytest.param(ReGLU, "relu", id="reglu"),
]


def linear(x: Tensor, layer: nn.Linear) -> Tensor:
    """``x Wᵀ + b`` written out."""
    y = torch.einsum("...i,oi->...o", x, layer.weight)
    return y if layer.bias is None else y + layer.bias


def gated(glu, x: Tensor, activation: str) -> Tensor:
    """``W_down(σ(W_gate x) ⊙ W_up x)`` with the module's own weights."""
    return linear(HAND_ACTIVATIONS[activation](linear(x, glu.gate)) * linear(x, glu.up), glu.down)


@pytest.mark.parametrize(
    "dim, multiple_of, hidden",
    [
        (512, 64, 1408),  # ⌊2/3 · 2048⌋ = 1365 → 22 · 64
        (768, 64, 2048),  # 2048 is already a multiple
        (64, 64, 192),  # 170 → 3 · 64
        (50, 64, 192),  # 133 → 3 · 64
        (6, 64, 64),  # 16 → 64
        (64, 1, 170),  # no rounding: ⌊170.67⌋
        (64, 16, 176),  # 170 → 11 · 16
        (12, 8, 32),  # 32 exactly
        (10, 8, 32),  # ⌊26.67⌋ = 26 → 4 · 8
    ],
)
def test_glu_hidden_rounding(dim, multiple_of, hidden):
    assert glu_hidden(dim, multiple_of) == hidden


@pytest.mark.parametrize("kind, activation", GLUS)
def test_glu_hidden_width_in_the_module(build, kind, activation):
    glu = build(kind, 50)
    assert glu.gate.weight.shape == glu.up.weight.shape == (192, 50) and glu.down.weight.shape == (50, 192)
    assert build(kind, 50, multiple_of=8).gate.weight.shape == (136, 50)
    assert build(kind, 50, hidden=7).down.weight.shape == (50, 7)


@pytest.mark.parametrize("kind, activation", GLUS)
@pytest.mark.parametrize("options", [{}, {"hidden": 5, "bias": True}], ids=["default", "bias"])
def test_glu_matches_reference(build, kind, activation, options):
    glu = build(kind, D, **options)
    assert (glu.gate.bias is None) == (not options)
    x = torch.randn(2, 5, D, dtype=torch.float64)
    torch.testing.assert_close(glu(x), gated(glu, x, activation))


@pytest.mark.parametrize("kind, activation", GLUS)
def test_glu_position_wise_and_padding(
    build, position_wise, make_tokens, padding_invariant, kind, activation
):
    glu = build(kind, D, hidden=8)
    x = torch.randn(2, 5, D, dtype=torch.float64)
    position_wise(glu, x)
    padding_invariant(lambda x, tokens: glu(x), x, make_tokens([5, 3], 5, causal=True))


@pytest.mark.parametrize("kind", [SwiGLU, GEGLU, ReGLU, MFFN])
def test_glu_gradcheck(build, gradcheck_all, kind):
    options = {"ffn_multiply": 1.5, "bias": True} if kind is MFFN else {"hidden": 3, "bias": True}
    glu = build(kind, 4, **options)
    gradcheck_all(glu, glu, torch.randn(2, 3, 4, dtype=torch.float64))


def dropout_mask(seed: int, shape: tuple[int, ...], p: float) -> Tensor:
    """The mask :func:`ablate.components.dropout` (the kinds' Dropout) draws first after
    ``torch.manual_seed(seed)``, scaled by 1 / (1 − p)."""
    torch.manual_seed(seed)
    return dropout(torch.ones(shape, dtype=torch.float64), p)


def test_swiglu_drops_its_output(build):
    glu = build(SwiGLU, D, hidden=8, model_dropout=0.5).train()
    x = torch.randn(2, 5, D, dtype=torch.float64)
    torch.manual_seed(1)
    y = glu(x)
    torch.testing.assert_close(y, gated(glu, x, "silu") * dropout_mask(1, x.shape, 0.5))
    assert build(SwiGLU, D, model_dropout=0.3, dropout=0.1).dropout.p == 0.1


@pytest.mark.parametrize("kind, activation", GLUS)
def test_glu_dropout_at_hidden_drops_the_gated_units_before_w_down(build, kind, activation):
    """FT-Transformer's / T2G-Former's FFN: ``W_down(dropout(σ(W_gate x) ⊙ W_up x))``, the mask
    over the hidden width k, not the output width d."""
    glu = build(kind, D, hidden=8, bias=True, dropout=0.5, dropout_at="hidden").train()
    x = torch.randn(2, 5, D, dtype=torch.float64)
    torch.manual_seed(1)
    y = glu(x)
    units = HAND_ACTIVATIONS[activation](linear(x, glu.gate)) * linear(x, glu.up)  # [2, 5, 8]
    torch.testing.assert_close(y, linear(units * dropout_mask(1, units.shape, 0.5), glu.down))
    assert not torch.allclose(y, gated(glu, x, activation) * dropout_mask(1, x.shape, 0.5))
    glu.eval()
    torch.testing.assert_close(glu(x), gated(glu, x, activation))


# -- FuXi-α MFFN -----------------------------------------------------------------------------


def test_mffn_is_a_swiglu_of_width_ffn_multiply_d(build):
    mffn = build(MFFN, D)
    assert mffn.gate.weight.shape == (D, D) and mffn.down.weight.shape == (D, D)  # ffn_multiply = 1
    assert all(layer.bias is None for layer in (mffn.gate, mffn.up, mffn.down))
    mffn = build(MFFN, D, ffn_multiply=4.0)
    assert mffn.gate.weight.shape == mffn.up.weight.shape == (4 * D, D)
    x = torch.randn(2, 5, D, dtype=torch.float64)
    torch.testing.assert_close(mffn(x), gated(mffn, x, "silu"))


def test_mffn_xavier_uniform_init(build):
    mffn = build(MFFN, 100, ffn_multiply=4.0)
    bound = math.sqrt(6 / (100 + 400))  # Xavier-uniform: U(−a, a), a = √(6 / (fan_in + fan_out))
    for layer in (mffn.gate, mffn.up, mffn.down):
        w = layer.weight
        assert w.abs().max() <= bound and w.abs().max() > 0.95 * bound
        assert abs(w.var().item() - bound**2 / 3) < 0.1 * bound**2 / 3


def test_mffn_drops_its_input(build):
    mffn = build(MFFN, D, model_dropout=0.5).train()
    x = torch.randn(2, 5, D, dtype=torch.float64)
    torch.manual_seed(1)
    y = mffn(x)
    torch.testing.assert_close(y, gated(mffn, x * dropout_mask(1, x.shape, 0.5), "silu"))


def test_mffn_in_a_pre_rmsnorm_residual_block_is_fuxi_stage_2(build):
    """FuXi-α stage 2: ``x = h + lin2(SiLU(lin1(ĥ)) ⊙ lin3(ĥ))``, ``ĥ = h / √(mean(h²) + eps)``."""
    mffn = build(MFFN, D, ffn_multiply=2.0)
    layer = PreNorm(build(RMSNorm, D), build(Residual, D))
    h = 3 * torch.randn(2, 5, D, dtype=torch.float64)
    h_hat = h / torch.sqrt((h * h).mean(-1, keepdim=True) + 1e-6)
    silu = HAND_ACTIVATIONS["silu"]
    fuxi = h + silu(h_hat @ mffn.gate.weight.T) * (h_hat @ mffn.up.weight.T) @ mffn.down.weight.T
    torch.testing.assert_close(layer(h, mffn), fuxi)


def test_mffn_output_dropout_drops_lin2s_output(build):
    """``output_dropout: p`` (0 by default): ``y = mask ⊙ lin2(…) / (1 − p)``, in training only."""
    assert build(MFFN, D, model_dropout=0.5).output_dropout.p == 0.0
    mffn = build(MFFN, D, dropout=0.0, output_dropout=0.5)
    x = torch.randn(2, 5, D, dtype=torch.float64)
    torch.testing.assert_close(mffn(x), gated(mffn, x, "silu"))
    mffn.train()
    torch.manual_seed(1)
    y = mffn(x)
    torch.testing.assert_close(y, gated(mffn, x, "silu") * dropout_mask(1, x.shape, 0.5))


def test_mffn_block_with_fuxis_dropout_sites_in_training(build):
    """FuXi-α stage 2 in training: ``x = h + lin2(SiLU(lin1(ĥ)) ⊙ lin3(ĥ))``, ``ĥ = dropout(h /
    √(mean(h²) + eps))`` with no learned gain and no dropout after lin2: ``rmsnorm`` with
    ``affine: false`` and the residual connection's ``dropout: 0``."""
    mffn = build(MFFN, D, model_dropout=0.5).train()
    layer = PreNorm(
        build(RMSNorm, D, affine=False), build(Residual, D, model_dropout=0.5, dropout=0.0)
    ).train()
    assert list(layer.parameters()) == []
    h = 3 * torch.randn(2, 5, D, dtype=torch.float64)
    h_hat = h / torch.sqrt((h * h).mean(-1, keepdim=True) + 1e-6) * dropout_mask(1, h.shape, 0.5)
    silu = HAND_ACTIVATIONS["silu"]
    fuxi = h + silu(h_hat @ mffn.gate.weight.T) * (h_hat @ mffn.up.weight.T) @ mffn.down.weight.T
    torch.manual_seed(1)
    torch.testing.assert_close(layer(h, mffn), fuxi)


def test_mffn_position_wise_and_padding(build, position_wise, make_tokens, padding_invariant):
    mffn = build(MFFN, D, ffn_multiply=2.0)
    x = torch.randn(2, 5, D, dtype=torch.float64)
    position_wise(mffn, x)
    padding_invariant(lambda x, tokens: mffn(x), x, make_tokens([5, 3], 5, causal=True))


# -- no FFN ------------------------------------------------------------------------------------


def test_no_ffn_contributes_nothing(build):
    ffn = build(NoFFN, D)
    assert list(ffn.parameters()) == []
    x = torch.randn(2, 5, D, dtype=torch.float64, requires_grad=True)
    torch.testing.assert_close(ffn(x), torch.zeros_like(x))
    layer = PreNorm(build(NoNorm, D), build(Residual, D))
    out = layer(x, ffn)
    torch.testing.assert_close(out, x)
    out.sum().backward()  # the residual path still carries gradients
    torch.testing.assert_close(x.grad, torch.ones_like(x))


# -- mixture of experts --------------------------------------------------------------------------


def routing(moe, x: Tensor) -> tuple[list[list[float]], list[list[int]], list[list[float]]]:
    """Per token ``t`` (explicit loops): router probabilities ``p_t``, the ``k`` experts with the
    largest ``p``, and their weights (renormalised to sum 1 when the module normalises)."""
    W = moe.router.weight
    E, k = W.shape[0], moe.top_k
    probs, chosen, weights = [], [], []
    for t in range(x.shape[0]):
        logits = [sum(W[e, c] * x[t, c] for c in range(x.shape[1])) for e in range(E)]
        z = sum(torch.exp(logit) for logit in logits)
        p = [torch.exp(logit) / z for logit in logits]
        top = sorted(range(E), key=lambda e: -p[e].item())[:k]
        w = [p[e] for e in top]
        if moe.options.normalize_topk and k > 1:
            w = [v / sum(w) for v in w]
        probs.append(p), chosen.append(top), weights.append(w)
    return probs, chosen, weights


def moe_reference(moe, x: Tensor) -> Tensor:
    """``y_t = Σ_j w_tj · SwiGLU_{i_tj}(x_t) + Σ_s SwiGLU_s(x_t)``, token by token."""
    flat = x.reshape(-1, x.shape[-1])
    _, chosen, weights = routing(moe, flat)
    out = []
    for t in range(flat.shape[0]):
        y = sum(
            w * gated(moe.experts[e], flat[t], "silu") for e, w in zip(chosen[t], weights[t], strict=True)
        )
        y = y + sum((gated(s, flat[t], "silu") for s in moe.shared), torch.zeros_like(flat[t]))
        out.append(y)
    return torch.stack(out).reshape(x.shape)


def balance_reference(moe, x: Tensor, valid: Tensor) -> Tensor:
    """``alpha · E · Σ_e f_e P_e`` over the real tokens: ``f_e`` the share of routing slots that
    went to ``e``, ``P_e`` the mean router probability of ``e``."""
    flat, valid = x.reshape(-1, x.shape[-1]), valid.reshape(-1)
    probs, chosen, _ = routing(moe, flat)
    real = [t for t in range(flat.shape[0]) if valid[t]]
    E, k = len(moe.experts), moe.top_k
    loss = 0.0
    for e in range(E):
        f = sum(chosen[t].count(e) for t in real) / (len(real) * k)
        P = sum(probs[t][e] for t in real) / len(real)
        loss = loss + f * P
    return moe.options.alpha * E * loss


MOES = [
    pytest.param({"experts": 4, "top_k": 2}, id="E4-k2"),
    pytest.param({"experts": 3, "top_k": 1}, id="E3-k1"),
    pytest.param(
        {"experts": 4, "top_k": 3, "shared_experts": 1, "normalize_topk": False}, id="E4-k3-shared-raw"
    ),
    pytest.param({"experts": 2, "top_k": 2, "shared_experts": 2, "bias": True}, id="E2-k2-2shared-bias"),
]


@pytest.mark.parametrize("options", MOES)
def test_moe_matches_reference(build, options):
    moe = build(MoEFFN, D, hidden=5, **options)
    x = torch.randn(2, 5, D, dtype=torch.float64)
    torch.testing.assert_close(moe(x), moe_reference(moe, x))


def test_moe_expert_widths(build):
    moe = build(MoEFFN, 50, shared_experts=1)
    assert len(moe.experts) == 4 and len(moe.shared) == 1 and moe.router.weight.shape == (4, 50)
    for expert in [*moe.experts, *moe.shared]:
        assert isinstance(expert, SwiGLU) and expert.gate.weight.shape == (192, 50)
    assert build(MoEFFN, 50, hidden=9).experts[0].down.weight.shape == (50, 9)


def test_moe_with_idle_experts(build):
    """A router that sends every token to experts 0 and 1 leaves 2 and 3 with empty batches."""
    moe = build(MoEFFN, D, hidden=5)
    with torch.no_grad():
        moe.router.weight.zero_()
        moe.router.weight[:2, 0] = torch.tensor([2.0, 1.0])
    x = torch.randn(3, 4, D, dtype=torch.float64)
    x[..., 0] = x[..., 0].abs() + 1
    torch.testing.assert_close(moe(x), moe_reference(moe, x))


def test_moe_position_wise_in_eval(build, position_wise, make_tokens, padding_invariant):
    moe = build(MoEFFN, D, hidden=5, shared_experts=1)
    x = torch.randn(2, 5, D, dtype=torch.float64)
    position_wise(moe, x)
    padding_invariant(lambda x, tokens: moe(x), x, make_tokens([5, 3], 5, causal=True))


def test_moe_gradcheck(build, gradcheck_all):
    moe = build(MoEFFN, 3, experts=3, top_k=2, shared_experts=1, hidden=2)
    gradcheck_all(moe, moe, torch.randn(2, 2, 3, dtype=torch.float64))


def test_moe_training_grads_are_finite_for_every_parameter(build):
    moe = build(MoEFFN, D, hidden=5, shared_experts=1, alpha=0.1).train()
    x = torch.randn(2, 5, D, dtype=torch.float64)
    (moe(x).pow(2).mean() + moe.auxiliary_loss()).backward()
    for name, p in moe.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


def test_shared_expert_contributes_for_every_token(build):
    moe = build(MoEFFN, D, hidden=5, shared_experts=1)
    x = torch.randn(2, 5, D, dtype=torch.float64)
    with torch.no_grad():
        for expert in moe.experts:
            expert.down.weight.zero_()  # silence the routed experts
    y = moe(x)
    torch.testing.assert_close(y, gated(moe.shared[0], x, "silu"))
    assert (y.abs().sum(-1) > 0).all()


def test_top_k_above_experts_fails_validation(build):
    with pytest.raises(pydantic.ValidationError, match="top_k=3 .* 2 there are"):
        build(MoEFFN, D, experts=2, top_k=3)


# -- load-balancing loss ---------------------------------------------------------------------------


def test_balance_loss_matches_hand_formula_over_real_tokens(build):
    moe = build(MoEFFN, D, hidden=5, alpha=0.3).train()
    x = torch.randn(2, 5, D, dtype=torch.float64)
    valid = torch.arange(5)[None, :] < torch.tensor([5, 3])[:, None]
    moe(x, valid=valid)
    aux = moe.auxiliary_loss()
    assert aux.item() > 0
    torch.testing.assert_close(aux, balance_reference(moe, x, valid))
    # Without a mask every position counts, and padded positions change the statistics.
    moe(x)
    torch.testing.assert_close(moe.auxiliary_loss(), balance_reference(moe, x, torch.ones_like(valid)))
    assert not torch.isclose(moe.auxiliary_loss(), aux)


def test_balance_loss_reaches_the_router(build):
    moe = build(MoEFFN, D, hidden=5).train()
    moe(torch.randn(2, 5, D, dtype=torch.float64))
    moe.auxiliary_loss().backward()
    assert moe.router.weight.grad.abs().sum() > 0
    assert all(p.grad is None for p in moe.experts.parameters())  # f has no gradient, P only routes


def test_balance_loss_is_none_before_and_zero_in_eval(build):
    moe = build(MoEFFN, D, hidden=5)
    assert moe.auxiliary_loss() is None
    moe(torch.randn(2, 5, D, dtype=torch.float64))
    assert moe.auxiliary_loss().item() == 0.0
    moe.train()(torch.randn(2, 5, D, dtype=torch.float64))
    assert moe.auxiliary_loss().item() > 0


def expert_load(moe, x: Tensor) -> Tensor:
    """Share of tokens whose top-1 expert is ``e``, ``[E]``."""
    with torch.no_grad():
        top1 = moe.router(x).argmax(-1).flatten()
    return torch.bincount(top1, minlength=len(moe.experts)) / top1.numel()


def test_balance_loss_balances_a_skewed_router():
    """Tokens cluster around one direction that the router sends to expert 0. Training on a
    regression task alone keeps them there; a large balance weight spreads them out."""
    ctx = BuildContext(dim=4)
    x = torch.tensor([2.0, 0.0, 0.0, 0.0]) + 0.5 * torch.randn(128, 4)
    target = torch.tanh(x @ torch.randn(4, 4))

    def train(alpha: float) -> Tensor:
        torch.manual_seed(1)
        moe = MoEFFN(MoEFFN.Options(experts=4, top_k=1, hidden=8, alpha=alpha), ctx)
        with torch.no_grad():
            moe.router.weight[0] = torch.tensor([1.5, 0.0, 0.0, 0.0])
        opt = torch.optim.Adam(moe.parameters(), lr=0.02)
        for _ in range(40):
            opt.zero_grad()
            ((moe(x) - target).pow(2).mean() + moe.auxiliary_loss()).backward()
            opt.step()
        return expert_load(moe, x)

    skewed, balanced = train(0.0), train(1.0)
    assert skewed.max() > 0.9, skewed  # one expert takes (nearly) every token
    assert balanced.max() < 0.65 and (balanced > 0).sum() >= 3, balanced  # ~¼ each at seed 0


def test_backbone_sums_the_moe_losses():
    """Two blocks (no attention, no norm, residual) each with an MoE FFN."""

    class Silent(nn.Module):
        def forward(self, x: Tensor, tokens) -> Tensor:
            return torch.zeros_like(x)

    ctx = BuildContext(dim=D)

    def sublayer():
        return PreNorm(NoNorm(NoNorm.Options(), ctx), Residual(Residual.Options(), ctx))

    moes = [MoEFFN(MoEFFN.Options(hidden=5, alpha=0.2 * (i + 1)), ctx) for i in range(2)]
    blocks = [Block(Silent(), moe, sublayer(), sublayer()) for moe in moes]
    backbone = (
        Backbone(bias=[], stem=Stem(), blocks=blocks, final_norm=NoNorm(NoNorm.Options(), ctx), dropout=0.0)
        .double()
        .train()
    )
    assert backbone.auxiliary_loss() is None
    x = torch.randn(2, 5, D, dtype=torch.float64)
    valid = torch.ones(2, 5, dtype=torch.bool)
    backbone(x, TokenContext(valid=valid, causal=True, positions=torch.arange(5).expand(2, 5)))
    total = backbone.auxiliary_loss()
    torch.testing.assert_close(total, moes[0].auxiliary_loss() + moes[1].auxiliary_loss())
    torch.testing.assert_close(moes[0].auxiliary_loss(), balance_reference(moes[0], x, valid))
    total.backward()
    assert all(moe.router.weight.grad.abs().sum() > 0 for moe in moes)


@pytest.mark.parametrize(
    "name, kind",
    [
        ("swiglu", SwiGLU),
        ("geglu", GEGLU),
        ("reglu", ReGLU),
        ("moe", MoEFFN),
        ("mffn", MFFN),
        ("none", NoFFN),
    ],
)
def test_registered_under_their_names(name, kind):
    assert registry.get("ffn", name) is kind

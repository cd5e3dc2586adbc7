"""Connection kinds against hand-written math: ``x + f(x)``, hyper-connections, mHC.

Dimensions: ``b`` batch, ``n`` tokens, ``d`` model width, ``s`` residual streams.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import Tensor, nn

from ablate import kernels
from ablate.components import BuildContext, Stem
from ablate.model.blocks import Backbone, Block, PostNorm, PreNorm, PreNormSkip, PreNormSkipSource
from ablate.study.resolve import placement_problem
from ablate_plugins.attention import SoftmaxAttention
from ablate_plugins.connection import (
    HyperConnection,
    ManifoldHyperConnection,
    Residual,
    StreamStem,
    sinkhorn_knopp,
)

D, S = 6, 3


def branch(h: Tensor) -> Tensor:
    """A fixed position-wise sub-layer with a parameter-free non-linearity."""
    return torch.sin(3 * h) * h.sum(-1, keepdim=True)


def randomise(module: nn.Module) -> None:
    """Move every parameter away from its initial value (so no coefficient is trivially 0 or 1)."""
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.5 * torch.randn_like(p))


def rms(v: Tensor) -> Tensor:
    return v / torch.sqrt((v * v).mean() + torch.finfo(v.dtype).eps)


# ---------------------------------------------------------------------------------------------
# residual


def test_residual_matches_reference(build):
    residual = build(Residual, D)
    x = torch.randn(2, 5, D, dtype=torch.float64)
    torch.testing.assert_close(residual(x, branch), x + torch.sin(3 * x) * x.sum(-1, keepdim=True))


def test_residual_stem_is_identity():
    stem = Residual.stem(Residual.Options(), BuildContext(dim=D))
    x = torch.randn(2, 5, D, dtype=torch.float64)
    assert stem.expand(x) is x and stem.reduce(x) is x
    assert not list(stem.parameters())


def test_dropout_acts_on_the_branch_only(build):
    residual = build(Residual, D, model_dropout=0.5).train()
    x = torch.randn(2, 5, D, dtype=torch.float64)
    delta = residual(x, branch) - x
    # Each branch element is either dropped or scaled by 1 / (1 − p) = 2.
    kept = delta != 0
    assert kept.any() and (~kept).any()
    torch.testing.assert_close(delta[kept], 2 * branch(x)[kept])


@pytest.mark.parametrize("kind", [Residual, HyperConnection, ManifoldHyperConnection])
def test_dropout_defaults_to_model_dropout(build, kind):
    assert build(kind, D, model_dropout=0.3).dropout.p == 0.3
    assert build(kind, D, model_dropout=0.3, dropout=0.0).dropout.p == 0.0


def test_residual_gradcheck(build):
    # Residual has no parameters: give the branch one so gradients flow through both paths.
    residual = build(Residual, 4)
    w = torch.randn(4, 4, dtype=torch.float64, requires_grad=True)
    x = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w: residual(x, lambda h: torch.tanh(h @ w)), (x, w))


# ---------------------------------------------------------------------------------------------
# the shared multi-stream stem


@pytest.mark.parametrize("kind", [HyperConnection, ManifoldHyperConnection])
def test_stem_copies_into_streams_and_averages_back(kind):
    stem = kind.stem(kind.Options(streams=S), BuildContext(dim=D))
    x = torch.randn(2, 5, D, dtype=torch.float64)
    streams = stem.expand(x)
    assert streams.shape == (2, 5, S, D) and isinstance(stem, StreamStem)
    for i in range(S):
        torch.testing.assert_close(streams[:, :, i], x)
    y = torch.randn(2, 5, S, D, dtype=torch.float64)
    torch.testing.assert_close(stem.reduce(y), sum(y[:, :, i] for i in range(S)) / S)
    assert not list(stem.parameters())


# ---------------------------------------------------------------------------------------------
# hyper-connections


def hyper_reference(hc: HyperConnection, x: Tensor, f) -> Tensor:
    """Zhu et al., per token: ``x̄ = RMSNorm(rows of x)``; ``A_m = a_m + s_α tanh(x̄ W_m)``;
    ``A_r = A_r⁰ + s_α tanh(x̄ W_r)``; ``B = b + s_β tanh(x̄ W_β)ᵀ``;
    ``x ← A_rᵀ x + Bᵀ f(A_mᵀ x)`` — written with explicit loops."""
    b, n, s, d = x.shape
    out = torch.empty_like(x)
    for bi in range(b):
        for ti in range(n):
            h = x[bi, ti]  # [s, d]
            a_m, a_r, beta = hc.pre.clone(), hc.res.clone(), hc.post.clone()
            if hc.options.dynamic:
                for i in range(s):
                    hbar = rms(h[i])
                    a_m[i] = a_m[i] + hc.scale_alpha * torch.tanh(hbar @ hc.w_alpha[:, 0])
                    for j in range(s):
                        a_r[i, j] = a_r[i, j] + hc.scale_alpha * torch.tanh(hbar @ hc.w_alpha[:, 1 + j])
                    beta[i] = beta[i] + hc.scale_beta * torch.tanh(hbar @ hc.w_beta[:, 0])
            branch_in = sum(a_m[i] * h[i] for i in range(s))
            y = f(branch_in[None, None])[0, 0]
            for j in range(s):
                out[bi, ti, j] = sum(a_r[i, j] * h[i] for i in range(s)) + beta[j] * y
    return out


@pytest.mark.usefixtures("kernel_form")
@pytest.mark.parametrize("dynamic", [True, False])
def test_hyper_matches_reference(build, dynamic):
    hc = build(HyperConnection, D, streams=S, dynamic=dynamic)
    randomise(hc)
    x = torch.randn(2, 4, S, D, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(hc(x, branch), hyper_reference(hc, x, branch))


def test_hyper_initial_coefficients(build):
    hc = build(HyperConnection, D, streams=S)
    pre, post, res = hc.coefficients(torch.randn(2, 3, S, D, dtype=torch.float64))
    k = int(hc.pre.argmax())
    torch.testing.assert_close(pre, torch.eye(S, dtype=torch.float64)[k].expand(2, 3, S))
    torch.testing.assert_close(post, torch.ones(2, 3, S, dtype=torch.float64))
    torch.testing.assert_close(res, torch.eye(S, dtype=torch.float64).expand(2, 3, S, S))
    assert {name for name, _ in hc.named_parameters()} == {
        "pre",
        "res",
        "post",
        "w_alpha",
        "w_beta",
        "scale_alpha",
        "scale_beta",
    }
    static = build(HyperConnection, D, streams=S, dynamic=False)
    assert {name for name, _ in static.named_parameters()} == {"pre", "res", "post"}


class MixTokens(nn.Module):
    """A causal token mixer (``Attention``'s interface): running mean of ``tanh(h W)``."""

    def __init__(self, d: int):
        super().__init__()
        self.w = nn.Linear(d, d)

    def forward(self, h: Tensor, tokens) -> Tensor:
        v = torch.tanh(self.w(h))
        return v.cumsum(1) / torch.arange(1, h.shape[1] + 1, dtype=h.dtype)[:, None]


class FFN(nn.Module):
    """A position-wise map (``FeedForward``'s interface)."""

    def __init__(self, d: int):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, h: Tensor, valid: Tensor | None = None) -> Tensor:
        return self.net(h)


def backbone(
    connection: type, placement: type, blocks: int, modules: list[nn.Module], final_norm: nn.Module, **options
) -> Backbone:
    """``blocks`` blocks sharing copies of the same attention / ffn / norm weights."""
    ctx = BuildContext(dim=D)
    opts = connection.Options(**options)
    made = []
    for i in range(blocks):
        attention, ffn, norm = (copy.deepcopy(m) for m in modules[3 * i : 3 * i + 3])
        made.append(
            Block(
                attention,
                ffn,
                placement(copy.deepcopy(norm), connection(opts, ctx)),
                placement(copy.deepcopy(norm), connection(opts, ctx)),
            )
        )
    stem = connection.stem(opts, ctx)
    return Backbone([], stem, made, copy.deepcopy(final_norm), dropout=0.0).double().eval()


@pytest.mark.parametrize("placement", [PreNorm, PostNorm])
@pytest.mark.parametrize("final_norm", ["layernorm", "none"])
def test_hyper_at_init_is_the_residual_backbone(make_tokens, placement, final_norm):
    """expand → (norm → attention, norm → ffn) × 2 → reduce → final norm, with the same weights."""
    modules = [m for _ in range(2) for m in (MixTokens(D), FFN(D), nn.LayerNorm(D))]
    final = nn.LayerNorm(D) if final_norm == "layernorm" else nn.Identity()
    plain = backbone(Residual, placement, 2, modules, final)
    hyper = backbone(HyperConnection, placement, 2, modules, final, streams=4)
    tokens = make_tokens([5, 3], 5, causal=True)
    x = torch.randn(2, 5, D, dtype=torch.float64)
    with torch.no_grad():
        expected = plain(x, tokens)
        torch.testing.assert_close(hyper(x, tokens), expected)
        # Once the dynamic scales move, the streams separate and the outputs differ.
        for m in hyper.modules():
            if isinstance(m, HyperConnection):
                m.scale_alpha.fill_(0.5)
        assert not torch.allclose(hyper(x, tokens), expected)


def test_placements_by_their_formulas():
    """pre: x + f(LN x); post: LN(x + f x); pre_skip (SASRec's code): LN x + f(LN x)."""
    ctx = BuildContext(dim=D)
    norm, f = nn.LayerNorm(D).double(), FFN(D).double()
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.uniform_(-0.5, 0.5)
    x = torch.randn(2, 5, D, dtype=torch.float64)

    def ln(t):
        centred = t - t.mean(-1, keepdim=True)
        return centred / (t.var(-1, unbiased=False, keepdim=True) + 1e-5).sqrt() * norm.weight + norm.bias

    expected = {PreNorm: x + f(ln(x)), PostNorm: ln(x + f(x)), PreNormSkip: ln(x) + f(ln(x))}
    with torch.no_grad():
        for placement, value in expected.items():
            torch.testing.assert_close(placement(norm, Residual(Residual.Options(), ctx))(x, f), value)
        # pre_skip_kv's attention sub-layer: LN x + f(LN x, source = x).
        g = lambda h, source: f(h) * source.tanh()  # noqa: E731
        placed = PreNormSkipSource(norm, Residual(Residual.Options(), ctx))(x, g)
        torch.testing.assert_close(placed, ln(x) + f(ln(x)) * x.tanh())


def test_hyper_sublayer_l_reads_stream_l_mod_s_at_init():
    """The paper's initialisation: sub-layer l reads stream l mod s (one-hot H_pre)."""
    for layer in range(2 * S + 1):
        ctx = BuildContext(dim=D, layer=layer)
        conn = HyperConnection(HyperConnection.Options(streams=S), ctx)
        assert torch.equal(conn.pre.detach(), torch.eye(S)[layer % S])


@pytest.mark.parametrize("read", ["one-hot", "average"])
def test_static_hyper_streams_separate_only_from_one_hot_reads(build, read):
    """One SGD step on two static sub-layers reading different streams makes the streams differ;
    with averaging reads every coefficient stays symmetric and the streams stay equal copies."""
    first, second = (build(HyperConnection, D, streams=S, dynamic=False) for _ in range(2))
    with torch.no_grad():
        for conn, k in ((first, 0), (second, 1)):
            conn.pre.copy_(torch.eye(S)[k] if read == "one-hot" else torch.full((S,), 1 / S))
    stem = HyperConnection.stem(first.options, first.ctx)
    w = torch.randn(D, D, dtype=torch.float64)
    x = torch.randn(2, 4, D, dtype=torch.float64)
    loss = stem.reduce(second(first(stem.expand(x), torch.tanh), lambda h: torch.sin(h @ w))).pow(2).sum()
    loss.backward()
    with torch.no_grad():
        for conn in (first, second):
            for p in conn.parameters():
                p.sub_(0.1 * p.grad)
        streams = first(stem.expand(x), torch.tanh)
    equal = all(torch.allclose(streams[:, :, i], streams[:, :, 0]) for i in range(S))
    assert equal == (read == "average")


def test_hyper_block_at_init_is_a_prenorm_residual_block():
    """One sub-layer, the brief's form: PreNorm(norm, Residual) vs PreNorm(norm, hyper) + stem."""
    ctx = BuildContext(dim=D)
    norm, f = nn.LayerNorm(D).double(), FFN(D).double()
    plain = PreNorm(norm, Residual(Residual.Options(), ctx))
    opts = HyperConnection.Options(streams=4)
    hyper = PreNorm(norm, HyperConnection(opts, ctx).double())
    stem = HyperConnection.stem(opts, ctx)
    x = torch.randn(2, 5, D, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(stem.reduce(hyper(stem.expand(x), f)), plain(x, f))


# ---------------------------------------------------------------------------------------------
# Sinkhorn-Knopp and mHC


@pytest.fixture(params=["kernel", "torch"])
def kernel_form(request, monkeypatch):
    """A test run on the fused kernels (Sinkhorn, stream mixing; where built) and on torch's ops."""
    if request.param == "kernel" and kernels.library() is None:
        pytest.skip("no C compiler: the fused kernels are not built")
    if request.param == "torch":
        monkeypatch.setattr(kernels, "takes_all", lambda *tensors: False)
    return request.param


@pytest.mark.usefixtures("kernel_form")
def test_sinkhorn_one_iteration_by_hand():
    # M = [[1, 2], [3, 4]]; columns: sums 4, 6 → [[1/4, 1/3], [3/4, 2/3]];
    # rows: sums 7/12, 17/12 → [[3/7, 4/7], [9/17, 8/17]].
    m = torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.float64)
    expected = torch.tensor([[3 / 7, 4 / 7], [9 / 17, 8 / 17]], dtype=torch.float64)
    torch.testing.assert_close(sinkhorn_knopp(m.log(), iters=1), expected)


@pytest.mark.usefixtures("kernel_form")
def test_sinkhorn_limit_by_hand():
    # A 2×2 doubly stochastic matrix is [[p, 1 − p], [1 − p, p]]; diagonal scaling keeps the
    # cross ratio m11·m22 / (m12·m21) = 4/6, so p² / (1 − p)² = 2/3 and p = √2 / (√2 + √3).
    m = torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.float64)
    p = math.sqrt(2) / (math.sqrt(2) + math.sqrt(3))
    expected = torch.tensor([[p, 1 - p], [1 - p, p]], dtype=torch.float64)
    torch.testing.assert_close(sinkhorn_knopp(m.log(), iters=20), expected, atol=1e-6, rtol=0)


@pytest.mark.usefixtures("kernel_form")
def test_sinkhorn_is_doubly_stochastic_batched():
    # t_max = 20 reaches 1e-3 for logits spread on the order of 1 (sharper ones need more).
    logits = torch.randn(7, 5, 4, 4, dtype=torch.float64)
    h = sinkhorn_knopp(logits)
    assert h.shape == logits.shape and (h > 0).all()
    torch.testing.assert_close(h.sum(-1), torch.ones(7, 5, 4, dtype=torch.float64), atol=1e-3, rtol=0)
    torch.testing.assert_close(h.sum(-2), torch.ones(7, 5, 4, dtype=torch.float64), atol=1e-3, rtol=0)
    # Large logits do not overflow (the per-matrix maximum is subtracted first).
    assert torch.isfinite(sinkhorn_knopp(torch.full((2, 2), 1e4) + torch.eye(2))).all()


def mhc_reference(m: ManifoldHyperConnection, x: Tensor, f) -> Tensor:
    """DeepSeek mHC per token: ``x̃ = RMSNorm(vec x)``; ``H_pre = σ(α_pre x̃φ_pre + b_pre)``;
    ``H_post = 2σ(α_post x̃φ_post + b_post)``; ``H_res = SK(exp(α_res mat(x̃φ_res) + b_res))``
    with 20 × (columns, rows); ``x ← H_res x + H_postᵀ f(H_pre x)``."""
    b, n, s, d = x.shape
    phi_pre, phi_post, phi_res = m.phi[:, :s], m.phi[:, s : 2 * s], m.phi[:, 2 * s :]
    out = torch.empty_like(x)
    for bi in range(b):
        for ti in range(n):
            h = x[bi, ti]
            xt = rms(h.reshape(-1))
            pre = torch.sigmoid(m.alpha[0] * (xt @ phi_pre) + m.b_pre)
            post = 2 * torch.sigmoid(m.alpha[1] * (xt @ phi_post) + m.b_post)
            res = torch.exp(m.alpha[2] * (xt @ phi_res).reshape(s, s) + m.b_res)
            for _ in range(20):
                res = res / res.sum(0, keepdim=True)
                res = res / res.sum(1, keepdim=True)
            y = f((pre @ h)[None, None])[0, 0]
            out[bi, ti] = res @ h + post[:, None] * y[None, :]
    return out


@pytest.mark.usefixtures("kernel_form")
def test_mhc_matches_reference(build):
    m = build(ManifoldHyperConnection, D, streams=S)
    randomise(m)
    x = torch.randn(2, 4, S, D, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(m(x, branch), mhc_reference(m, x, branch))


@pytest.mark.parametrize("alpha", [0.01, 0.3])
@pytest.mark.parametrize("b_res", ["init", "zero"])
def test_mhc_residual_mixing_is_doubly_stochastic(build, alpha, b_res):
    m = build(ManifoldHyperConnection, D, streams=4, alpha=alpha)
    if b_res == "zero":
        with torch.no_grad():
            m.b_res.zero_()
    pre, post, res = m.coefficients(10 * torch.randn(3, 7, 4, D, dtype=torch.float64))
    assert res.shape == (3, 7, 4, 4) and (res >= 0).all()
    ones = torch.ones(3, 7, 4, dtype=torch.float64)
    torch.testing.assert_close(res.sum(-1), ones, atol=1e-3, rtol=0)
    torch.testing.assert_close(res.sum(-2), ones, atol=1e-3, rtol=0)
    assert ((pre > 0) & (pre < 1)).all() and ((post > 0) & (post < 2)).all()


def test_mhc_initialisation(build):
    m = build(ManifoldHyperConnection, D, streams=4)
    torch.testing.assert_close(m.alpha, torch.full((3,), 0.01, dtype=torch.float64))
    assert build(ManifoldHyperConnection, D, alpha=0.1).alpha.detach().tolist() == pytest.approx([0.1] * 3)
    with torch.no_grad():
        m.alpha.zero_()
        pre, post, res = m.coefficients(torch.randn(1, 2, 4, D, dtype=torch.float64))
    torch.testing.assert_close(pre, torch.full((1, 2, 4), 0.25, dtype=torch.float64))
    torch.testing.assert_close(post, torch.ones(1, 2, 4, dtype=torch.float64))
    # b_res = 2·I: H_res = (e² I + (J − I)) / (e² + 3), leaning to the identity.
    expected = (math.e**2 * torch.eye(4) + (1 - torch.eye(4))) / (math.e**2 + 3)
    torch.testing.assert_close(res, expected.double().expand(1, 2, 4, 4))


def test_mhc_with_zero_gates_is_the_residual_backbone(make_tokens):
    # With α = 0, H_pre averages the (equal) streams, H_post = 1, and a row-stochastic H_res
    # maps equal streams to themselves: the plain residual backbone, exactly.
    modules = [m for _ in range(2) for m in (MixTokens(D), FFN(D), nn.LayerNorm(D))]
    plain = backbone(Residual, PreNorm, 2, modules, nn.Identity())
    mhc = backbone(ManifoldHyperConnection, PreNorm, 2, modules, nn.Identity(), streams=4, alpha=0.0)
    tokens = make_tokens([5, 3], 5, causal=True)
    x = torch.randn(2, 5, D, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(mhc(x, tokens), plain(x, tokens))


# ---------------------------------------------------------------------------------------------
# shared properties of the multi-stream kinds


@pytest.mark.parametrize("kind", [Residual, HyperConnection, ManifoldHyperConnection])
def test_position_wise(build, position_wise, kind):
    conn = build(kind, D) if kind is Residual else build(kind, D, streams=S)
    randomise(conn)
    shape = (2, 5, D) if kind is Residual else (2, 5, S, D)
    with torch.no_grad():
        position_wise(lambda x: conn(x, branch), torch.randn(*shape, dtype=torch.float64))


@pytest.mark.parametrize("kind", [Residual, HyperConnection, ManifoldHyperConnection])
def test_padding_invariance(build, make_tokens, padding_invariant, kind):
    conn = build(kind, D) if kind is Residual else build(kind, D, streams=S)
    randomise(conn)
    shape = (2, 5, D) if kind is Residual else (2, 5, S, D)
    with torch.no_grad():
        padding_invariant(
            lambda x, tokens: conn(x, branch),
            torch.randn(*shape, dtype=torch.float64),
            make_tokens([5, 3], 5, causal=True),
        )


@pytest.mark.parametrize("kind", [HyperConnection, ManifoldHyperConnection])
def test_gradcheck(build, gradcheck_all, kind):
    conn = build(kind, 3, streams=2)
    randomise(conn)
    w = torch.randn(3, 3, dtype=torch.float64)
    gradcheck_all(
        conn, lambda x: conn(x, lambda h: torch.tanh(h @ w)), torch.randn(2, 2, 2, 3, dtype=torch.float64)
    )


@pytest.mark.parametrize("kind", [HyperConnection, ManifoldHyperConnection])
def test_every_parameter_gets_a_gradient_at_init(build, kind):
    conn = build(kind, D, streams=S)
    w = torch.randn(D, D, dtype=torch.float64)
    x = torch.randn(2, 4, D, dtype=torch.float64)
    streams = kind.stem(conn.options, conn.ctx).expand(x) + 0.1 * torch.randn(2, 4, S, D, dtype=torch.float64)
    conn(streams, lambda h: torch.tanh(h @ w)).pow(2).sum().backward()
    for name, p in conn.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        # hyper: the dynamic projections start behind zero scales, so only the scales move first.
        if not name.startswith("w_"):
            assert p.grad.abs().sum() > 0, name


# ---------------------------------------------------------------------------------------------
# ``single_stream``: the declaration the pre_skip_kv placement check reads


def test_multi_stream_kinds_declare_it():
    assert Residual.single_stream
    assert not HyperConnection.single_stream and not ManifoldHyperConnection.single_stream


class OwnStem(Residual):
    """A third-party kind written before ``single_stream`` was declared: a stem of its own."""

    @classmethod
    def stem(cls, options, ctx: BuildContext) -> Stem:
        return StreamStem(2)


class DeclaredSingle(OwnStem):
    single_stream = True

    @classmethod
    def stem(cls, options, ctx: BuildContext) -> Stem:
        return Stem()


def test_the_placement_check_reads_the_declaration():
    assert not OwnStem.single_stream and DeclaredSingle.single_stream
    problem = placement_problem("pre_skip_kv", SoftmaxAttention, OwnStem)
    assert problem is not None and "keeps several streams; use placement 'pre_skip'" in problem
    assert placement_problem("pre_skip_kv", SoftmaxAttention, DeclaredSingle) is None
    assert placement_problem("pre_skip_kv", SoftmaxAttention, Residual) is None
    assert placement_problem("pre_skip", SoftmaxAttention, HyperConnection) is None


@pytest.mark.parametrize("kind", ["hyper", "mhc"])
def test_pre_skip_kv_with_several_streams_is_a_one_line_error(write_study, cli, kind):
    path = write_study(
        {"model": {"norm": {"kind": "layernorm", "placement": "pre_skip_kv"}, "connection": {"kind": kind}}}
    )
    code, _, err = cli("validate", path)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert (
        f"'pre_skip_kv' needs a single-stream connection (residual), but connection kind '{kind}' "
        f"keeps several streams; use placement 'pre_skip'"
    ) in err

"""FR-Graph (T2G-Former) and masked channel (DUET) attention against hand-written float64 math.

Dimensions: ``b`` batch, ``n`` tokens, ``h`` heads, ``e`` head width, ``d = h·e`` model width,
``w`` lookback window, ``f = ⌊w/2⌋ + 1`` rfft length.

Both kinds mix *unordered* token sets (tabular features, forecasting channels). The
"no future leak" property of the causal kinds does not apply: they refuse causal use and
ordered builds, which is tested instead. Their hard 0/1 masks are piecewise constant, so
gradchecks perturb only what leaves the mask fixed; the straight-through surrogate gradients
are checked against their own formulas.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor, nn

from ablate.components import BuildContext, TokenContext
from ablate_plugins.graph_attention import (
    MASKED_LOGIT,
    NO_EDGE_LOGIT,
    ChannelMaskedAttention,
    FRGraphAttention,
    fr_adjacency,
    gumbel_mask,
    mahalanobis_probabilities,
    threshold_mask,
)

LENGTHS, N, D, W = [5, 3], 5, 8, 8
F64 = torch.float64


# -- helpers: unordered (non-causal) token sets ------------------------------------------


@pytest.fixture
def build_set():
    """``build_set(Kind, dim, max_len=16, **options)``: float64, eval mode, unordered context."""

    def make(kind, dim, max_len=16, model_dropout=0.0, **options):
        ctx = BuildContext(
            dim=dim,
            dropout=model_dropout,
            max_len=max_len,
            ordered=False,
            features=frozenset({"values", "readout"}),
        )
        return kind(kind.Options(**options), ctx).double().eval()

    return make


def set_tokens(lengths, n, values=None, readout=None, positions=None) -> TokenContext:
    """A right-padded batch of unordered tokens (``causal=False``)."""
    i = torch.arange(n)
    valid = i[None, :] < torch.tensor(lengths)[:, None]
    positions = i.expand(len(lengths), n).clone() if positions is None else positions
    return TokenContext(valid=valid, causal=False, positions=positions, values=values, readout=readout)


def cls_readout(b, n) -> Tensor:
    """Token 0 of each row is the readout ([CLS]) token."""
    r = torch.zeros(b, n, dtype=torch.bool)
    r[:, 0] = True
    return r


def pad(x: Tensor, tokens: TokenContext, extra: int) -> tuple[Tensor, TokenContext]:
    """Append ``extra`` padded tokens (garbage inputs and values, never readout)."""
    b, n = tokens.shape
    x = torch.cat([x, 100 * torch.randn(b, extra, x.shape[-1], dtype=x.dtype)], dim=1)
    valid = torch.cat([tokens.valid, torch.zeros(b, extra, dtype=torch.bool)], dim=1)
    positions = torch.arange(n + extra).expand(b, n + extra).clone()
    values = readout = None
    if tokens.values is not None:
        v = tokens.values
        values = torch.cat([v, 100 * torch.randn(b, extra, v.shape[-1], dtype=v.dtype)], dim=1)
    if tokens.readout is not None:
        readout = torch.cat([tokens.readout, torch.zeros(b, extra, dtype=torch.bool)], dim=1)
    return x, TokenContext(valid=valid, causal=False, positions=positions, values=values, readout=readout)


def permute(tokens: TokenContext, perm: Tensor, slots_travel: bool = True) -> TokenContext:
    """Reorder the tokens of every row by ``perm``; a token keeps its slot when ``slots_travel``."""
    pick = lambda t: None if t is None else t[:, perm]  # noqa: E731
    positions = tokens.positions[:, perm] if slots_travel else tokens.positions
    return TokenContext(
        valid=tokens.valid[:, perm],
        causal=False,
        positions=positions,
        values=pick(tokens.values),
        readout=pick(tokens.readout),
    )


def linear(m: nn.Linear, t: Tensor) -> Tensor:
    return t @ m.weight.T + m.bias


def masked_softmax(logits: Tensor, valid: Tensor) -> Tensor:
    """Softmax over keys ``j`` with ``valid[b, j]`` or ``j = i``."""
    n = logits.shape[-1]
    allowed = valid[:, None, None, :] | torch.eye(n, dtype=torch.bool)
    z = logits.masked_fill(~allowed, float("-inf"))
    p = torch.exp(z - z.amax(-1, keepdim=True))
    return p / p.sum(-1, keepdim=True)


# =======================================================================================
# fr_graph
# =======================================================================================


def adjacency_loops(col_head, col_tail, bias, slots, readout) -> Tensor:
    """``A[b,h,i,j] = 1[σ(cos(E_head[slot_i], E_tail[slot_j]) + b) > 0.5]``, i ≠ j, j not readout."""
    b, n = slots.shape
    h = col_head.shape[0]
    A = torch.zeros(b, h, n, n, dtype=F64)
    for bb in range(b):
        for hh in range(h):
            for i in range(n):
                for j in range(n):
                    u, v = col_head[hh, slots[bb, i]], col_tail[hh, slots[bb, j]]
                    cos = float(u @ v) / (float(u.norm()) * float(v.norm()))
                    p = 1 / (1 + math.exp(-(cos + float(bias))))
                    into_readout = readout is not None and bool(readout[bb, j])
                    A[bb, hh, i, j] = float(p > 0.5 and i != j and not into_readout)
    return A


def fr_reference(
    attn: FRGraphAttention, x: Tensor, tokens: TokenContext, dropped: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """``(out, G)``: ``G = softmax(f_h diag(r) f_tᵀ/√e + (1 − A)(−1e4) + B)``, ``out = W_o(G̃ · x W_v)``
    with ``G̃ = G ⊙ dropped`` (``dropped``: the dropout's kept-and-scaled factors, or none)."""
    b, n, d = x.shape
    h = attn.heads
    e = d // h
    topo = attn.topology
    with torch.no_grad():
        fh = linear(attn.edges.w_head, x).reshape(b, n, h, e)
        ft = linear(attn.edges.w_tail, x).reshape(b, n, h, e)
        fv = linear(attn.value, x).reshape(b, n, h, e)
        weights = torch.einsum("bihe,he,bjhe->bhij", fh, attn.edges.rel, ft) / math.sqrt(e)
        A = adjacency_loops(topo.col_head, topo.col_tail, topo.bias, tokens.positions, tokens.readout)
        bias = 0.0 if tokens.logit_bias is None else tokens.logit_bias
        G = masked_softmax(weights + (1 - A) * NO_EDGE_LOGIT + bias, tokens.valid)
        o = torch.einsum("bhij,bjhe->bihe", G if dropped is None else G * dropped, fv).reshape(b, n, d)
        return linear(attn.out, o), G


def test_fr_adjacency_matches_formula():
    h, m, c, b, n = 2, 7, 4, 2, 5
    col_head, col_tail = torch.randn(h, m, c, dtype=F64), torch.randn(h, m, c, dtype=F64)
    bias = torch.tensor([0.2], dtype=F64)
    slots = torch.stack([torch.randperm(m)[:n] for _ in range(b)])
    readout = torch.tensor([[False, True, False, False, False], [False] * 5])
    A = fr_adjacency(col_head, col_tail, bias, slots, readout)
    assert A.shape == (b, h, n, n)
    torch.testing.assert_close(A, adjacency_loops(col_head, col_tail, bias, slots, readout))
    assert 0 < A.mean() < 1, "the test should see both edges and non-edges"


@pytest.mark.parametrize("heads", [1, 2])
@pytest.mark.parametrize("sym_weight", [True, False])
@pytest.mark.parametrize("sym_topology", [False, True])
@pytest.mark.parametrize("with_readout", [True, False])
def test_fr_matches_reference(build_set, heads, sym_weight, sym_topology, with_readout):
    attn = build_set(FRGraphAttention, D, heads=heads, sym_weight=sym_weight, sym_topology=sym_topology)
    assert (attn.edges.w_tail is attn.edges.w_head) == sym_weight
    assert (attn.topology.col_tail is attn.topology.col_head) == sym_topology
    tokens = set_tokens(LENGTHS, N, readout=cls_readout(2, N) if with_readout else None)
    x = torch.randn(2, N, D, dtype=F64)
    y = attn(x, tokens)
    out, G = fr_reference(attn, x, tokens)
    assert y.shape == (2, N, D)
    torch.testing.assert_close(y[tokens.valid], out[tokens.valid])
    torch.testing.assert_close(attn.graph(x, tokens), G)


def last_readout(lengths: list[int], n: int) -> Tensor:
    """Each row's last real token is the readout (the tabular task's layout)."""
    r = torch.zeros(len(lengths), n, dtype=torch.bool)
    r[torch.arange(len(lengths)), torch.tensor(lengths) - 1] = True
    return r


def key_pattern_dropout(p: float):
    """A stand-in for ``ablate.components.dropout`` on ``[b, h, q, n]`` probabilities whose kept
    entries depend on (row, head, key) only, so every query row of a head drops the same keys:
    ``(function, factors [b, h, 1, n])``."""

    def factors(b: int, h: int, n: int) -> Tensor:
        pattern = (
            torch.arange(b)[:, None, None, None]
            + 2 * torch.arange(h)[None, :, None, None]
            + torch.arange(n)[None, None, None, :]
        ) % 3 != 0
        return pattern.to(F64) / (1 - p)

    def dropout(x: Tensor, rate: float, training: bool = True) -> Tensor:
        assert rate == p and training
        return x * factors(x.shape[0], x.shape[1], x.shape[-1])

    return dropout, factors


@pytest.mark.parametrize("heads", [1, 2])
@pytest.mark.parametrize("sym_weight", [True, False])
@pytest.mark.parametrize("with_bias", [False, True])
def test_fr_last_query_is_the_reference_at_each_rows_last_token(build_set, heads, sym_weight, with_bias):
    """The readout-only path of the final block (T2G-Former runs its last layer for [CLS]
    alone): edge weights, graph row and output projection of one query per row."""
    attn = build_set(FRGraphAttention, D, heads=heads, sym_weight=sym_weight)
    tokens = set_tokens(LENGTHS, N, readout=last_readout(LENGTHS, N))
    if with_bias:
        tokens.logit_bias = torch.randn(2, heads, N, N, dtype=F64)
    x = torch.randn(2, N, D, dtype=F64)
    rows, last = torch.arange(2), tokens.lengths - 1
    got = attn.last_query(x, tokens)
    assert got.shape == (2, D)
    torch.testing.assert_close(got, fr_reference(attn, x, tokens)[0][rows, last])
    torch.testing.assert_close(
        attn.graph(x, tokens, last_only=True)[:, :, 0], fr_reference(attn, x, tokens)[1][rows, :, last]
    )


def test_fr_last_query_drops_out_its_graph_row_in_training(build_set, monkeypatch):
    import ablate.kernels.draws

    p = 0.4
    dropout, factors = key_pattern_dropout(p)
    monkeypatch.setattr(ablate.kernels.draws, "dropout", dropout)  # what the Dropout module calls
    attn = build_set(FRGraphAttention, D, heads=2, dropout=p).train()
    tokens = set_tokens(LENGTHS, N, readout=last_readout(LENGTHS, N))
    x = torch.randn(2, N, D, dtype=F64)
    rows, last = torch.arange(2), tokens.lengths - 1
    expected = fr_reference(attn, x, tokens, dropped=factors(2, 2, N))[0][rows, last]
    torch.testing.assert_close(attn.last_query(x, tokens), expected)
    assert not torch.allclose(expected, fr_reference(attn, x, tokens)[0][rows, last])


def test_fr_no_self_edges_and_no_edges_into_readout(build_set):
    attn = build_set(FRGraphAttention, D, heads=2)
    readout = torch.zeros(2, N, dtype=torch.bool)
    readout[0, 0] = readout[1, 2] = True
    tokens = set_tokens([N, N], N, readout=readout)
    A = attn.adjacency(tokens)
    eye = torch.eye(N, dtype=torch.bool)
    assert (A[..., eye] == 0).all()
    assert (A.permute(0, 3, 1, 2)[readout] == 0).all()  # [b, j, h, i] at readout keys j
    # With every other edge on, the FR-Graph puts no weight on self-loops or readout keys.
    with torch.no_grad():
        attn.topology.bias.fill_(5.0)  # σ(cos + 5) > 0.5 for every cosine
    A = attn.adjacency(tokens)
    expected = (~eye & ~readout[:, None, None, :]).to(F64).expand_as(A)
    torch.testing.assert_close(A, expected)
    G = attn.graph(torch.randn(2, N, D, dtype=F64), tokens)
    assert (G[..., eye] < 1e-300).all()
    assert (G.permute(0, 3, 1, 2)[readout] < 1e-300).all()
    # The readout token itself still collects every feature.
    assert (G[0, :, 0, 1:] > 0).all()


def test_fr_padding_invariance_and_padded_keys_get_no_weight(build_set):
    attn = build_set(FRGraphAttention, D, heads=2)
    tokens = set_tokens(LENGTHS, N, readout=cls_readout(2, N))
    x = torch.randn(2, N, D, dtype=F64)
    y = attn(x, tokens)
    x_pad, tokens_pad = pad(x, tokens, extra=3)
    y_pad = attn(x_pad, tokens_pad)
    torch.testing.assert_close(y_pad[:, :N][tokens.valid], y[tokens.valid])
    G = attn.graph(x_pad, tokens_pad)  # [b, h, i, j]
    real_q, pad_k = tokens_pad.valid[:, None, :, None], ~tokens_pad.valid[:, None, None, :]
    assert (G.masked_select(real_q & pad_k) == 0).all()


@pytest.mark.parametrize("slots_travel", [True, False], ids=["positions-permuted", "table-permuted"])
def test_fr_permutation_equivariance(build_set, slots_travel):
    """Permuting the tokens permutes the outputs, when each token keeps its column embedding:
    either its slot (position) travels with it, or the table's rows are permuted to match."""
    attn = build_set(FRGraphAttention, D, heads=2, max_len=N)
    tokens = set_tokens(LENGTHS, N, readout=cls_readout(2, N))
    x = torch.randn(2, N, D, dtype=F64)
    y = attn(x, tokens)
    perm = torch.tensor([3, 0, 4, 1, 2])
    if not slots_travel:
        with torch.no_grad():
            for p in {id(p): p for p in (attn.topology.col_head, attn.topology.col_tail)}.values():
                p.copy_(p[:, perm])
    y_perm = attn(x[:, perm], permute(tokens, perm, slots_travel))
    torch.testing.assert_close(y_perm[tokens.valid[:, perm]], y[:, perm][tokens.valid[:, perm]])


def test_fr_straight_through_gradient_is_the_sigmoids():
    """Forward: the 0/1 threshold. Backward: exactly the gradient of ``σ(score + b)`` (masked)."""
    h, m, c, n = 2, 5, 3, 5
    params = [torch.randn(h, m, c, dtype=F64, requires_grad=True) for _ in range(2)]
    bias = torch.tensor([0.1], dtype=F64, requires_grad=True)
    slots = torch.arange(n).expand(2, n)
    readout = cls_readout(2, n)
    upstream = torch.randn(2, h, n, n, dtype=F64)

    A = fr_adjacency(*params, bias, slots, readout)
    hard_grads = torch.autograd.grad((A * upstream).sum(), [*params, bias])

    eh = nn.functional.normalize(params[0][:, slots], dim=-1).transpose(0, 1)
    et = nn.functional.normalize(params[1][:, slots], dim=-1).transpose(0, 1)
    keep = (1 - torch.eye(n, dtype=F64)) * (~readout)[:, None, None, :]
    probs = torch.sigmoid(eh @ et.transpose(-1, -2) + bias) * keep
    soft_grads = torch.autograd.grad((probs * upstream).sum(), [*params, bias])

    assert torch.equal(A.detach(), (probs > 0.5).to(F64))
    for g_hard, g_soft in zip(hard_grads, soft_grads, strict=False):
        torch.testing.assert_close(g_hard, g_soft)
        assert g_hard.abs().sum() > 0


def test_fr_gradient_reaches_topology(build_set):
    attn = build_set(FRGraphAttention, D, heads=2)
    tokens = set_tokens(LENGTHS, N, readout=cls_readout(2, N))
    attn(torch.randn(2, N, D, dtype=F64), tokens).pow(2).sum().backward()
    for name, p in attn.topology.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name


def test_fr_frozen_topology_gets_no_gradient(build_set):
    tokens = set_tokens(LENGTHS, N, readout=cls_readout(2, N))
    x = torch.randn(2, N, D, dtype=F64)
    frozen = build_set(FRGraphAttention, D, heads=2, frozen_topology=True)
    assert frozen.topology_frozen
    frozen(x, tokens).pow(2).sum().backward()
    assert all(p.grad is None for p in frozen.topology.parameters())
    assert all(p.grad is not None for p in frozen.edges.parameters())

    attn = build_set(FRGraphAttention, D, heads=2)
    before = attn(x, tokens).detach()
    assert not attn.topology_frozen
    attn.freeze_topology()  # what epoch_end does once freeze_after epochs are trained
    assert attn.topology_frozen
    attn.zero_grad(set_to_none=True)
    y = attn(x, tokens)
    y.pow(2).sum().backward()
    torch.testing.assert_close(y.detach(), before)  # freezing keeps the learned graph
    assert all(p.grad is None for p in attn.topology.parameters())
    assert attn.value.weight.grad is not None


def test_fr_gradcheck(build_set, gradcheck_all):
    """Every input and every non-topology parameter. The topology enters only through the hard
    0/1 adjacency, which is locally constant (its straight-through gradient is tested above)."""
    attn = build_set(FRGraphAttention, 4, heads=2, max_len=4, sym_weight=False)
    tokens = set_tokens([3, 2], 3, readout=cls_readout(2, 3))
    x = torch.randn(2, 3, 4, dtype=F64)
    gradcheck_all(nn.ModuleList([attn.edges, attn.value, attn.out]), lambda x: attn(x, tokens), x)


def test_fr_dropout_defaults_to_model_dropout_and_only_acts_in_training(build_set):
    attn = build_set(FRGraphAttention, D, model_dropout=0.3)
    assert attn.dropout.p == 0.3
    attn = build_set(FRGraphAttention, D, model_dropout=0.3, heads=2, dropout=0.5)
    assert attn.dropout.p == 0.5
    tokens = set_tokens(LENGTHS, N)
    x = torch.randn(2, N, D, dtype=F64)
    torch.testing.assert_close(attn(x, tokens)[tokens.valid], fr_reference(attn, x, tokens)[0][tokens.valid])
    attn.train()
    assert not torch.allclose(attn(x, tokens), attn(x, tokens))


def test_fr_column_table_too_small_is_a_clear_error(build_set):
    attn = build_set(FRGraphAttention, D, max_len=4)
    with pytest.raises(ValueError, match=r"fr_graph: 5 tokens .* max_len=4"):
        attn(torch.randn(2, N, D, dtype=F64), set_tokens(LENGTHS, N))


# =======================================================================================
# channel_masked
# =======================================================================================


def rfft_magnitudes(values: Tensor) -> Tensor:
    """``|Σ_t x_t e^{−2πi k t / w}|`` for ``k = 0..⌊w/2⌋`` by the DFT sum (no torch.fft)."""
    w = values.shape[-1]
    t, k = torch.arange(w, dtype=F64), torch.arange(w // 2 + 1, dtype=F64)
    angle = 2 * math.pi * k[:, None] * t[None, :] / w  # [f, w]
    re, im = values @ torch.cos(angle).T, -values @ torch.sin(angle).T
    return torch.sqrt(re**2 + im**2)


def probabilities_loops(values: Tensor, A: Tensor, valid: Tensor, eps: float = 1e-10) -> Tensor:
    """DUET: ``p_ij = 0.99·S_ij / max_{k≠i, k real} S_ik`` with ``S_ij = 1/(‖A(X_i − X_j)‖² + ε)``;
    ``p_ii = 0.99``."""
    X = rfft_magnitudes(values)
    b, n, _ = X.shape
    S = torch.zeros(b, n, n, dtype=F64)
    for bb in range(b):
        for i in range(n):
            for j in range(n):
                if i != j and valid[bb, j]:
                    diff = X[bb, i] - X[bb, j]
                    S[bb, i, j] = 1 / (float((A @ diff) @ (A @ diff)) + eps)
    p = torch.zeros(b, n, n, dtype=F64)
    for bb in range(b):
        for i in range(n):
            top = float(S[bb, i].max())
            for j in range(n):
                p[bb, i, j] = 0.99 if i == j else 0.99 * float(S[bb, i, j]) / top
    return p


def channel_reference(attn: ChannelMaskedAttention, x: Tensor, tokens: TokenContext, M: Tensor) -> Tensor:
    """``W_o · softmax((q kᵀ ⊙ M + (1 − M)·(−ln 1e10)) / √e, padded keys −∞) v`` for a given
    0/1 mask ``M [b, n, n]``."""
    b, n, d = x.shape
    h = attn.heads
    e = d // h
    with torch.no_grad():
        q, k, v = (t.reshape(b, n, h, e) for t in linear(attn.qkv, x).split(d, dim=-1))
        s = torch.einsum("bihe,bjhe->bhij", q, k)
        M = M[:, None]
        logits = (s * M + (1 - M) * -math.log(1e10)) / math.sqrt(e)
        P = masked_softmax(logits, tokens.valid)
        return linear(attn.out, torch.einsum("bhij,bjhe->bihe", P, v).reshape(b, n, d))


def channel_tokens(lengths=LENGTHS, n=N, w=W) -> TokenContext:
    return set_tokens(lengths, n, values=torch.randn(len(lengths), n, w, dtype=F64))


def test_mahalanobis_probabilities_match_formula():
    tokens = channel_tokens()
    A = torch.randn(W // 2 + 1, W // 2 + 1, dtype=F64)
    p = mahalanobis_probabilities(tokens.values, A, tokens.valid)
    assert p.shape == (2, N, N)
    torch.testing.assert_close(p, probabilities_loops(tokens.values, A, tokens.valid))
    # The closest real channel of every real row gets 0.99, like the row's own diagonal.
    real = tokens.valid
    torch.testing.assert_close(
        p.masked_fill(torch.eye(N, dtype=torch.bool), 0).amax(-1)[real],
        torch.full((int(real.sum()),), 0.99, dtype=F64),
    )


def test_gumbel_mask_matches_formula_and_straight_through():
    """``M = 1[2ℓ + g₀ − g₁ ≥ 0]`` forward, ``∂σ((2ℓ + g₀ − g₁)/τ)`` backward, ``ℓ = ln(p/(1−p))``."""
    p = torch.rand(3, 4, 4, dtype=F64).clamp(0.05, 0.95).requires_grad_()
    g = -torch.empty(3, 4, 4, 2, dtype=F64).exponential_().log()
    tau = 0.7
    M = gumbel_mask(p, tau, noise=g)
    logit = torch.log(p / (1 - p))
    z = 2 * logit + g[..., 0] - g[..., 1]
    assert torch.equal(M.detach(), (z >= 0).to(F64))
    upstream = torch.randn(3, 4, 4, dtype=F64)
    (grad_hard,) = torch.autograd.grad((M * upstream).sum(), p)
    (grad_soft,) = torch.autograd.grad((torch.sigmoid(z / tau) * upstream).sum(), p)
    torch.testing.assert_close(grad_hard, grad_soft)

    M = threshold_mask(p)
    assert torch.equal(M.detach(), (p > 0.5).to(F64))
    (grad,) = torch.autograd.grad((M * upstream).sum(), p)
    torch.testing.assert_close(grad, upstream)


def test_gumbel_mask_keeps_an_edge_with_duets_probability():
    """DUET's two-logit Gumbel draw over ``[ℓ, −ℓ]`` keeps an edge with probability
    ``σ(2ℓ) = p² / (p² + (1 − p)²)`` (not ``p``); its mode is the threshold-0.5 mask."""
    p = torch.tensor([0.1, 0.3, 0.5, 0.7, 0.9], dtype=F64)
    draws = gumbel_mask(p.expand(100_000, 5))
    expected = p**2 / (p**2 + (1 - p) ** 2)
    torch.testing.assert_close(draws.mean(0), expected, atol=0.01, rtol=0)


@pytest.mark.parametrize("heads", [1, 2])
def test_channel_masked_matches_reference_threshold(build_set, heads):
    attn = build_set(ChannelMaskedAttention, D, heads=heads, lookback=W, eval_mask="threshold")
    tokens = channel_tokens()
    x = torch.randn(2, N, D, dtype=F64)
    p = probabilities_loops(tokens.values, attn.A.detach(), tokens.valid)
    M = (p > 0.5).to(F64)  # the diagonal (0.99) is kept
    assert 0 < M[:, ~torch.eye(N, dtype=torch.bool)].mean() < 1, "the test should see kept and masked pairs"
    y = attn(x, tokens)
    assert y.shape == (2, N, D)
    torch.testing.assert_close(y[tokens.valid], channel_reference(attn, x, tokens, M)[tokens.valid])
    torch.testing.assert_close(y, attn(x, tokens))  # deterministic


@pytest.mark.parametrize("training", [False, True], ids=["eval-sample", "train"])
def test_channel_masked_matches_reference_sampled(build_set, training):
    """Sampled masks, with the Gumbel noise replayed from the same seed: ``g [b, n, n, 2]``."""
    attn = build_set(
        ChannelMaskedAttention, D, heads=2, lookback=W, eval_mask="threshold" if training else "sample"
    )  # training always samples
    attn.train(training)
    tokens = channel_tokens()
    x = torch.randn(2, N, D, dtype=F64)
    torch.manual_seed(123)
    y = attn(x, tokens)
    torch.manual_seed(123)
    g = -torch.empty(2, N, N, 2, dtype=F64).exponential_().log()
    p = probabilities_loops(tokens.values, attn.A.detach(), tokens.valid)
    logit = torch.log(p / (1 - p))
    M = ((2 * logit + g[..., 0] - g[..., 1]) >= 0).to(F64)
    M = torch.maximum(M, torch.eye(N, dtype=F64))  # a channel always sees itself
    torch.testing.assert_close(y[tokens.valid], channel_reference(attn, x, tokens, M)[tokens.valid])
    assert not torch.allclose(attn(x, tokens), y), "sampled masks should differ between calls"


def test_channel_masked_diagonal_always_kept(build_set):
    attn = build_set(ChannelMaskedAttention, D, lookback=W).train()
    tokens = channel_tokens([N] * 64, N)
    for _ in range(5):
        m = attn.mask(tokens)
        assert (m[:, torch.eye(N, dtype=torch.bool)] == 1).all()
        assert set(m.unique().tolist()) <= {0.0, 1.0}


def test_channel_masked_padding_invariance_and_padded_keys_get_no_weight(build_set):
    """Deterministic (threshold) mask: a sampled mask draws noise of a different shape."""
    attn = build_set(ChannelMaskedAttention, D, heads=2, lookback=W, eval_mask="threshold")
    tokens = channel_tokens()
    x = torch.randn(2, N, D, dtype=F64)
    y = attn(x, tokens)
    x_pad, tokens_pad = pad(x, tokens, extra=3)
    torch.testing.assert_close(attn(x_pad, tokens_pad)[:, :N][tokens.valid], y[tokens.valid])
    P = attn.weights(x_pad, tokens_pad)
    real_q, pad_k = tokens_pad.valid[:, None, :, None], ~tokens_pad.valid[:, None, None, :]
    assert (P.masked_select(real_q & pad_k) == 0).all()


def test_channel_masked_masked_pairs_get_duets_large_negative(build_set):
    attn = build_set(ChannelMaskedAttention, D, heads=1, lookback=W, eval_mask="threshold")
    tokens = channel_tokens([N, N])
    P = attn.weights(torch.randn(2, N, D, dtype=F64), tokens)
    masked = (attn.mask(tokens) == 0)[:, None]
    assert masked.any()
    # exp(−ln(1e10)/√e) relative to kept logits of order one
    assert (P[masked] < 1e-2).all() and (P[masked] > 0).all()
    assert MASKED_LOGIT == pytest.approx(-23.02585, abs=1e-5)


def test_channel_masked_permutation_equivariance(build_set):
    attn = build_set(ChannelMaskedAttention, D, heads=2, lookback=W, eval_mask="threshold")
    tokens = channel_tokens()
    x = torch.randn(2, N, D, dtype=F64)
    y = attn(x, tokens)
    perm = torch.tensor([2, 4, 0, 3, 1])
    y_perm = attn(x[:, perm], permute(tokens, perm))
    torch.testing.assert_close(y_perm[tokens.valid[:, perm]], y[:, perm][tokens.valid[:, perm]])


@pytest.mark.parametrize("training", [True, False], ids=["train-sampled", "eval-threshold"])
def test_channel_masked_straight_through_reaches_the_linear_map(build_set, training):
    attn = build_set(ChannelMaskedAttention, D, heads=2, lookback=W, eval_mask="threshold").train(training)
    tokens = channel_tokens()
    attn(torch.randn(2, N, D, dtype=F64), tokens).pow(2).sum().backward()
    assert attn.A.grad is not None and torch.isfinite(attn.A.grad).all()
    assert attn.A.grad.abs().sum() > 0
    for name, p in attn.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


def test_channel_masked_gradcheck(build_set, gradcheck_all):
    """The input and the attention's projections; the mask (from ``values`` and ``A``) is a hard
    0/1 function, locally constant, whose straight-through gradient is tested above."""
    attn = build_set(ChannelMaskedAttention, 4, heads=2, lookback=4, eval_mask="threshold")
    tokens = channel_tokens([3, 2], 3, 4)
    x = torch.randn(2, 3, 4, dtype=F64)
    gradcheck_all(nn.ModuleList([attn.qkv, attn.out]), lambda x: attn(x, tokens), x)


def test_channel_masked_describe_names_the_eval_mask():
    Kind = ChannelMaskedAttention
    assert "eval_mask=sample" in Kind.describe(Kind.Options())
    label = Kind.describe(Kind.Options(heads=2, eval_mask="threshold"))
    assert "heads=2" in label and "eval_mask=threshold" in label and label.count("eval_mask") == 1


def test_channel_masked_needs_values(build_set):
    Kind = ChannelMaskedAttention
    assert Kind.requirements(Kind.Options()) == {"values"}
    attn = build_set(Kind, D, lookback=W)
    x = torch.randn(2, N, D, dtype=F64)
    with pytest.raises(ValueError, match=r"channel_masked needs .*tokens\.values"):
        attn(x, set_tokens(LENGTHS, N))
    with pytest.raises(ValueError, match=r"lookback=8 .* width 6"):
        attn(x, channel_tokens(w=6))


# =======================================================================================
# both: unordered only
# =======================================================================================

KINDS = [(FRGraphAttention, "fr_graph", {}), (ChannelMaskedAttention, "channel_masked", {"lookback": W})]


@pytest.mark.parametrize("kind,name,options", KINDS, ids=[k[1] for k in KINDS])
def test_causal_use_is_refused(build_set, kind, name, options):
    """Unordered kinds have no "no future leak" property to test: causal use is refused."""
    attn = build_set(kind, D, **options)
    tokens = channel_tokens()
    tokens.causal = True
    with pytest.raises(ValueError, match=rf"'{name}' cannot be used causally"):
        attn(torch.randn(2, N, D, dtype=F64), tokens)


@pytest.mark.parametrize("kind,name,options", KINDS, ids=[k[1] for k in KINDS])
def test_ordered_build_is_refused(kind, name, options):
    ctx = BuildContext(dim=D, ordered=True)
    with pytest.raises(ValueError, match=rf"'{name}' mixes an unordered token set"):
        kind(kind.Options(**options), ctx)
    assert not kind.ordered_only


@pytest.mark.parametrize("kind,name,options", KINDS, ids=[k[1] for k in KINDS])
def test_heads_must_divide_dim(build_set, kind, name, options):
    with pytest.raises(ValueError, match=rf"{name} attention: model width dim=8 is not divisible by heads=3"):
        build_set(kind, D, heads=3, **options)

"""Attention kinds against explicit einsum / loop math written from the papers.

Dimensions: ``b`` batch, ``n`` tokens, ``h`` heads, ``e`` head width, ``d = h·e`` model width;
``C`` enabled AMS channels, ``k`` the largest time-interval index.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pydantic
import pytest
import torch
from torch import Tensor

from ablate.components import TokenContext
from ablate_plugins.attention import (
    AMSAttention,
    NoAttention,
    PointwiseAttention,
    SoftmaxAttention,
    TimeIntervalAttention,
)

LENGTHS, N, D = [5, 3], 5, 8


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """These tensors are tiny: intra-op threads only add synchronisation, which on a busy machine
    makes the gradchecks' thousands of small forwards many times slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def allowed(tokens: TokenContext) -> Tensor:
    """``[b, 1, n, n]``: query i sees key j if j is real (and j ≤ i when causal), or j = i."""
    b, n = tokens.shape
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    see = tokens.valid[:, None, None, :] & ((j <= i) | (not tokens.causal))
    return see | (i == j)


def reference(
    attn: SoftmaxAttention, x: Tensor, tokens: TokenContext, source: Tensor | None = None
) -> Tensor:
    """``W_o · concat_h softmax(q kᵀ / √e + B, masked) v`` from the module's own weights; q from
    ``x``, k and v from ``source`` (default ``x``)."""
    b, n, d = x.shape
    h = attn.heads
    e = d // h
    w_qkv, w_o = attn.qkv.weight, attn.out.weight
    b_qkv = attn.qkv.bias if attn.qkv.bias is not None else torch.zeros(3 * d, dtype=x.dtype)
    b_o = attn.out.bias if attn.out.bias is not None else torch.zeros(d, dtype=x.dtype)
    heads = lambda t: t.reshape(b, n, h, e).permute(0, 2, 1, 3)  # noqa: E731  [b, h, n, e]
    q = heads(torch.einsum("bnd,kd->bnk", x, w_qkv[:d]) + b_qkv[:d])
    source = x if source is None else source
    k = heads(torch.einsum("bnd,kd->bnk", source, w_qkv[d : 2 * d]) + b_qkv[d : 2 * d])
    v = heads(torch.einsum("bnd,kd->bnk", source, w_qkv[2 * d :]) + b_qkv[2 * d :])
    for rotation in tokens.rotations:
        q, k = rotation(q, k, tokens)
    logits = torch.einsum("bhie,bhje->bhij", q, k) / math.sqrt(e)
    if tokens.logit_bias is not None:
        logits = logits + tokens.logit_bias
    logits = logits.masked_fill(~allowed(tokens), float("-inf"))
    p = torch.exp(logits - logits.amax(-1, keepdim=True))
    p = p / p.sum(-1, keepdim=True)
    o = torch.einsum("bhij,bhje->bihe", p, v).reshape(b, n, d)
    return torch.einsum("bnd,kd->bnk", o, w_o) + b_o


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("heads", [1, 2, 4])
@pytest.mark.parametrize("bias", [True, False])
def test_matches_reference(build, make_tokens, causal, heads, bias):
    attn = build(SoftmaxAttention, D, heads=heads, bias=bias)
    tokens = make_tokens(LENGTHS, N, causal)
    x = torch.randn(2, N, D, dtype=torch.float64)
    y = attn(x, tokens)
    assert y.shape == (2, N, D)
    # Outputs at padded positions are unspecified; real positions must match the formula.
    torch.testing.assert_close(y[tokens.valid], reference(attn, x, tokens)[tokens.valid])


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("heads", [1, 2])
def test_keys_and_values_from_a_source(build, make_tokens, causal, heads):
    """``source``: queries from x, keys and values from the source (placement pre_skip_kv), in
    the full forward and in the last-query fast path."""
    attn = build(SoftmaxAttention, D, heads=heads)
    tokens = make_tokens(LENGTHS, N, causal)
    x, source = torch.randn(2, 2, N, D, dtype=torch.float64)
    expected = reference(attn, x, tokens, source)
    torch.testing.assert_close(attn(x, tokens, source=source)[tokens.valid], expected[tokens.valid])
    assert not torch.allclose(expected[tokens.valid], reference(attn, x, tokens)[tokens.valid])
    if causal:
        last = tokens.lengths - 1
        rows = torch.arange(len(last))
        torch.testing.assert_close(attn.last_query(x, tokens, source=source), expected[rows, last])


@pytest.mark.parametrize("heads", [1, 2, 4])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("with_source", [False, True])
@pytest.mark.parametrize("bias_shape", [None, (2, 1, N, N), (1, 4, N, N)])
def test_last_query_folds_key_and_value_projections(build, make_tokens, heads, bias, with_source, bias_shape):
    """The ranking fast path (key / value projections folded into the one query, no per-token
    projection) equals the reference at each row's last real token."""
    attn = build(SoftmaxAttention, D, heads=heads, bias=bias)
    tokens = make_tokens([5, 2], N, causal=True)
    if bias_shape is not None:
        tokens.logit_bias = torch.randn((bias_shape[0], heads, N, N), dtype=torch.float64)
    x, source = torch.randn(2, 2, N, D, dtype=torch.float64)
    source = source if with_source else None
    rows, last = torch.arange(2), tokens.lengths - 1
    got = attn.last_query(x, tokens, source=source)
    assert got.shape == (2, D)
    torch.testing.assert_close(got, reference(attn, x, tokens, source)[rows, last])


@pytest.mark.parametrize("bias", [True, False])
def test_last_query_drops_out_probabilities_in_training(build, make_tokens, monkeypatch, bias):
    """In training the one query's probabilities take the attention dropout, and the folded value
    bias is weighted by what the dropped row sums to: ``Σ_j p̃_j (W_v x_j + b_v)``, written out
    here per key (non-causal rows: a readout token placed last sees every real key)."""
    import ablate.components

    p, heads = 0.3, 2
    kept = torch.tensor([[1.0, 0.0, 1.0, 1.0, 0.0], [0.0, 1.0, 1.0, 1.0, 1.0]], dtype=torch.float64)

    def dropout(x: Tensor, rate: float, training: bool = True) -> Tensor:  # [b, h, n]: a fixed mask
        assert rate == p and training
        return x * kept[:, None, :] / (1 - p)

    monkeypatch.setattr(ablate.components, "dropout", dropout)
    attn = build(SoftmaxAttention, D, heads=heads, bias=bias, dropout=p).train()
    tokens = make_tokens(LENGTHS, N, causal=False)
    x = torch.randn(2, N, D, dtype=torch.float64)
    b, d, e = 2, D, D // heads
    rows, last = torch.arange(b), tokens.lengths - 1
    w, bias_qkv = attn.qkv.weight, attn.qkv.bias if bias else torch.zeros(3 * D, dtype=torch.float64)
    q = (x[rows, last] @ w[:d].T + bias_qkv[:d]).view(b, heads, e)
    k = (x @ w[d : 2 * d].T + bias_qkv[d : 2 * d]).view(b, N, heads, e)
    v = (x @ w[2 * d :].T + bias_qkv[2 * d :]).view(b, N, heads, e)
    logits = torch.einsum("bhe,bjhe->bhj", q, k) / math.sqrt(e)
    probs = logits.masked_fill(~tokens.valid[:, None, :], float("-inf")).softmax(-1)
    dropped = probs * kept[:, None, :] / (1 - p)
    o = torch.einsum("bhj,bjhe->bhe", dropped, v).reshape(b, d)
    expected = o @ attn.out.weight.T + (attn.out.bias if bias else 0.0)
    torch.testing.assert_close(attn.last_query(x, tokens), expected)
    assert not torch.allclose(expected, reference(attn, x, tokens)[rows, last])


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("bias_shape", [(2, 1, N, N), (1, 2, N, N)])
def test_logit_bias_is_added_to_logits(build, make_tokens, causal, bias_shape):
    attn = build(SoftmaxAttention, D, heads=2)
    x = torch.randn(2, N, D, dtype=torch.float64)
    plain = attn(x, make_tokens(LENGTHS, N, causal))
    tokens = make_tokens(LENGTHS, N, causal)
    tokens.logit_bias = torch.randn(bias_shape, dtype=torch.float64)
    biased = attn(x, tokens)
    real = tokens.valid.clone()
    real[:, 0] = False  # the first query of a causal row sees only itself: no bias can move it
    assert not torch.allclose(biased[real], plain[real])
    torch.testing.assert_close(biased[tokens.valid], reference(attn, x, tokens)[tokens.valid])


def test_rotations_act_on_queries_and_keys(build, make_tokens):
    attn = build(SoftmaxAttention, D, heads=2)
    x = torch.randn(2, N, D, dtype=torch.float64)
    tokens = make_tokens(LENGTHS, N, causal=True)
    tokens.rotations = [lambda q, k, t: (q * (1 + t.positions)[:, None, :, None], k.flip(-1))]
    torch.testing.assert_close(attn(x, tokens)[tokens.valid], reference(attn, x, tokens)[tokens.valid])


@pytest.mark.parametrize("with_logit_bias", [False, True], ids=["fused-causal", "explicit-mask"])
def test_no_future_leak(build, make_tokens, with_logit_bias):
    attn = build(SoftmaxAttention, D, heads=2)
    tokens = make_tokens(LENGTHS, N, causal=True)
    if with_logit_bias:
        tokens.logit_bias = torch.randn(1, 2, N, N, dtype=torch.float64)
    x = torch.randn(2, N, D, dtype=torch.float64)
    y = attn(x, tokens)
    for t in range(N - 1):
        x2 = x.clone()
        x2[:, t + 1 :] = torch.randn_like(x2[:, t + 1 :])
        past = tokens.valid.clone()
        past[:, t + 1 :] = False
        torch.testing.assert_close(attn(x2, tokens)[past], y[past])


@pytest.mark.parametrize("causal", [True, False])
def test_padding_invariance(build, make_tokens, padding_invariant, causal):
    attn = build(SoftmaxAttention, D, heads=2)
    x = torch.randn(2, N, D, dtype=torch.float64)
    padding_invariant(attn, x, make_tokens(LENGTHS, N, causal))


@pytest.mark.parametrize("causal", [True, False])
def test_gradcheck(build, make_tokens, gradcheck_all, causal):
    attn = build(SoftmaxAttention, 4, heads=2)
    tokens = make_tokens([3, 2], 3, causal)
    x = torch.randn(2, 3, 4, dtype=torch.float64)
    gradcheck_all(attn, lambda x: attn(x, tokens), x)


def test_heads_must_divide_dim(build):
    with pytest.raises(ValueError, match=r"dim=8 is not divisible by heads=3"):
        build(SoftmaxAttention, 8, heads=3)


def test_heads_must_be_positive(build):
    with pytest.raises(pydantic.ValidationError, match="heads"):
        build(SoftmaxAttention, 8, heads=0)


def test_dropout_defaults_to_model_dropout_and_only_acts_in_training(build, make_tokens):
    assert build(SoftmaxAttention, D, model_dropout=0.3).dropout_p == 0.3
    attn = build(SoftmaxAttention, D, model_dropout=0.3, heads=2, dropout=0.5)
    assert attn.dropout_p == 0.5
    tokens = make_tokens(LENGTHS, N, causal=False)
    x = torch.randn(2, N, D, dtype=torch.float64)
    torch.testing.assert_close(attn(x, tokens)[tokens.valid], reference(attn, x, tokens)[tokens.valid])
    attn.train()
    assert not torch.allclose(attn(x, tokens), attn(x, tokens))


# ----------------------------------------------------------------------------------------------
# Shared by the kinds below.

TIMES = torch.tensor([[0.0, 30.0, 40.0, 45.0, 3600.0], [0.0, 2.0, 1e5, 0.0, 0.0]], dtype=torch.float64)


def timed(tokens: TokenContext, times: Tensor = TIMES) -> TokenContext:
    """``tokens`` with timestamps (seconds from each row's first token)."""
    tokens.timestamps = times.clone()
    return tokens


def silu(t: Tensor) -> Tensor:
    return t / (1 + torch.exp(-t))


def linear(x: Tensor, layer: torch.nn.Linear) -> Tensor:
    out = torch.einsum("bnd,kd->bnk", x, layer.weight)
    return out if layer.bias is None else out + layer.bias


def with_garbage_times(f, times: Tensor):
    """``f(x, tokens)`` where the tokens get ``times`` plus garbage times at appended padding."""

    def call(x: Tensor, tokens: TokenContext) -> Tensor:
        b, n = tokens.shape
        extra = n - times.shape[1]
        tokens.timestamps = torch.cat([times, 1e6 * torch.rand(b, extra, dtype=times.dtype)], dim=1)
        return f(x, tokens)

    return call


def assert_no_future_leak(attn, tokens: TokenContext, x: Tensor) -> None:
    """Changing inputs and timestamps after t leaves the outputs at real positions ≤ t unchanged."""
    y = attn(x, tokens)
    b, n = tokens.shape
    for t in range(n - 1):
        x2 = x.clone()
        x2[:, t + 1 :] = torch.randn_like(x2[:, t + 1 :])
        changed = TokenContext(
            valid=tokens.valid, causal=True, positions=tokens.positions, logit_bias=tokens.logit_bias
        )
        if tokens.timestamps is not None:
            later = tokens.timestamps[:, t : t + 1] + torch.rand(b, n - t - 1, dtype=x.dtype).cumsum(-1) * 50
            changed.timestamps = torch.cat([tokens.timestamps[:, : t + 1], later], dim=1)
        past = tokens.valid.clone()
        past[:, t + 1 :] = False
        y2 = attn(x2, changed)
        torch.testing.assert_close(y2[past], y[past])
        assert not torch.allclose(y2[tokens.valid], y[tokens.valid]), "the change did not reach any output"


def assert_dropout_from_model_and_train_only(build, kind, make_tokens, **options) -> None:
    assert build(kind, D, model_dropout=0.3, **options).dropout.p == 0.3
    attn = build(kind, D, model_dropout=0.3, dropout=0.5, **options)
    assert attn.dropout.p == 0.5
    tokens = timed(make_tokens(LENGTHS, N, causal=True))
    x = torch.randn(2, N, D, dtype=torch.float64)
    torch.testing.assert_close(attn(x, tokens), attn(x, tokens))
    attn.train()
    assert not torch.allclose(attn(x, tokens), attn(x, tokens))


# ----------------------------------------------------------------------------------------------
# pointwise (HSTU)


def pointwise_reference(
    attn: PointwiseAttention, x: Tensor, tokens: TokenContext, padded: int | None = None
) -> Tensor:
    """``W_o(U ⊙ LayerNorm(Σ_j SiLU(q_i·k_j + B_ij)/N_b · v_j))`` with N_b the row's real-token count,
    or ``padded`` when given (the padded-width normaliser)."""
    b, n, d = x.shape
    h, eq, ev = attn.heads, attn.e_qk, attn.e_v
    proj = silu(torch.einsum("bnd,kd->bnk", x, attn.uvqk.weight))
    u, v, q, k = proj.split([h * ev, h * ev, h * eq, h * eq], dim=-1)
    v, q, k = (t.reshape(b, n, h, -1).permute(0, 2, 1, 3) for t in (v, q, k))  # [b, h, n, e]
    for rotation in tokens.rotations:
        q, k = rotation(q, k, tokens)
    bias = torch.zeros(b, h, n, n, dtype=x.dtype)
    if tokens.logit_bias is not None:
        bias = tokens.logit_bias.expand(b, h, n, n)
    see = allowed(tokens)
    o = torch.zeros(b, n, h, ev, dtype=x.dtype)
    for r in range(b):
        length = int(tokens.valid[r].sum()) if padded is None else padded
        for head in range(h):
            for i in range(n):
                for j in range(n):
                    if see[r, 0, i, j]:
                        a = silu(q[r, head, i] @ k[r, head, j] + bias[r, head, i, j]) / length
                        o[r, i, head] += a * v[r, head, j]
    o = o.reshape(b, n, h * ev)
    o = (o - o.mean(-1, keepdim=True)) / torch.sqrt(o.var(-1, unbiased=False, keepdim=True) + 1e-6)
    return linear(u * o, attn.out)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("dims", [dict(heads=1), dict(heads=2), dict(heads=2, qk_dim=3, v_dim=5)])
def test_pointwise_matches_reference(build, make_tokens, causal, dims):
    attn = build(PointwiseAttention, D, **dims)
    tokens = make_tokens(LENGTHS, N, causal)
    x = torch.randn(2, N, D, dtype=torch.float64)
    y = attn(x, tokens)
    assert y.shape == (2, N, D)
    torch.testing.assert_close(y[tokens.valid], pointwise_reference(attn, x, tokens)[tokens.valid])


@pytest.mark.parametrize("bias_shape", [(2, 1, N, N), (1, 2, N, N)])
def test_pointwise_logit_bias_and_rotations(build, make_tokens, bias_shape):
    attn = build(PointwiseAttention, D, heads=2)
    x = torch.randn(2, N, D, dtype=torch.float64)
    tokens = make_tokens(LENGTHS, N, causal=True)
    plain = attn(x, tokens)
    tokens.logit_bias = torch.randn(bias_shape, dtype=torch.float64)
    tokens.rotations = [lambda q, k, t: (q * (1 + t.positions)[:, None, :, None], k.flip(-1))]
    biased = attn(x, tokens)
    assert not torch.allclose(biased[tokens.valid], plain[tokens.valid])
    torch.testing.assert_close(biased[tokens.valid], pointwise_reference(attn, x, tokens)[tokens.valid])


def test_pointwise_no_future_leak(build, make_tokens):
    attn = build(PointwiseAttention, D, heads=2)
    tokens = make_tokens(LENGTHS, N, causal=True)
    tokens.logit_bias = torch.randn(1, 2, N, N, dtype=torch.float64)
    assert_no_future_leak(attn, tokens, torch.randn(2, N, D, dtype=torch.float64))


@pytest.mark.parametrize("causal", [True, False])
def test_pointwise_padding_invariance(build, make_tokens, padding_invariant, causal):
    attn = build(PointwiseAttention, D, heads=2)
    padding_invariant(attn, torch.randn(2, N, D, dtype=torch.float64), make_tokens(LENGTHS, N, causal))


def test_pointwise_divides_by_true_length(build, make_tokens):
    """N is the row's real-token count: the same causal prefix in rows of length 3 and 5 gives
    norm inputs Σ_j SiLU(·) v_j / N in the ratio 5 : 3."""
    attn = build(PointwiseAttention, D, heads=2)
    x = torch.randn(1, N, D, dtype=torch.float64)
    seen = []
    attn.norm.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    attn(x, make_tokens([3], N, causal=True))
    attn(x, make_tokens([5], N, causal=True))
    short, long = seen
    torch.testing.assert_close(long[0, :3] * 5, short[0, :3] * 3)


@pytest.mark.parametrize("causal", [True, False])
def test_pointwise_gradcheck(build, make_tokens, gradcheck_all, causal):
    attn = build(PointwiseAttention, 4, heads=2)
    tokens = make_tokens([3, 2], 3, causal)
    gradcheck_all(attn, lambda x: attn(x, tokens), torch.randn(2, 3, 4, dtype=torch.float64))


def test_pointwise_widths_and_dropout(build, make_tokens):
    with pytest.raises(ValueError, match=r"pointwise attention: model width dim=8 is not divisible"):
        build(PointwiseAttention, 8, heads=3)
    attn = build(PointwiseAttention, 8, heads=3, qk_dim=2, v_dim=4)
    assert attn.uvqk.weight.shape == (2 * 3 * 4 + 2 * 3 * 2, 8) and attn.out.weight.shape == (8, 12)
    assert_dropout_from_model_and_train_only(build, PointwiseAttention, make_tokens, heads=2)


# ----------------------------------------------------------------------------------------------
# ams (FuXi-α)

CHANNELS = ("semantic", "positional", "temporal")


def time_bucket(dt: float, buckets: int, step: float = 0.301) -> int:
    return min(max(math.floor(math.log(max(abs(dt), 1.0)) / step), 0), buckets)


def ams_reference(
    attn: AMSAttention, x: Tensor, tokens: TokenContext, max_len: int = 16, padded: int | None = None
) -> Tensor:
    """``W_o(U ⊙ RMSNorm(concat_c Σ_j A_c[i, j] v_j))`` over the enabled channels, by loops; the
    semantic channel divided by the row's real-token count or ``padded``; the temporal channel's
    query time its own, or the request time under ``time_reference: request``."""
    b, n, d = x.shape
    h, ev = attn.heads, attn.e_v
    opts = attn.options
    on = [c for c in CHANNELS if getattr(opts, c)]
    width = len(on) * h * ev
    proj = silu(torch.einsum("bnd,kd->bnk", x, attn.uv.weight))
    u, v = proj[..., :width], proj[..., width:].reshape(b, n, h, ev)
    weights = {}  # channel -> [b, h, n, n]
    if opts.semantic:
        qk = silu(torch.einsum("bnd,kd->bnk", x, attn.channels["semantic"].qk.weight))
        q, k = (t.reshape(b, n, h, -1).permute(0, 2, 1, 3) for t in qk.chunk(2, dim=-1))  # [b, h, n, e]
        for rotation in tokens.rotations:
            q, k = rotation(q, k, tokens)
        bias = 0 if tokens.logit_bias is None else tokens.logit_bias.expand(b, h, n, n)
        lengths = tokens.valid.sum(-1).to(x.dtype)[:, None, None, None] if padded is None else padded
        weights["semantic"] = silu(torch.einsum("bhie,bhje->bhij", q, k) + bias) / lengths
    if opts.positional:
        w = attn.channels["positional"].table.weight
        table = torch.stack([torch.stack([w[max_len - 1 + j - i] for j in range(n)]) for i in range(n)])
        weights["positional"] = table.expand(b, h, n, n)
    if opts.temporal:
        w = attn.channels["temporal"].table.weight
        t = tokens.timestamps
        tau = t if opts.time_reference == "query" else tokens.request_times
        table = torch.stack(
            [
                torch.stack(
                    [
                        torch.stack(
                            [w[time_bucket(float(tau[r, i] - t[r, j]), opts.buckets)] for j in range(n)]
                        )
                        for i in range(n)
                    ]
                )
                for r in range(b)
            ]
        )
        weights["temporal"] = table[:, None].expand(b, h, n, n)
    see = allowed(tokens)
    z = torch.zeros(b, n, h, len(on), ev, dtype=x.dtype)
    for c, name in enumerate(on):
        a = weights[name] * see
        for r in range(b):
            for i in range(n):
                for j in range(n):
                    z[r, i, :, c] += a[r, :, i, j, None] * v[r, j]
    z = z.reshape(b, n, width)
    z = z / torch.sqrt((z**2).mean(-1, keepdim=True) + 1e-6)
    return linear(u * z, attn.out)


SUBSETS = [
    dict(zip(CHANNELS, bits, strict=False))
    for bits in [(1, 1, 1), (1, 0, 0), (0, 1, 0), (0, 0, 1), (1, 1, 0), (1, 0, 1), (0, 1, 1)]
]


@pytest.mark.parametrize("switches", SUBSETS, ids=lambda s: "+".join(c for c in CHANNELS if s[c]))
@pytest.mark.parametrize("heads", [1, 2])
def test_ams_matches_reference(build, make_tokens, switches, heads):
    attn = build(AMSAttention, D, heads=heads, buckets=8, **{k: bool(v) for k, v in switches.items()})
    tokens = timed(make_tokens(LENGTHS, N, causal=True))
    x = torch.randn(2, N, D, dtype=torch.float64)
    y = attn(x, tokens)
    assert y.shape == (2, N, D)
    torch.testing.assert_close(y[tokens.valid], ams_reference(attn, x, tokens)[tokens.valid])


def test_ams_non_causal_logit_bias_rotations_and_widths(build, make_tokens):
    attn = build(AMSAttention, D, heads=2, qk_dim=3, v_dim=2)
    tokens = timed(make_tokens(LENGTHS, N, causal=False))
    x = torch.randn(2, N, D, dtype=torch.float64)
    plain = attn(x, tokens)
    tokens.logit_bias = torch.randn(2, 2, N, N, dtype=torch.float64)
    tokens.rotations = [lambda q, k, t: (q * (1 + t.positions)[:, None, :, None], k)]
    biased = attn(x, tokens)
    assert not torch.allclose(biased[tokens.valid], plain[tokens.valid])
    torch.testing.assert_close(biased[tokens.valid], ams_reference(attn, x, tokens)[tokens.valid])


def test_ams_time_buckets():
    """⌊ln|Δt| / 0.301⌋ clamped to 0..buckets; |Δt| ≤ 1 s is bucket 0."""
    from ablate_plugins.attention_parts import time_buckets

    dt = torch.tensor([0.0, 0.5, -1.0, 2.0, -60.0, 3600.0, 1e30])
    expected = [0, 0, 0, 2, 13, 27, 40]  # ln 2 / .301 = 2.3; ln 60 / .301 = 13.6; ln 3600 / .301 = 27.2
    assert time_buckets(dt, buckets=40).tolist() == expected


OWNED = {
    "semantic": "channels.semantic.qk.weight",
    "positional": "channels.positional.table.weight",
    "temporal": "channels.temporal.table.weight",
}


@pytest.mark.parametrize("channel", CHANNELS)
def test_ams_switch_changes_parameters_and_output(build, make_tokens, channel):
    tokens = timed(make_tokens(LENGTHS, N, causal=True))
    x = torch.randn(2, N, D, dtype=torch.float64)
    full = build(AMSAttention, D, heads=2)
    part = build(AMSAttention, D, heads=2, **{channel: False})
    full_params, part_params = dict(full.named_parameters()), dict(part.named_parameters())
    assert set(OWNED.values()) <= set(full_params)
    assert set(part_params) == set(full_params) - {OWNED[channel]}
    # U and the output projection shrink by one channel's h·e_v = 8 columns.
    assert part.uv.weight.shape[0] == full.uv.weight.shape[0] - 8
    assert part.out.weight.shape[1] == full.out.weight.shape[1] - 8
    assert sum(p.numel() for p in part.parameters()) < sum(p.numel() for p in full.parameters())
    # The channel contributes: silencing its own parameters (weights SiLU(0)/N = 0, or a zero
    # table) changes the full model's output.
    y = full(x, tokens)
    with torch.no_grad():
        full_params[OWNED[channel]].zero_()
    assert not torch.allclose(full(x, tokens)[tokens.valid], y[tokens.valid])
    assert not torch.allclose(part(x, tokens)[tokens.valid], y[tokens.valid])


def test_ams_requirements_and_validation(build):
    assert AMSAttention.requirements(AMSAttention.Options()) == {"timestamps"}
    assert AMSAttention.requirements(AMSAttention.Options(temporal=False)) == frozenset()
    assert AMSAttention.ordered_only
    with pytest.raises(pydantic.ValidationError, match="switch on at least one channel"):
        AMSAttention.Options(semantic=False, positional=False, temporal=False)
    with pytest.raises(pydantic.ValidationError, match="buckets"):
        AMSAttention.Options(buckets=0)


def test_ams_temporal_needs_timestamps(build, make_tokens):
    attn = build(AMSAttention, D, heads=2)
    with pytest.raises(ValueError, match="timestamps"):
        attn(torch.randn(2, N, D, dtype=torch.float64), make_tokens(LENGTHS, N, causal=True))
    attn = build(AMSAttention, D, heads=2, temporal=False)
    y = attn(torch.randn(2, N, D, dtype=torch.float64), make_tokens(LENGTHS, N, causal=True))
    assert y.shape == (2, N, D)


def test_ams_no_future_leak(build, make_tokens):
    attn = build(AMSAttention, D, heads=2, buckets=16)
    tokens = timed(make_tokens(LENGTHS, N, causal=True))
    tokens.logit_bias = torch.randn(1, 2, N, N, dtype=torch.float64)
    assert_no_future_leak(attn, tokens, torch.randn(2, N, D, dtype=torch.float64))


def test_ams_padding_invariance(build, make_tokens, padding_invariant):
    attn = build(AMSAttention, D, heads=2)
    padding_invariant(
        with_garbage_times(attn, TIMES),
        torch.randn(2, N, D, dtype=torch.float64),
        make_tokens(LENGTHS, N, causal=True),
    )


def test_ams_gradcheck(build, make_tokens, gradcheck_all):
    attn = build(AMSAttention, 4, max_len=4, heads=2, buckets=6)
    tokens = timed(make_tokens([3, 2], 3, causal=True), TIMES[:, :3])
    gradcheck_all(attn, lambda x: attn(x, tokens), torch.randn(2, 3, 4, dtype=torch.float64))


def test_ams_dropout(build, make_tokens):
    assert_dropout_from_model_and_train_only(build, AMSAttention, make_tokens, heads=2)


# ----------------------------------------------------------------------------------------------
# The published behaviours of pointwise (HSTU) and ams (FuXi-α), each an option (issue 20).

SILU_KINDS = [PointwiseAttention, AMSAttention]
REFERENCES = {PointwiseAttention: pointwise_reference, AMSAttention: ams_reference}


def requested(tokens: TokenContext) -> TokenContext:
    """``tokens`` (with timestamps) plus request times: each query's next token's time; the last
    real token's is a later time of its own (the item it predicts), padding repeats it."""
    t = tokens.timestamps
    nxt = torch.cat([t[:, 1:], t[:, -1:]], dim=1)
    last = tokens.valid.sum(1) - 1
    rows = torch.arange(len(t))
    target = t[rows, last] + torch.tensor([7200.0, 50.0], dtype=t.dtype)[: len(t)]
    request = torch.where(torch.arange(t.shape[1])[None] >= last[:, None], target[:, None], nxt)
    tokens.request_times = request
    return tokens


@pytest.mark.parametrize("kind", SILU_KINDS, ids=lambda k: k.__name__)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("width", [None, 211])
def test_padded_normaliser_divides_by_a_fixed_width(build, make_tokens, kind, causal, width):
    """``normaliser: padded``: N is ``padded_width`` (else ``max_len``, 16 here) for every row."""
    options = dict(heads=2, normaliser="padded") | ({} if width is None else dict(padded_width=width))
    attn = build(kind, D, **options)
    tokens = timed(make_tokens(LENGTHS, N, causal))
    x = torch.randn(2, N, D, dtype=torch.float64)
    expected = REFERENCES[kind](attn, x, tokens, padded=16 if width is None else width)
    torch.testing.assert_close(attn(x, tokens)[tokens.valid], expected[tokens.valid])
    by_length = build(kind, D, heads=2)
    by_length.load_state_dict(attn.state_dict())
    assert not torch.allclose(by_length(x, tokens)[tokens.valid], expected[tokens.valid])


@pytest.mark.parametrize("kind", SILU_KINDS, ids=lambda k: k.__name__)
def test_padded_normaliser_keeps_padding_invariance(build, make_tokens, padding_invariant, kind):
    """A fixed N, never the batch's own padded width: extra padding changes nothing."""
    attn = build(kind, D, heads=2, normaliser="padded", padded_width=40)
    padding_invariant(
        with_garbage_times(attn, TIMES),
        torch.randn(2, N, D, dtype=torch.float64),
        make_tokens(LENGTHS, N, True),
    )


@pytest.mark.parametrize("kind", SILU_KINDS, ids=lambda k: k.__name__)
def test_padded_width_needs_the_padded_normaliser(kind):
    with pytest.raises(pydantic.ValidationError, match="padded_width=211 is N under normaliser 'padded'"):
        kind.Options(padded_width=211)
    with pytest.raises(pydantic.ValidationError, match="normaliser"):
        kind.Options(normaliser="batch")
    assert kind.Options(normaliser="padded", padded_width=211).padded_width == 211


def test_ams_request_time_matches_reference(build, make_tokens):
    """``time_reference: request``: the temporal channel buckets τ_i − t_j with τ_i the next
    token's time (the predicted item's at the last query), FuXi-α's request time."""
    attn = build(AMSAttention, D, heads=2, buckets=40, time_reference="request")
    tokens = requested(timed(make_tokens(LENGTHS, N, causal=True)))
    x = torch.randn(2, N, D, dtype=torch.float64)
    y = attn(x, tokens)
    torch.testing.assert_close(y[tokens.valid], ams_reference(attn, x, tokens)[tokens.valid])
    own = build(AMSAttention, D, heads=2, buckets=40)
    own.load_state_dict(attn.state_dict())
    assert not torch.allclose(own(x, tokens)[tokens.valid], y[tokens.valid])


def test_ams_request_time_sees_only_the_next_time(build, make_tokens):
    """Under the request time, outputs ≤ t depend on the times up to t + 1 (the request time of
    query t), on nothing later, and do depend on the time at t + 1."""
    attn = build(AMSAttention, D, heads=1, buckets=40, time_reference="request")
    tokens = requested(timed(make_tokens([5], N, causal=True), TIMES[:1]))
    x = torch.randn(1, N, D, dtype=torch.float64)
    y = attn(x, tokens)
    for t in range(N - 2):
        later = replace(
            tokens, request_times=tokens.request_times.clone(), timestamps=tokens.timestamps.clone()
        )
        later.timestamps[:, t + 2 :] += 1e4
        later.request_times[:, t + 1 :] += 1e4
        torch.testing.assert_close(attn(x, later)[:, : t + 1], y[:, : t + 1])
        moved = replace(tokens, request_times=tokens.request_times.clone())
        moved.request_times[:, t] += 1e5  # query t's request time, i.e. the time at t + 1
        assert not torch.allclose(attn(x, moved)[:, t], y[:, t])


def test_ams_request_time_needs_request_times(build, make_tokens):
    attn = build(AMSAttention, D, heads=2, time_reference="request")
    with pytest.raises(ValueError, match="carry no request times"):
        attn(torch.randn(2, N, D, dtype=torch.float64), timed(make_tokens(LENGTHS, N, causal=True)))


@pytest.mark.parametrize("kind", SILU_KINDS, ids=lambda k: k.__name__)
def test_output_dropout_drops_the_output_projection_in_training_only(build, make_tokens, kind):
    """``output_dropout: p``: each output entry is the eval output / (1 − p) or 0; 0 by default."""
    assert build(kind, D, heads=2).output_dropout.p == 0.0
    attn = build(kind, D, heads=2, dropout=0.0, output_dropout=0.5)
    tokens = timed(make_tokens(LENGTHS, N, causal=True))
    x = torch.randn(2, N, D, dtype=torch.float64)
    y = attn(x, tokens)
    attn.train()
    dropped = attn(x, tokens)
    kept = dropped != 0
    assert 0 < kept.sum() < kept.numel()
    torch.testing.assert_close(dropped[kept], 2 * y[kept])


@pytest.mark.parametrize("kind", SILU_KINDS, ids=lambda k: k.__name__)
def test_published_initialisation(build, kind):
    """``init: published``: input projections N(0, 0.02²) (HSTU's ``_uvqk``), the output
    projection's weight Xavier-uniform; ``torch`` keeps nn.Linear's U(±1/√fan_in)."""
    d = 64
    attn = build(kind, d, heads=2, init="published")
    inputs = [attn.uvqk] if kind is PointwiseAttention else [attn.uv, attn.channels["semantic"].qk]
    for layer in inputs:
        assert abs(layer.weight.std().item() / 0.02 - 1) < 0.05 and abs(layer.weight.mean().item()) < 2e-3
    fan_out, fan_in = attn.out.weight.shape
    bound = math.sqrt(6 / (fan_in + fan_out))
    assert attn.out.weight.abs().max() <= bound
    assert abs(attn.out.weight.std().item() / (bound / math.sqrt(3)) - 1) < 0.05
    plain = build(kind, d, heads=2)
    assert all(p.abs().max() <= p.shape[1] ** -0.5 for p in [plain.out.weight, *(m.weight for m in inputs)])


# ----------------------------------------------------------------------------------------------
# time_interval (TiSASRec)


def intervals_by_hand(times: Tensor, valid: Tensor, causal: bool, k: int) -> list[list[list[int]]]:
    """r_ij = min(⌊|t_i − t_j| / u_i⌋, k), u_i the smallest non-zero gap among the real tokens
    query i may see (all real tokens; only 0..i when causal), 1 if there is none."""
    out = []
    for t, real in zip(times.tolist(), valid.tolist(), strict=False):
        n, rows = len(t), []
        for i in range(n):
            seen = [j for j in range(n) if real[j] and (j <= i or not causal)]
            gaps = [abs(t[a] - t[c]) for a in seen for c in seen if t[a] != t[c]]
            unit = min(gaps, default=1.0)
            rows.append([min(math.floor(abs(t[i] - t[j]) / unit), k) for j in range(n)])
        out.append(rows)
    return out


def time_interval_reference(attn: TimeIntervalAttention, x: Tensor, tokens: TokenContext) -> Tensor:
    """``W_o concat_h Σ_j softmax_j(q_i·(k_j + E^K_{r_ij})/√e + B_ij) (v_j + E^V_{r_ij})`` with the
    interval embeddings materialised as ``[b, n, n, d]``."""
    b, n, d = x.shape
    h = attn.heads
    e = d // h
    q, k, v = (t.reshape(b, n, h, e).permute(0, 2, 1, 3) for t in linear(x, attn.qkv).split(d, dim=-1))
    for rotation in tokens.rotations:
        q, k = rotation(q, k, tokens)
    r = torch.tensor(intervals_by_hand(tokens.timestamps, tokens.valid, tokens.causal, attn.max_interval))
    ek = attn.interval_k[r].reshape(b, n, n, h, e)  # [b, n, n, h, e]
    ev = attn.interval_v[r].reshape(b, n, n, h, e)
    logits = (torch.einsum("bhie,bhje->bhij", q, k) + torch.einsum("bhie,bijhe->bhij", q, ek)) / math.sqrt(e)
    if tokens.logit_bias is not None:
        logits = logits + tokens.logit_bias
    logits = logits.masked_fill(~allowed(tokens), float("-inf"))
    p = torch.exp(logits - logits.amax(-1, keepdim=True))
    p = p / p.sum(-1, keepdim=True)
    o = torch.einsum("bhij,bhje->bihe", p, v) + torch.einsum("bhij,bijhe->bihe", p, ev)
    return linear(o.reshape(b, n, d), attn.out)


def test_time_interval_matrix_by_hand(build, make_tokens):
    """One row, five real tokens and one padded token whose (garbage) time is 1 s from the last."""
    attn = build(TimeIntervalAttention, D, max_interval=16)
    times = torch.tensor([[0.0, 30.0, 40.0, 45.0, 100.0, 101.0]])
    tokens = timed(make_tokens([5], 6, causal=False), times)
    # Smallest non-zero gap among the real tokens: 45 − 40 = 5 (the padded 101 − 100 = 1 is ignored).
    expected = [[0, 6, 8, 9, 16], [6, 0, 2, 3, 14], [8, 2, 0, 1, 12], [9, 3, 1, 0, 11], [16, 14, 12, 11, 0]]
    assert attn.intervals(tokens)[0, :5, :5].tolist() == expected
    # Causal: query i's unit comes from tokens 0..i: 1 (none), 30, 10, 5, 5.
    tokens = timed(make_tokens([5], 6, causal=True), times)
    r = attn.intervals(tokens)[0]
    expected_causal = [[0], [1, 0], [4, 1, 0], [9, 3, 1, 0], [16, 14, 12, 11, 0]]
    assert [r[i, : i + 1].tolist() for i in range(5)] == expected_causal


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("heads", [1, 2])
@pytest.mark.parametrize("extras", [False, True], ids=["plain", "bias+rotation"])
def test_time_interval_matches_reference(build, make_tokens, causal, heads, extras):
    attn = build(TimeIntervalAttention, D, heads=heads, max_interval=12)
    tokens = timed(make_tokens(LENGTHS, N, causal))
    if extras:
        tokens.logit_bias = torch.randn(1, heads, N, N, dtype=torch.float64)
        tokens.rotations = [lambda q, k, t: (q * (1 + t.positions)[:, None, :, None], k.flip(-1))]
    x = torch.randn(2, N, D, dtype=torch.float64)
    y = attn(x, tokens)
    assert y.shape == (2, N, D)
    torch.testing.assert_close(y[tokens.valid], time_interval_reference(attn, x, tokens)[tokens.valid])


def test_time_interval_embeddings_matter(build, make_tokens):
    attn = build(TimeIntervalAttention, D, heads=2, max_interval=12)
    tokens = timed(make_tokens(LENGTHS, N, causal=True))
    x = torch.randn(2, N, D, dtype=torch.float64)
    y = attn(x, tokens)
    for table in (attn.interval_k, attn.interval_v):
        with torch.no_grad():
            saved = table.clone()
            table.zero_()
            assert not torch.allclose(attn(x, tokens)[tokens.valid], y[tokens.valid])
            table.copy_(saved)


def test_time_interval_no_future_leak(build, make_tokens):
    attn = build(TimeIntervalAttention, D, heads=2, max_interval=64)
    tokens = timed(make_tokens(LENGTHS, N, causal=True))
    tokens.logit_bias = torch.randn(1, 2, N, N, dtype=torch.float64)
    assert_no_future_leak(attn, tokens, torch.randn(2, N, D, dtype=torch.float64))


@pytest.mark.parametrize("causal", [True, False])
def test_time_interval_padding_invariance(build, make_tokens, padding_invariant, causal):
    attn = build(TimeIntervalAttention, D, heads=2, max_interval=64)
    padding_invariant(
        with_garbage_times(attn, TIMES),
        torch.randn(2, N, D, dtype=torch.float64),
        make_tokens(LENGTHS, N, causal),
    )


def test_time_interval_gradcheck(build, make_tokens, gradcheck_all):
    attn = build(TimeIntervalAttention, 4, heads=2, max_interval=4)
    tokens = timed(make_tokens([3, 2], 3, causal=True), TIMES[:, :3])
    gradcheck_all(attn, lambda x: attn(x, tokens), torch.randn(2, 3, 4, dtype=torch.float64))


def test_time_interval_requirements_and_errors(build, make_tokens):
    assert TimeIntervalAttention.requirements(TimeIntervalAttention.Options()) == {"timestamps"}
    assert TimeIntervalAttention.ordered_only
    assert TimeIntervalAttention.Options().max_interval == 256
    with pytest.raises(ValueError, match=r"time_interval attention: model width dim=8 is not divisible"):
        build(TimeIntervalAttention, 8, heads=3)
    with pytest.raises(ValueError, match="timestamps"):
        attn = build(TimeIntervalAttention, D)
        attn(torch.randn(2, N, D, dtype=torch.float64), make_tokens(LENGTHS, N, causal=True))
    assert_dropout_from_model_and_train_only(build, TimeIntervalAttention, make_tokens, heads=2)


# ----------------------------------------------------------------------------------------------
# none


def test_none_mixes_nothing(build, make_tokens, padding_invariant):
    attn = build(NoAttention, D)
    assert list(attn.parameters()) == []
    tokens = make_tokens(LENGTHS, N, causal=True)
    x = torch.randn(2, N, D, dtype=torch.float64, requires_grad=True)
    y = attn(x, tokens)
    assert y.shape == x.shape and y.dtype == x.dtype
    torch.testing.assert_close(y, torch.zeros_like(x))
    assert not y.requires_grad  # constant: contributes no gradient to x
    torch.testing.assert_close(attn(torch.randn_like(x), tokens), y)  # nothing leaks, from anywhere
    padding_invariant(attn, x.detach(), tokens)


# ---------------------------------------------------------------------------------------
# FT-Transformer's / T2G-Former's projection initialisation (softmax and fr_graph ``init``)


def _projections(kind: str, attn) -> tuple[list[Tensor], Tensor, list[Tensor]]:
    """``(query/key weights, value weight, biases)`` of a softmax or fr_graph module."""
    if kind == "softmax":
        w = attn.qkv.weight
        return [w[:64], w[64:128]], w[128:], [attn.qkv.bias, attn.out.bias]
    edges = attn.edges
    return [edges.w_head.weight], attn.value.weight, [edges.w_head.bias, attn.value.bias, attn.out.bias]


@pytest.mark.parametrize("kind", ["softmax", "fr_graph"])
@pytest.mark.parametrize("heads", [1, 4])
def test_projection_initialisations_follow_ft_transformers_schemes(kind, heads):
    """ "kaiming": nn.Linear's weights, zero biases; "xavier": query/key (head/tail) weights, and the
    value weight with > 1 head, uniform in ±gain·√(6 / (fan_in + fan_out)) with gain 1/√2 and each
    d × d block its own fans; "torch": nn.Linear's weights and biases (±1/√fan_in)."""
    from ablate.components import BuildContext
    from ablate_plugins.graph_attention import FRGraphAttention

    d = 64
    cls = SoftmaxAttention if kind == "softmax" else FRGraphAttention
    ctx = BuildContext(dim=d, max_len=8, ordered=kind == "softmax", features=frozenset({"readout"}))
    built = {}
    for init in ("torch", "kaiming", "xavier"):
        torch.manual_seed(0)
        built[init] = _projections(kind, cls(cls.Options(heads=heads, init=init), ctx))
    linear_bound, xavier_bound = 1 / math.sqrt(d), 2**-0.5 * math.sqrt(6 / (2 * d))
    torch_qk, torch_v, torch_biases = built["torch"]
    kaiming_qk, kaiming_v, kaiming_biases = built["kaiming"]
    for a, b in zip(torch_qk + [torch_v], kaiming_qk + [kaiming_v], strict=True):
        torch.testing.assert_close(a, b)  # the same draws: kaiming only zeroes the biases
        assert 0.95 * linear_bound < a.abs().max() <= linear_bound
    assert all((b == 0).all() for b in kaiming_biases)
    if kind == "softmax":
        assert all(0.9 * linear_bound < b.abs().max() <= linear_bound for b in torch_biases)
    xavier_qk, xavier_v, xavier_biases = built["xavier"]
    for w in xavier_qk + ([xavier_v] if heads > 1 else []):
        assert 0.95 * xavier_bound < w.abs().max() <= xavier_bound
        assert w.var().item() == pytest.approx(xavier_bound**2 / 3, rel=0.1)  # uniform's variance
    if heads == 1:  # one head: the value projection keeps nn.Linear's weights
        assert 0.95 * linear_bound < xavier_v.abs().max() <= linear_bound
    assert all((b == 0).all() for b in xavier_biases)

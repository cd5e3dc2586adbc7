"""Bias channels against hand-written math: absolute, sinusoidal and rotary positions,
relative position / time tables, TiSASRec's log time gap.

Dimensions: ``b`` batch, ``n`` tokens, ``d`` model width, ``h`` heads, ``e`` head width,
``L`` max_len. Logit biases are ``[b|1, h|1, n, n]`` (query i, key j).
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from torch import Tensor, nn

from ablate import registry
from ablate.components import BiasChannel, BuildContext, TokenContext
from ablate.model.blocks import Backbone, Block, PreNorm
from ablate.model.build import build_backbone, count_parameters
from ablate.model.spec import ModelSpec
from ablate.model.variant import Part, Variant
from ablate.study import sizes
from ablate_plugins.attention import SoftmaxAttention
from ablate_plugins.bias import (
    AbsolutePosition,
    LogTimeGap,
    RelativePosition,
    RelativeTime,
    Rotary,
    SinusoidalPosition,
)
from ablate_plugins.connection import Residual

D, L = 6, 8


def test_matches_reference(build, make_tokens):
    channel = build(AbsolutePosition, D, max_len=L)
    tokens = make_tokens([5, 3], 5, causal=True)
    tokens.positions = torch.tensor([[0, 1, 2, 3, 4], [4, 5, 7, 0, 0]])
    x = torch.randn(2, 5, D, dtype=torch.float64)
    table = channel.table.weight
    rows = [torch.stack([table[i] for i in row]) for row in tokens.positions.tolist()]
    expected = x + torch.stack(rows)
    y = channel.embed(x, tokens)
    torch.testing.assert_close(y[tokens.valid], expected[tokens.valid])


def test_end_alignment_counts_back_from_the_last_real_token(build, make_tokens):
    """SASRec's left-padded windows: a row of ``len`` tokens uses table rows ``L - len .. L - 1``."""
    channel = build(AbsolutePosition, D, max_len=L, align="end")
    tokens = make_tokens([5, 3, 1], 5, causal=True)
    x = torch.randn(3, 5, D, dtype=torch.float64)
    table = channel.table.weight
    y = channel.embed(x, tokens)
    for row, length in enumerate([5, 3, 1]):
        torch.testing.assert_close(y[row, :length], x[row, :length] + table[L - length :])


def test_is_an_embedding_only_channel_for_ordered_tokens(build, make_tokens):
    channel = build(AbsolutePosition, D, max_len=L)
    assert AbsolutePosition.ordered_only
    assert channel.logits(make_tokens([2], 2, causal=True)) is None and not channel.rotates
    assert channel.table.weight.shape == (L, D)


def test_position_wise(build, make_tokens, position_wise):
    channel = build(AbsolutePosition, D, max_len=L)
    tokens = make_tokens([5, 5], 5, causal=True)
    position_wise(lambda x: channel.embed(x, tokens), torch.randn(2, 5, D, dtype=torch.float64))


def test_padding_invariance(build, make_tokens, padding_invariant):
    channel = build(AbsolutePosition, D, max_len=L)
    x = torch.randn(2, 5, D, dtype=torch.float64)
    padding_invariant(channel.embed, x, make_tokens([5, 3], 5, causal=True))


def test_padded_positions_beyond_the_table_are_ignored(build, make_tokens):
    channel = build(AbsolutePosition, D, max_len=4)
    tokens = make_tokens([4, 2], 6, causal=True)  # positions 4, 5 exist only at padding
    x = torch.randn(2, 6, D, dtype=torch.float64)
    y = channel.embed(x, tokens)
    torch.testing.assert_close(y[0, :4], x[0, :4] + channel.table.weight)


@pytest.mark.parametrize("bad", [8, 11, -1])
def test_positions_outside_the_table_raise(build, make_tokens, bad):
    channel = build(AbsolutePosition, D, max_len=L)
    tokens = make_tokens([3], 3, causal=True)
    tokens.positions = torch.tensor([[0, bad, 2]])
    with pytest.raises(ValueError, match=rf"span .*{bad}.* max_len={L}"):
        channel.embed(torch.randn(1, 3, D, dtype=torch.float64), tokens)


def test_gradcheck(build, make_tokens, gradcheck_all):
    channel = build(AbsolutePosition, 3, max_len=4)
    tokens = make_tokens([3, 2], 3, causal=True)
    gradcheck_all(channel, lambda x: channel.embed(x, tokens), torch.randn(2, 3, 3, dtype=torch.float64))


# =============================================================================================
# shared helpers for the position / time channels

LOGIT_KINDS = [RelativePosition, RelativeTime, LogTimeGap]
DAY = 86400.0


def timed(tokens: TokenContext, gaps: Tensor | None = None) -> TokenContext:
    """``tokens`` with timestamps: cumulative random gaps (seconds to months) from 0, padded
    positions repeating the last real time, as the core promises."""
    b, n = tokens.shape
    if gaps is None:
        gaps = torch.exp(torch.empty(b, n).uniform_(0, 16))
    t = torch.cat([torch.zeros(b, 1), gaps[:, 1:]], dim=1).cumsum(1)
    last = (tokens.valid.sum(1) - 1).clamp(min=0)
    t = torch.where(tokens.valid, t, t.gather(1, last[:, None]))
    return replace(tokens, timestamps=t.float())


def padded(tokens: TokenContext, extra: int) -> TokenContext:
    """Append ``extra`` padded positions (time repeating the last real one)."""
    b, n = tokens.shape
    valid = torch.cat([tokens.valid, torch.zeros(b, extra, dtype=torch.bool)], dim=1)
    positions = torch.arange(n + extra).expand(b, n + extra).clone()
    out = TokenContext(valid=valid, causal=tokens.causal, positions=positions)
    if tokens.timestamps is not None:
        last = (tokens.valid.sum(1) - 1).clamp(min=0)
        tail = tokens.timestamps.gather(1, last[:, None]).expand(b, extra)
        out.timestamps = torch.cat([tokens.timestamps, tail], dim=1)
    return out


def randomised(channel: nn.Module) -> nn.Module:
    with torch.no_grad():
        for p in channel.parameters():
            p.copy_(torch.randn_like(p))
    return channel


# =============================================================================================
# sinusoidal


@pytest.mark.parametrize("d", [6, 5])
def test_sinusoidal_matches_reference(build, make_tokens, d):
    channel = build(SinusoidalPosition, d)
    tokens = make_tokens([5, 3], 5, causal=True)
    tokens.positions = torch.tensor([[0, 1, 2, 3, 4], [7, 8, 9, 0, 0]])
    x = torch.randn(2, 5, d, dtype=torch.float64)
    expected = x.clone()
    for b, row in enumerate(tokens.positions.tolist()):
        for t, p in enumerate(row):
            for c in range(d):
                i = c // 2
                angle = p / 10000 ** (2 * i / d)
                expected[b, t, c] += math.sin(angle) if c % 2 == 0 else math.cos(angle)
    torch.testing.assert_close(channel.embed(x, tokens), expected)


def test_sinusoidal_base_option(build, make_tokens):
    channel = build(SinusoidalPosition, 4, base=100.0)
    tokens = make_tokens([3], 3, causal=True)
    pe = channel.embed(torch.zeros(1, 3, 4, dtype=torch.float64), tokens)[0, 2]
    # θ = 100^{-0/4}, 100^{-2/4} = 1, 1/10
    expected = torch.tensor([math.sin(2), math.cos(2), math.sin(0.2), math.cos(0.2)], dtype=torch.float64)
    torch.testing.assert_close(pe, expected)


def test_fixed_channels_are_parameter_free_and_ordered_only(build, make_tokens):
    tokens = make_tokens([2], 2, causal=True)
    for kind in (SinusoidalPosition, Rotary):
        channel = build(kind, 4)
        assert kind.ordered_only and not list(channel.parameters())
        assert channel.logits(tokens) is None
    assert build(Rotary, 4).rotates and not build(SinusoidalPosition, 4).rotates


def test_sinusoidal_position_wise(build, make_tokens, position_wise):
    channel = build(SinusoidalPosition, D)
    tokens = make_tokens([5, 5], 5, causal=True)
    position_wise(lambda x: channel.embed(x, tokens), torch.randn(2, 5, D, dtype=torch.float64))


def test_sinusoidal_padding_invariance(build, make_tokens, padding_invariant):
    channel = build(SinusoidalPosition, D)
    x = torch.randn(2, 5, D, dtype=torch.float64)
    padding_invariant(channel.embed, x, make_tokens([5, 3], 5, causal=True))


def test_sinusoidal_gradcheck(build, make_tokens):
    channel = build(SinusoidalPosition, 4)
    tokens = make_tokens([3, 2], 3, causal=True)
    x = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: channel.embed(x, tokens), (x,))


# =============================================================================================
# rotary


def rope_reference(x: Tensor, positions: Tensor, base: float = 10000.0) -> Tensor:
    """Rotate each pair (x_{2i}, x_{2i+1}) at position p by p·base^{−2i/e}, with a 2×2 matrix."""
    b, h, n, e = x.shape
    out = torch.empty_like(x)
    for bi in range(b):
        for t in range(n):
            p = float(positions[bi, t])
            for i in range(e // 2):
                a = p * base ** (-2 * i / e)
                rot = torch.tensor([[math.cos(a), -math.sin(a)], [math.sin(a), math.cos(a)]], dtype=x.dtype)
                out[bi, :, t, 2 * i : 2 * i + 2] = x[bi, :, t, 2 * i : 2 * i + 2] @ rot.T
    return out


def test_rope_matches_reference(build, make_tokens):
    channel = build(Rotary, 8)
    tokens = make_tokens([5, 3], 5, causal=True)
    tokens.positions = torch.tensor([[0, 1, 2, 3, 4], [3, 9, 27, 0, 0]])
    q, k = torch.randn(2, 2, 5, 6, dtype=torch.float64), torch.randn(2, 2, 5, 6, dtype=torch.float64)
    rq, rk = channel.rotate(q, k, tokens)
    torch.testing.assert_close(rq, rope_reference(q, tokens.positions))
    torch.testing.assert_close(rk, rope_reference(k, tokens.positions))
    rq, _ = build(Rotary, 8, base=50.0).rotate(q, k, tokens)
    torch.testing.assert_close(rq, rope_reference(q, tokens.positions, base=50.0))


def test_rope_scores_depend_only_on_the_offset(build, make_tokens):
    channel = build(Rotary, 8)
    e = 8
    q, k = torch.randn(1, 1, 1, e, dtype=torch.float64), torch.randn(1, 1, 1, e, dtype=torch.float64)

    def score(p: int, r: int) -> Tensor:
        tokens = make_tokens([1], 1, causal=True)
        tokens.positions = torch.tensor([[p]])
        rq, _ = channel.rotate(q, q, tokens)
        tokens.positions = torch.tensor([[r]])
        _, rk = channel.rotate(k, k, tokens)
        return (rq * rk).sum()

    for p, r in [(0, 3), (5, 2), (7, 7)]:
        for shift in (1, 11, 400):
            torch.testing.assert_close(score(p + shift, r + shift), score(p, r))
    assert not torch.allclose(score(0, 3), score(0, 4))


def test_rope_preserves_norms(build, make_tokens):
    channel = build(Rotary, 8)
    tokens = make_tokens([6, 4], 6, causal=True)
    q, k = torch.randn(2, 2, 6, 8, dtype=torch.float64), torch.randn(2, 2, 6, 8, dtype=torch.float64)
    rq, rk = channel.rotate(q, k, tokens)
    torch.testing.assert_close(rq.norm(dim=-1), q.norm(dim=-1))
    torch.testing.assert_close(rk.norm(dim=-1), k.norm(dim=-1))
    torch.testing.assert_close(rq[:, :, 0], q[:, :, 0])  # position 0 is not rotated


def test_rope_odd_head_width_raises(build, make_tokens):
    q = torch.randn(1, 1, 2, 5, dtype=torch.float64)
    with pytest.raises(ValueError, match="head width is 5"):
        build(Rotary, 5).rotate(q, q, make_tokens([2], 2, causal=True))


def test_rope_no_future_leak(build, make_tokens):
    channel = build(Rotary, 8)
    tokens = make_tokens([6], 6, causal=True)
    q, k = torch.randn(1, 2, 6, 4, dtype=torch.float64), torch.randn(1, 2, 6, 4, dtype=torch.float64)
    rq, rk = channel.rotate(q, k, tokens)
    for t in range(5):
        q2, k2 = q.clone(), k.clone()
        q2[:, :, t + 1 :] = torch.randn_like(q2[:, :, t + 1 :])
        k2[:, :, t + 1 :] = torch.randn_like(k2[:, :, t + 1 :])
        rq2, rk2 = channel.rotate(q2, k2, tokens)
        torch.testing.assert_close(rq2[:, :, : t + 1], rq[:, :, : t + 1])
        torch.testing.assert_close(rk2[:, :, : t + 1], rk[:, :, : t + 1])


def test_rope_padding_invariance(build, make_tokens):
    channel = build(Rotary, 8)
    tokens = make_tokens([5, 3], 5, causal=True)
    q, k = torch.randn(2, 2, 5, 4, dtype=torch.float64), torch.randn(2, 2, 5, 4, dtype=torch.float64)
    rq, rk = channel.rotate(q, k, tokens)
    big = padded(tokens, 3)
    pad = lambda x: torch.cat([x, 100 * torch.randn(2, 2, 3, 4, dtype=x.dtype)], dim=2)  # noqa: E731
    rq2, rk2 = channel.rotate(pad(q), pad(k), big)
    valid = tokens.valid[:, None, :].expand(2, 2, 5)
    torch.testing.assert_close(rq2[:, :, :5][valid], rq[valid])
    torch.testing.assert_close(rk2[:, :, :5][valid], rk[valid])


def test_rope_gradcheck(build, make_tokens):
    channel = build(Rotary, 4)
    tokens = make_tokens([3, 2], 3, causal=True)
    q = torch.randn(2, 1, 3, 4, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 1, 3, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda q, k: channel.rotate(q, k, tokens), (q, k))


# =============================================================================================
# relative position


@pytest.mark.parametrize("shift", [0, 2], ids=["same-positions", "row-1-differs"])
def test_rel_pos_matches_reference(build, make_tokens, shift):
    """Rows with the same positions share one ``[1, n, n]`` table; rows that differ get their own."""
    channel = randomised(build(RelativePosition, D, max_len=4))
    w = channel.table.weight
    assert w.shape == (7,)
    tokens = make_tokens([6, 4], 6, causal=True)  # n = 6 > L = 4: offsets beyond ±3 are clipped
    tokens.positions = tokens.positions.clone()
    tokens.positions[1] = tokens.positions[1] * (1 + shift)  # row 1: 0, 3, 6, ... where it differs
    bias = channel.logits(tokens)
    assert bias.shape == ((1 if shift == 0 else 2), 1, 6, 6)
    p = tokens.positions
    for b in range(2):
        for i in range(6):
            for j in range(6):
                offset = min(max(int(p[b, j] - p[b, i]), -3), 3)
                torch.testing.assert_close(bias.expand(2, 1, 6, 6)[b, 0, i, j], w[offset + 3])


def test_rel_pos_is_a_logit_only_channel(build, make_tokens):
    channel = build(RelativePosition, D)
    x = torch.randn(1, 2, D, dtype=torch.float64)
    tokens = make_tokens([2], 2, causal=True)
    assert channel.embed(x, tokens) is x and not channel.rotates
    assert RelativePosition.ordered_only
    assert RelativePosition.requirements(RelativePosition.Options()) == frozenset()


# =============================================================================================
# relative time


@pytest.mark.parametrize(
    "dt, bucket",
    [
        (0.0, 0),  # |Δt| ≤ 1 s: ln 1 = 0
        (0.5, 0),
        (1.0, 0),
        (2.0, 2),  # ln 2 / 0.301 = 2.30
        (-2.0, 2),  # symmetric in the sign
        (10.0, 7),  # 2.303 / 0.301 = 7.65
        (3600.0, 27),  # 8.189 / 0.301 = 27.20
        (DAY, 37),  # 11.367 / 0.301 = 37.76
        (365 * DAY, 57),  # 17.267 / 0.301 = 57.37
        (1e30, 128),  # 69.08 / 0.301 = 229.5, clamped to the last bucket
    ],
)
def test_rel_time_buckets_by_hand(build, make_tokens, dt, bucket):
    channel = randomised(build(RelativeTime, D))
    assert channel.table.weight.shape == (129,)
    tokens = make_tokens([2], 2, causal=True)
    tokens.timestamps = torch.tensor([[0.0, dt]], dtype=torch.float64)
    bias = channel.logits(tokens)[0, 0]
    w = channel.table.weight
    # row i = query, column j = key: B[1, 0] uses t_1 − t_0 = dt, B[0, 1] uses −dt, the diagonal 0.
    expected = torch.stack([torch.stack([w[0], w[bucket]]), torch.stack([w[bucket], w[0]])])
    torch.testing.assert_close(bias, expected)


def test_rel_time_matches_reference(build, make_tokens):
    channel = randomised(build(RelativeTime, D, buckets=20))
    tokens = timed(make_tokens([5, 3], 5, causal=True))
    t = tokens.timestamps.double()
    bias = channel.logits(tokens)
    assert bias.shape == (2, 1, 5, 5)
    for b in range(2):
        for i in range(5):
            for j in range(5):
                dt = abs(float(t[b, i] - t[b, j]))
                k = min(max(math.floor(math.log(max(dt, 1.0)) / 0.301), 0), 20)
                torch.testing.assert_close(bias[b, 0, i, j], channel.table.weight[k])


@pytest.mark.parametrize("kind", [RelativeTime, LogTimeGap])
def test_time_channels_need_timestamps(build, make_tokens, kind):
    assert kind.requirements(kind.Options()) == frozenset({"timestamps"}) and kind.ordered_only
    with pytest.raises(ValueError, match="timestamps"):
        build(kind, D).logits(make_tokens([3], 3, causal=True))


# =============================================================================================
# log time gap (TiSASRec, the seed's form)


def test_log_time_gap_matches_reference(build, make_tokens):
    channel = build(LogTimeGap, D, alpha=0.7, max_gap=10 * DAY)
    tokens = timed(make_tokens([5, 3], 5, causal=True))
    t = tokens.timestamps.double()
    bias = channel.logits(tokens)
    assert bias.shape == (2, 1, 5, 5)
    for b in range(2):
        for i in range(5):
            for j in range(5):
                gap = min(abs(float(t[b, i] - t[b, j])), 10 * DAY)
                expected = 0.7 * math.log1p(gap) / math.log1p(10 * DAY)
                torch.testing.assert_close(bias[b, 0, i, j].item(), expected, rtol=1e-6, atol=1e-7)


def test_log_time_gap_clamps_at_max_gap(build, make_tokens):
    channel = build(LogTimeGap, D)  # α = 1, T_max = 30 days
    tokens = make_tokens([3], 3, causal=True)
    tokens.timestamps = torch.tensor([[0.0, 30 * DAY, 400 * DAY]])
    bias = channel.logits(tokens)[0, 0]
    assert bias[1, 0].item() == pytest.approx(1.0) and bias[2, 0].item() == pytest.approx(1.0)
    assert bias[0, 0].item() == 0.0
    assert channel.alpha.item() == 1.0 and channel.options.max_gap == 30 * DAY


def test_log_time_gap_in_the_seeds_code_form(build, make_tokens):
    """``ceiling: false`` and ``scale: 1/√e``: the seed's ``compute_time_matrix`` (no cut at T_max,
    ``log1p(clamp(t_i − t_j, min=0)) / log1p(T_max)``) with α·T inside its ``/ √d_k``, written out
    independently in float64; α's gradient is the seed's ``T / √d_k``."""
    e = 50
    channel = build(LogTimeGap, D, alpha=1.0, ceiling=False, scale=e**-0.5)
    tokens = make_tokens([4], 4, causal=True)
    times = [0.0, 3 * DAY, 45 * DAY, 400 * DAY]  # two gaps beyond T_max = 30 days
    tokens.timestamps = torch.tensor([times], dtype=torch.float64)
    bias = channel.logits(tokens)[0, 0]
    for i in range(4):
        for j in range(i + 1):  # the keys a causal query sees: t_i ≥ t_j
            seed = math.log1p(max(times[i] - times[j], 0.0)) / math.log1p(30 * DAY)
            assert bias[i, j].item() == pytest.approx(seed / math.sqrt(e), rel=1e-6)
    assert bias[3, 0].item() * math.sqrt(e) > 1.15  # 400 days: past the ceiling the default keeps
    bias[3, 0].backward()
    expected = math.log1p(400 * DAY) / math.log1p(30 * DAY) / math.sqrt(e)
    assert channel.alpha.grad.item() == pytest.approx(expected, rel=1e-6)
    cut = build(LogTimeGap, D, alpha=1.0).logits(tokens)[0, 0]
    assert cut[3, 0].item() == pytest.approx(1.0) and cut[1, 0].item() == pytest.approx(
        bias[1, 0].item() * e**0.5
    )


# =============================================================================================
# properties shared by the logit channels


def logit_channel(build, kind):
    return randomised(build(kind, D, max_len=16))


@pytest.mark.parametrize("kind", LOGIT_KINDS)
def test_logit_channels_no_future_leak(build, make_tokens, kind):
    """Changing the sequence after position t (here: its times, and its length) leaves the
    bias of rows ≤ t over columns ≤ t unchanged."""
    channel = logit_channel(build, kind)
    tokens = timed(make_tokens([7], 7, causal=True))
    bias = channel.logits(tokens)
    for t in range(6):
        gaps = torch.exp(torch.empty(1, 7).uniform_(0, 16))
        later = timed(make_tokens([7], 7, causal=True), gaps)  # other times after t ...
        later.timestamps[:, t + 1 :] += tokens.timestamps[:, t] - later.timestamps[:, t]
        later.timestamps[:, : t + 1] = tokens.timestamps[:, : t + 1]  # ... the same up to t
        torch.testing.assert_close(channel.logits(later)[..., : t + 1, : t + 1], bias[..., : t + 1, : t + 1])
        prefix = make_tokens([t + 1], t + 1, causal=True)
        prefix.timestamps = tokens.timestamps[:, : t + 1]
        torch.testing.assert_close(channel.logits(prefix), bias[..., : t + 1, : t + 1])


@pytest.mark.parametrize("kind", LOGIT_KINDS)
def test_logit_channels_padding_invariance(build, make_tokens, kind):
    channel = logit_channel(build, kind)
    tokens = timed(make_tokens([5, 3], 5, causal=True))
    bias = channel.logits(tokens).expand(2, 1, 5, 5)
    big = channel.logits(padded(tokens, 3)).expand(2, 1, 8, 8)
    pairs = (tokens.valid[:, :, None] & tokens.valid[:, None, :])[:, None]
    torch.testing.assert_close(big[..., :5, :5][pairs], bias[pairs])


@pytest.mark.parametrize("kind", LOGIT_KINDS)
def test_logit_channels_gradcheck(build, make_tokens, gradcheck_all, kind):
    channel = logit_channel(build, kind)
    tokens = timed(make_tokens([3, 2], 3, causal=True))
    gradcheck_all(channel, lambda: channel.logits(tokens))


# =============================================================================================
# every kind inside a causal backbone


ALL_KINDS = [AbsolutePosition, SinusoidalPosition, Rotary, RelativePosition, RelativeTime, LogTimeGap]


class Linear(nn.Linear):
    """A position-wise map with ``FeedForward``'s interface."""

    def forward(self, x: Tensor, valid: Tensor | None = None) -> Tensor:
        return super().forward(x)


def backbone_with(kinds: list[type]) -> Backbone:
    ctx = BuildContext(dim=8, max_len=16, features=frozenset({"timestamps"}))
    residual = Residual.Options()
    mix, feed = (PreNorm(nn.LayerNorm(8), Residual(residual, ctx)) for _ in range(2))
    block = Block(SoftmaxAttention(SoftmaxAttention.Options(heads=2), ctx), Linear(8, 8), mix, feed)
    bias = [randomised(k(k.Options(), ctx)) for k in kinds]
    return Backbone(bias, Residual.stem(residual, ctx), [block], nn.LayerNorm(8), dropout=0.0).double().eval()


@pytest.mark.parametrize("kind", ALL_KINDS, ids=lambda k: k.__name__)
def test_backbone_no_future_leak_and_padding(make_tokens, kind):
    model = backbone_with([kind])
    tokens = timed(make_tokens([6, 4], 6, causal=True))
    x = torch.randn(2, 6, 8, dtype=torch.float64)
    with torch.no_grad():
        y = model(x, tokens)
        assert torch.isfinite(y).all()
        t = 2
        x2 = x.clone()
        x2[:, t + 1 :] = torch.randn_like(x2[:, t + 1 :])
        later = replace(tokens, timestamps=tokens.timestamps.clone())
        later.timestamps[:, t + 1 :] += 1000.0 * torch.arange(1, 4)
        torch.testing.assert_close(model(x2, later)[:, : t + 1], y[:, : t + 1])
        big = padded(tokens, 3)
        y_pad = model(torch.cat([x, 100 * torch.randn(2, 3, 8, dtype=torch.float64)], dim=1), big)
        torch.testing.assert_close(y_pad[:, :6][tokens.valid], y[tokens.valid])


def test_backbone_with_every_kind_trains(make_tokens):
    model = backbone_with(ALL_KINDS).train()
    tokens = timed(make_tokens([6, 4], 6, causal=True))
    model(torch.randn(2, 6, 8, dtype=torch.float64), tokens).pow(2).sum().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


# ---------------------------------------------------------------------------------------------
# ``rotates``: the declaration the backbone reads to hand a channel's rotation to the attention


class Swap(BiasChannel):
    """A third-party rotation written before ``rotates`` was declared: it only overrides ``rotate``
    (queries and keys trade places)."""

    def rotate(self, q: Tensor, k: Tensor, tokens: TokenContext) -> tuple[Tensor, Tensor]:
        return k, q


class DeclaredOff(Swap):
    rotates = False


def test_a_channel_overriding_rotate_is_declared_rotating_when_its_class_is_made():
    assert Swap.rotates and not DeclaredOff.rotates
    assert not BiasChannel.rotates and not AbsolutePosition.rotates and Rotary.rotates


@pytest.mark.parametrize("kind, rotated", [(Swap, True), (DeclaredOff, False)], ids=["undeclared", "off"])
def test_the_backbone_applies_exactly_the_declared_rotations(make_tokens, kind, rotated):
    seen = []

    class Recorder(SoftmaxAttention):
        def forward(self, x: Tensor, tokens: TokenContext, source: Tensor | None = None) -> Tensor:
            seen.append(len(tokens.rotations))
            return super().forward(x, tokens, source)

    model = backbone_with([])
    block = model.blocks[0]
    recorder = Recorder(Recorder.Options(heads=2), BuildContext(dim=8))
    recorder.load_state_dict(block.attention.state_dict())
    block.attention = recorder.double().eval()
    model.bias.append(kind(kind.Options(), BuildContext(dim=8)))
    model(torch.randn(2, 6, 8, dtype=torch.float64), make_tokens([6, 4], 6, causal=True))
    assert seen == [1 if rotated else 0]


# ---------------------------------------------------------------------------------------------
# The published behaviours as options (issue 20): request-time buckets, one table per layer,
# HSTU's position-table initialisation


def with_request_times(tokens: TokenContext) -> TokenContext:
    """Request times: each token's next token's time; the last real token's a later time of its
    own (the item it predicts); padding repeats it."""
    t = tokens.timestamps
    last = (tokens.valid.sum(1) - 1).clamp(min=0)
    target = t.gather(1, last[:, None]) + 3600.0
    nxt = torch.cat([t[:, 1:], t[:, -1:]], dim=1)
    position = torch.arange(t.shape[1])[None]
    return replace(tokens, request_times=torch.where(position >= last[:, None], target, nxt))


def test_rel_time_request_time_matches_reference(build, make_tokens):
    """``time_reference: request``: B[i, j] = w[bucket(τ_i − t_j)], τ_i the next token's time."""
    channel = randomised(build(RelativeTime, D, buckets=40, time_reference="request"))
    tokens = with_request_times(timed(make_tokens([5, 3], 5, causal=True)))
    t, tau = tokens.timestamps.double(), tokens.request_times.double()
    bias = channel.logits(tokens)
    for b in range(2):
        for i in range(5):
            for j in range(5):
                dt = abs(float(tau[b, i] - t[b, j]))
                k = min(max(math.floor(math.log(max(dt, 1.0)) / 0.301), 0), 40)
                torch.testing.assert_close(bias[b, 0, i, j], channel.table.weight[k])
    own = build(RelativeTime, D, buckets=40)
    own.load_state_dict(channel.state_dict())
    assert not torch.allclose(own.logits(tokens), bias)


def test_rel_time_request_time_needs_request_times(build, make_tokens):
    channel = build(RelativeTime, D, time_reference="request")
    with pytest.raises(ValueError, match="carry no request times"):
        channel.logits(timed(make_tokens([3], 3, causal=True)))
    with pytest.raises(ValueError, match="time_reference"):
        RelativeTime.Options(time_reference="next")


def test_only_per_layer_tables_are_one_per_block():
    for kind in ALL_KINDS:
        assert not kind.one_per_block(kind.Options())
    for kind in (RelativePosition, RelativeTime):
        assert kind.one_per_block(kind.Options(per_layer=True))


def per_layer_variant(per_layer: bool, blocks: int = 2) -> Variant:
    """HSTU's layout: pointwise attention, no FFN, pre-norm LayerNorm, absolute positions shared and
    relative position / time tables, per layer or shared."""

    def part(slot, kind, **options):
        cls = registry.get(slot, kind)
        return Part(slot, cls, cls.Options(**options))

    return Variant(
        name="hstu",
        spec=ModelSpec(dim=8, blocks=blocks, dropout=0.0),
        attention=part("attention", "pointwise", heads=2),
        ffn=part("ffn", "none"),
        norm=part("norm", "layernorm"),
        connection=part("connection", "residual", dropout=0.0),
        bias=(
            part("bias", "abs_pos"),
            part("bias", "rel_pos", per_layer=per_layer),
            part("bias", "rel_time", buckets=40, per_layer=per_layer),
        ),
    )


def test_per_layer_tables_give_each_block_its_own_bias(make_tokens):
    """``per_layer: true`` (HSTU): block l's attention sees P_l[pos_j − pos_i] + T_l[bucket(t_i − t_j)]
    from tables of its own; the shared channels (``abs_pos``) act once, on the embeddings."""
    torch.manual_seed(0)
    variant = per_layer_variant(per_layer=True)
    backbone = build_backbone(variant, BuildContext(dim=8, max_len=16)).double().eval()
    assert [type(c) for c in backbone.bias] == [AbsolutePosition]
    tables = [(block.bias[0].table.weight, block.bias[1].table.weight) for block in backbone.blocks]
    assert all(type(block.bias[0]) is RelativePosition for block in backbone.blocks)
    assert tables[0][0] is not tables[1][0] and tables[0][1] is not tables[1][1]
    for block in backbone.blocks:
        randomised(block.bias)
    shared = build_backbone(per_layer_variant(per_layer=False), BuildContext(dim=8, max_len=16))
    assert count_parameters(backbone) == count_parameters(shared) + (31 + 41)  # one more of each table
    ctx = BuildContext(dim=8, max_len=16)
    assert sizes.backbone_parameters(variant, ctx) == count_parameters(backbone)

    tokens = timed(make_tokens([6, 4], 6, causal=True))
    x = torch.randn(2, 6, 8, dtype=torch.float64)
    with torch.no_grad():
        y = backbone(x, tokens)
        # By hand: x + P_abs, then per block x ← x + attention(LN(x)) with the block's own bias.
        h = x + backbone.bias[0].table.weight[tokens.positions]
        t = tokens.timestamps.double()
        for block, (w_pos, w_time) in zip(backbone.blocks, tables, strict=True):
            bias = torch.zeros(2, 1, 6, 6, dtype=torch.float64)
            for b in range(2):
                for i in range(6):
                    for j in range(6):
                        k = min(
                            max(math.floor(math.log(max(abs(float(t[b, i] - t[b, j])), 1.0)) / 0.301), 0), 40
                        )
                        bias[b, 0, i, j] = w_pos[j - i + 15] + w_time[k]
            h = h + block.attention(block.mix.norm(h), replace(tokens, logit_bias=bias))
        torch.testing.assert_close(y[tokens.valid], backbone.final_norm(h)[tokens.valid])
        # The last-token path sees the same per-block biases.
        last = backbone(x, tokens, last_only=True)
        torch.testing.assert_close(last, y[torch.arange(2), tokens.valid.sum(1) - 1])


def test_truncated_normal_position_table():
    """``init: truncated_normal`` (the HSTU code base's SASRec): N(0, 1/d) cut at ±2σ, whose standard
    deviation is 0.880/√d; the default stays Xavier-normal, N(0, 2 / (L + d))."""
    torch.manual_seed(0)
    L, d = 4000, 64
    ctx = BuildContext(dim=d, max_len=L)
    table = AbsolutePosition(AbsolutePosition.Options(init="truncated_normal"), ctx).table.weight
    sigma = d**-0.5
    assert table.abs().max() <= 2 * sigma
    truncated_std = math.sqrt(1 - 4 * math.exp(-2) / math.sqrt(2 * math.pi) / (math.erf(2 / math.sqrt(2))))
    assert abs(table.std().item() / (truncated_std * sigma) - 1) < 0.01
    xavier = AbsolutePosition(AbsolutePosition.Options(), ctx).table.weight
    assert abs(xavier.std().item() / math.sqrt(2 / (L + d)) - 1) < 0.01

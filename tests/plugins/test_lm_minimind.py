"""The MiniMind block as published, in float64 against formulas written out here: RMSNorm
pre-norm, RoPE (and MiniMind's rotate-half form), grouped-query attention against an independent
repeat-kv, the SwiGLU hidden-size rule, and the MoE feed-forward's gate, normalised top-k
weights, shared experts and both auxiliary balance losses (MiniMind's ``seq_aux`` and batch form).

MiniMind's numbers were read from jingyaogong/minimind (``model/model_minimind.py`` at c090b69,
2026-01-15: hidden 512, 8 heads, 2 key/value heads, ``intermediate_size = 64·⌈⌊8d/3⌋/64⌉``,
RMSNorm eps 1e-5, rope θ 1e6, MoE 4 routed experts, top-2, 1 shared, α 0.01, seq_aux on)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from ablate.components import BuildContext, TokenContext
from ablate.model.blocks import Block, PreNorm
from ablate_plugins.attention import SoftmaxAttention
from ablate_plugins.bias import Rotary
from ablate_plugins.connection import Residual
from ablate_plugins.ffn import MoEFFN, SwiGLU, glu_hidden
from ablate_plugins.norm import RMSNorm

D, H, G = 16, 4, 2  # width, query heads, key/value heads
E_HEAD = D // H


def tokens_of(lengths: list[int], n: int, rope: Rotary | None) -> TokenContext:
    i = torch.arange(n)
    tokens = TokenContext(
        valid=i[None, :] < torch.tensor(lengths)[:, None], causal=True, positions=i.expand(len(lengths), n)
    )
    if rope is not None:
        tokens.rotations.append(rope.rotate)
    return tokens


def rms(x, w, eps):
    return w * x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)


def rope_pairs(x, theta):
    """Interleaved pairs (x_2i, x_2i+1) at position p turned by p·θ^(-2i/e) (complex form)."""
    n, e = x.shape[-2], x.shape[-1]
    angle = torch.arange(n, dtype=x.dtype)[:, None] * theta ** (-torch.arange(0, e, 2, dtype=x.dtype) / e)
    z = torch.view_as_complex(x.reshape(*x.shape[:-1], e // 2, 2).contiguous())
    return torch.view_as_real(z * torch.polar(torch.ones_like(angle), angle)).flatten(-2)


def rotate_half_form(x, theta):
    """MiniMind's ``apply_rotary_pos_emb``: x·cos + rotate_half(x)·sin with halves paired."""
    n, e = x.shape[-2], x.shape[-1]
    freqs = torch.arange(n, dtype=x.dtype)[:, None] * theta ** (-torch.arange(0, e, 2, dtype=x.dtype) / e)
    cos, sin = torch.cat([freqs.cos()] * 2, -1), torch.cat([freqs.sin()] * 2, -1)
    half = torch.cat([-x[..., e // 2 :], x[..., : e // 2]], -1)
    return x * cos + half * sin


def repeat_kv(x, n_rep):
    """``[b, n, g, e] → [b, n, g·n_rep, e]``, each key/value head repeated n_rep times in place."""
    b, n, g, e = x.shape
    return x[:, :, :, None, :].expand(b, n, g, n_rep, e).reshape(b, n, g * n_rep, e)


def reference_gqa(attention: SoftmaxAttention, x, theta, lengths):
    """Grouped-query causal attention written out (MiniMind's Attention, no cache, no dropout)."""
    b, n, _ = x.shape
    w = attention.qkv.weight
    wq, wk, wv = w[:D], w[D : D + G * E_HEAD], w[D + G * E_HEAD :]
    q = (x @ wq.T).view(b, n, H, E_HEAD).transpose(1, 2)
    k = (x @ wk.T).view(b, n, G, E_HEAD).transpose(1, 2)
    v = (x @ wv.T).view(b, n, G, E_HEAD)
    if theta is not None:
        q, k = rope_pairs(q, theta), rope_pairs(k, theta)
    k = repeat_kv(k.transpose(1, 2), H // G).transpose(1, 2)
    v = repeat_kv(v, H // G).transpose(1, 2)
    scores = q @ k.transpose(-1, -2) / math.sqrt(E_HEAD)
    allowed = torch.ones(n, n, dtype=torch.bool).tril()
    key_real = torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]
    allowed = allowed[None, None] & key_real[:, None, None, :]
    scores = scores.masked_fill(~allowed, float("-inf"))
    out = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, n, D)
    return out @ attention.out.weight.T


@pytest.mark.parametrize("theta", [None, 1e6])
def test_gqa_matches_an_independent_repeat_kv(build, theta):
    attention = build(SoftmaxAttention, D, heads=H, kv_heads=G, bias=False)
    assert attention.qkv.weight.shape == (D + 2 * G * E_HEAD, D)  # k, v project to g·e only
    rope = build(Rotary, D, base=theta) if theta else None
    lengths = [7, 4]
    x = torch.randn(2, 7, D, dtype=torch.float64)
    got = attention(x, tokens_of(lengths, 7, rope))
    want = reference_gqa(attention, x, theta, lengths)
    for row, length in enumerate(lengths):  # real queries only: padded ones are unused
        torch.testing.assert_close(got[row, :length], want[row, :length], rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match="kv_heads=3 must divide heads=4"):
        SoftmaxAttention.Options(heads=4, kv_heads=3)


def test_rope_is_minimind_rotate_half_up_to_a_fixed_feature_order(build):
    """Our rope turns pairs (2i, 2i+1); MiniMind's turns (i, i + e/2). With the features reordered
    (even ones first) the two agree, so q·k scores — all attention sees — are the same."""
    rope = build(Rotary, D, base=1e6)
    q, k = (
        torch.randn(2, 1, 6, E_HEAD, dtype=torch.float64),
        torch.randn(2, 1, 6, E_HEAD, dtype=torch.float64),
    )
    tokens = tokens_of([6, 6], 6, None)
    rq, rk = rope.rotate(q, k, tokens)
    torch.testing.assert_close(rq, rope_pairs(q, 1e6))
    order = torch.cat([torch.arange(0, E_HEAD, 2), torch.arange(1, E_HEAD, 2)])
    torch.testing.assert_close(rq[..., order], rotate_half_form(q[..., order], 1e6))
    torch.testing.assert_close(rq @ rk.transpose(-1, -2), rq[..., order] @ rk[..., order].transpose(-1, -2))


def test_minimind_block_prenorm_rmsnorm_gqa_rope_swiglu(build):
    """``h = x + Attn(RMSNorm(x)); out = h + SwiGLU(RMSNorm(h))`` (MiniMindBlock)."""
    eps, theta = 1e-5, 1e6
    ctx = BuildContext(dim=D)

    def norm():
        n = RMSNorm(RMSNorm.Options(eps=eps), ctx).double()
        n.weight.data.uniform_(0.5, 1.5)
        return n

    attention = build(SoftmaxAttention, D, heads=H, kv_heads=G, bias=False)
    ffn = build(SwiGLU, D, multiple_of=8)
    residual = Residual(Residual.Options(), ctx)
    block = Block(attention, ffn, PreNorm(norm(), residual), PreNorm(norm(), residual)).double().eval()
    rope = build(Rotary, D, base=theta)
    x = torch.randn(1, 5, D, dtype=torch.float64)
    got = block(x, tokens_of([5], 5, rope))

    h = x + reference_gqa(attention, rms(x, block.mix.norm.weight, eps), theta, [5])
    z = rms(h, block.feed.norm.weight, eps)
    swiglu = (F.silu(z @ ffn.gate.weight.T) * (z @ ffn.up.weight.T)) @ ffn.down.weight.T
    torch.testing.assert_close(got, h + swiglu, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("d", [8, 64, 96, 100, 128, 512, 768, 1000])
def test_swiglu_hidden_size_rule(build, d):
    """MiniMind's code: ``64·⌈⌊2/3·4d⌋ / 64⌉`` (floor, then round up to the multiple); with
    multiple_of 64 this is always ``64·⌈(2/3·4d)/64⌉`` (8d/3 has a third in it, never within 1
    above a multiple of 64)."""
    want = 64 * math.ceil(int(2 * 4 * d / 3) / 64)
    assert glu_hidden(d, 64) == want == 64 * math.ceil((2 / 3 * 4 * d) / 64)
    if d in (512, 768):
        assert want == {512: 1408, 768: 2048}[d]  # MiniMind-small / base
    assert build(SwiGLU, d).gate.weight.shape == (want, d)


def expert_out(expert, x):
    return (F.silu(x @ expert.gate.weight.T) * (x @ expert.up.weight.T)) @ expert.down.weight.T


@pytest.mark.parametrize("balance", ["batch", "sequence"])
def test_moe_gate_topk_shared_and_aux_losses(build, balance):
    E, k, alpha = 4, 2, 0.01
    moe = build(MoEFFN, D, experts=E, top_k=k, shared_experts=1, alpha=alpha, hidden=12, balance=balance)
    moe.train()  # the auxiliary loss is computed in training only (no dropout: rate 0)
    b, n = 3, 5
    x = torch.randn(b, n, D, dtype=torch.float64)
    lengths = [5, 3, 4]
    valid = torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]
    y = moe(x, valid)

    scores = (x @ moe.router.weight.T).softmax(-1)  # [b, n, E]
    want = torch.zeros_like(x)
    chosen = torch.zeros(b, n, k, dtype=torch.long)
    for r in range(b):
        for t in range(n):
            top = sorted(range(E), key=lambda e: -scores[r, t, e].item())[:k]
            chosen[r, t] = torch.tensor(top)
            weights = scores[r, t, top] / scores[r, t, top].sum()  # normalised top-k
            for weight, e in zip(weights, top, strict=True):
                want[r, t] += weight * expert_out(moe.experts[e], x[r, t])
            want[r, t] += expert_out(moe.shared[0], x[r, t])
    torch.testing.assert_close(y, want, rtol=1e-10, atol=1e-12)

    if balance == "batch":  # MiniMind, seq_aux off: fi = E · one_hot(topk).mean, Pi = scores.mean
        real_scores, real_chosen = scores[valid], chosen[valid]
        ce = F.one_hot(real_chosen.flatten(), E).double().mean(0)
        aux = alpha * (real_scores.mean(0) * ce * E).sum()
    else:  # MiniMind's seq_aux: per sequence ce = counts / (len·k / E), times its mean scores
        per_row = []
        for r, length in enumerate(lengths):
            counts = torch.zeros(E, dtype=torch.float64)
            for e in chosen[r, :length].flatten():
                counts[e] += 1
            ce = counts / (length * k / E)
            per_row.append((ce * scores[r, :length].mean(0)).sum())
        aux = alpha * torch.stack(per_row).mean()
    torch.testing.assert_close(moe.auxiliary_loss(), aux, rtol=1e-10, atol=1e-14)
    moe.auxiliary_loss().backward()
    assert moe.router.weight.grad.abs().sum() > 0  # the balance loss trains the router


def test_sequence_balance_refuses_jagged_tokens(build):
    moe = build(MoEFFN, D, experts=4, top_k=2, balance="sequence").train()
    with pytest.raises(ValueError, match="set the task's jagged: false, or balance: batch"):
        moe(torch.randn(7, D, dtype=torch.float64), torch.ones(7, dtype=torch.bool))


def test_minimind_ffn_lm_study_matches_active_ffn_sizes():
    """studies/minimind_ffn_lm.yaml: every FFN kind at the SwiGLU's 3·128·384 weights per block
    within 1%, the MoE counted by its active experts (top-2 routed + 1 shared) and router."""
    from pathlib import Path

    from ablate.model.build import build_backbone
    from ablate.study.load import load_study

    study = load_study(Path(__file__).resolve().parents[2] / "studies" / "minimind_ffn_lm.yaml")
    sizes = {}
    for name, variant in study.variants.items():
        ffn = build_backbone(variant, study.build_context(variant, 256)).blocks[0].ffn
        if isinstance(ffn, MoEFFN):
            one = sum(p.numel() for p in ffn.experts[0].parameters())
            active = ffn.router.weight.numel() + one * (ffn.top_k + len(ffn.shared))
            assert sum(p.numel() for p in ffn.parameters()) == active + one * (len(ffn.experts) - ffn.top_k)
            sizes[name] = active
        else:
            sizes[name] = sum(p.numel() for p in ffn.parameters())
    assert set(sizes) == {"base", "geglu", "reglu", "relu-mlp", "moe"}
    assert sizes["base"] == 3 * 128 * 384
    for name, size in sizes.items():
        assert abs(size - sizes["base"]) <= 0.01 * sizes["base"], (name, size)

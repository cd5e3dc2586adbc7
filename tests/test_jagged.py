"""Jagged layouts: fbgemm and pure-torch conversions agree, and a backbone run on jagged
values gives the padded path's outputs and gradients."""

from __future__ import annotations

import pytest
import torch

from ablate import jagged as J
from ablate.components import TokenContext
from ablate.model.build import build_backbone
from ablate.study.load import load_study

LENGTHS = torch.tensor([3, 0, 5, 1])


def test_fbgemm_is_importable_in_this_environment():
    # The test extra installs fbgemm-gpu-cpu: its path must be the one exercised below.
    assert J.HAVE_FBGEMM


def test_offsets_and_round_trip_by_hand():
    offsets = J.complete_cumsum(LENGTHS, use_fbgemm=False)
    assert offsets.tolist() == [0, 3, 3, 8, 9]
    values = torch.arange(9.0)[:, None].expand(9, 2).clone()
    dense = J.to_padded(values, offsets, 5, use_fbgemm=False)
    assert dense[:, :, 0].tolist() == [[0, 1, 2, 0, 0], [0, 0, 0, 0, 0], [3, 4, 5, 6, 7], [8, 0, 0, 0, 0]]
    assert J.to_values(dense, offsets, use_fbgemm=False).equal(values)


@pytest.mark.parametrize("shape", [(2,), (3, 2)])
def test_fbgemm_and_torch_conversions_agree_with_gradients(shape):
    offsets = J.complete_cumsum(LENGTHS, use_fbgemm=False)
    assert J.complete_cumsum(LENGTHS, use_fbgemm=True).tolist() == offsets.tolist()
    torch.manual_seed(0)
    values = torch.randn(9, *shape)
    weights = torch.randn(4, 6, *shape)
    results = {}
    for use in (True, False):
        v = values.clone().requires_grad_(True)
        dense = J.to_padded(v, offsets, 6, use_fbgemm=use)
        back = J.to_values(dense * 2, offsets, use_fbgemm=use)
        ((dense * weights).sum() + back.pow(2).sum()).backward()
        results[use] = (dense.detach(), back.detach(), v.grad)
    for a, b in zip(results[True], results[False], strict=False):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize(
    "patch",
    [
        {},
        {"norm": {"kind": "rmsnorm", "placement": "post"}, "ffn": {"kind": "swiglu"}},
        {"connection": {"kind": "hyper", "streams": 2}},
        {
            "attention": {"kind": "pointwise", "heads": 2},
            "ffn": {"kind": "none"},
            "bias": [{"kind": "rel_pos"}],
        },
        {"ffn": {"kind": "moe", "experts": 3, "top_k": 2}},
        {"norm": {"kind": "layernorm", "placement": "pre_skip_kv"}},
    ],
)
@pytest.mark.parametrize("use_fbgemm", [True, False])
def test_jagged_backbone_matches_padded_outputs_and_gradients(write_study, patch, use_fbgemm):
    study = load_study(write_study({"model": {"dropout": 0.0, **patch}}))
    variant = study.variants["base"]
    ctx = study.build_context(variant, 12)
    torch.manual_seed(0)
    backbone = build_backbone(variant, ctx)
    b, n, d = 5, 12, ctx.dim
    lengths = torch.tensor([12, 3, 7, 1, 9])
    valid = torch.arange(n)[None, :] < lengths[:, None]
    x = torch.randn(b, n, d)
    weight = torch.randn(b, n, d)
    runs = []
    for layout in (J.Padded(), J.Jagged.from_valid(valid, use_fbgemm)):
        backbone.zero_grad()
        xin = x.clone().requires_grad_(True)
        tokens = TokenContext(valid=valid, causal=True, positions=torch.arange(n).expand(b, n), layout=layout)
        out = backbone(xin, tokens)
        # Only real positions are compared and trained on (padded outputs are never used).
        loss = (out[valid] * weight[valid]).sum()
        aux = backbone.auxiliary_loss()
        loss.backward()
        runs.append(
            (
                out[valid].detach(),
                xin.grad[valid],
                {k: p.grad.clone() for k, p in backbone.named_parameters() if p.grad is not None},
                aux,
            )
        )
    (out_p, gx_p, g_p, aux_p), (out_j, gx_j, g_j, aux_j) = runs
    torch.testing.assert_close(out_j, out_p, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gx_j, gx_p, rtol=1e-4, atol=1e-5)
    assert g_j.keys() == g_p.keys() and g_p
    for k in g_p:
        torch.testing.assert_close(g_j[k], g_p[k], rtol=1e-4, atol=1e-4, msg=k)
    if aux_p is not None:  # MoE balance statistics count the same real tokens
        torch.testing.assert_close(aux_j, aux_p)


@pytest.mark.parametrize(
    "patch",
    [
        {},
        {
            "bias": [{"kind": "abs_pos", "align": "end"}, {"kind": "rel_pos"}],
            "attention": {"kind": "softmax", "heads": 2},
        },
        {"bias": [{"kind": "rope"}], "norm": {"kind": "layernorm", "placement": "pre_skip"}},
        {"norm": {"kind": "layernorm", "placement": "pre_skip_kv"}},
        {"bias": [{"kind": "rope"}], "norm": {"kind": "layernorm", "placement": "pre_skip_kv"}},
        {"norm": {"kind": "rmsnorm", "placement": "post"}, "connection": {"kind": "hyper", "streams": 2}},
        {
            "attention": {"kind": "pointwise", "heads": 2},
            "ffn": {"kind": "none"},
            "bias": [{"kind": "rel_pos"}],
        },
        {"attention": {"kind": "ams", "heads": 1}, "ffn": {"kind": "mffn"}, "bias": []},
        {"blocks": 1, "ffn": {"kind": "moe", "experts": 3, "top_k": 2}},
    ],
)
@pytest.mark.parametrize("layout", ["padded", "jagged"])
def test_last_only_forward_is_the_full_forward_at_the_last_token(write_study, patch, layout):
    """Ranking runs the final block for each row's last token only: same numbers as the full
    forward there, whatever the attention kind (fast path or the general fallback)."""
    study = load_study(write_study({"model": {"dropout": 0.0, **patch}}))
    variant = study.variants["base"]
    ctx = study.build_context(variant, 12)
    torch.manual_seed(0)
    backbone = build_backbone(variant, ctx).eval()
    b, n = 5, 12
    lengths = torch.tensor([12, 3, 7, 1, 9])
    valid = torch.arange(n)[None, :] < lengths[:, None]
    x = torch.randn(b, n, ctx.dim)

    def tokens() -> TokenContext:
        chosen = J.Padded() if layout == "padded" else J.Jagged.from_valid(valid)
        return TokenContext(
            valid=valid, causal=True, positions=torch.arange(n).expand(b, n), layout=chosen, timestamps=times
        )

    times = torch.rand(b, n).mul(1e5).cumsum(1)
    with torch.no_grad():
        full = backbone(x, tokens())
        last = backbone(x, tokens(), last_only=True)
    assert last.shape == (b, ctx.dim)
    torch.testing.assert_close(last, full[torch.arange(b), lengths - 1], rtol=1e-5, atol=1e-5)

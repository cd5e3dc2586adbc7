"""TiSASRec as published (Li, Wang & McAuley, WSDM 2020): the ``time_interval`` kind's
``positions``, ``output_projection: false``, ``table_dropout`` and ``share_tables`` with
``placement: pre_skip_kv`` against the paper's equations, written out here in float64 loops
(the authors' model.py: absolute positions and interval tables added, unprojected, to each head's
keys and values; one set of tables and one dropout draw for every block; no output projection;
``Q = LN(x)``, ``K = V = x``, the residual adds ``LN(x)``).

Dimensions: ``b`` rows, ``n`` tokens, ``d`` width, ``h`` heads, ``e = d / h``, ``L`` max_len.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from torch import Tensor

from ablate import registry, testkit
from ablate.components import BuildContext, TokenContext
from ablate.model.build import build_backbone
from ablate.model.spec import ModelSpec, NormSpec
from ablate.model.variant import Part, Variant
from ablate.study.sizes import backbone_parameters
from ablate_plugins.attention import TimeIntervalAttention

D, H, L, K = 8, 2, 9, 6
PUBLISHED = {"positions": True, "output_projection": False, "share_tables": True, "table_dropout": None}


def part(slot: str, kind: str, **options) -> Part:
    cls = registry.get(slot, kind)
    return Part(slot, cls, cls.Options(**options))


def tisasrec(blocks: int = 2, dropout: float = 0.0, **attention) -> Variant:
    """TiSASRec's block: pre_skip_kv LayerNorm (eps 1e-8), SASRec's point-wise FFN, no input positions."""
    return Variant(
        name="tisasrec",
        spec=ModelSpec(
            dim=D, blocks=blocks, dropout=dropout, norm=NormSpec(kind="layernorm", placement="pre_skip_kv")
        ),
        attention=part("attention", "time_interval", heads=H, max_interval=K, **attention),
        ffn=part("ffn", "pointwise"),
        norm=part("norm", "layernorm", eps=1e-8),
        connection=part("connection", "residual", dropout=0.0),
        bias=(),
    )


def tokens_with_times(lengths: list[int], n: int) -> TokenContext:
    """Right-padded rows whose two first items are 10 s apart and later gaps larger, so the
    smallest gap a query can see is the user's smallest over the whole history (TiSASRec's unit),
    for every query that sees two items."""
    i = torch.arange(n)
    valid = i[None, :] < torch.tensor(lengths)[:, None]
    gaps = torch.tensor(
        [[0.0, 10.0, 25.0, 40.0, 95.0, 7.0e3, 11.0, 333.0], [0.0, 10.0, 12.0, 31.0, 20.0, 50.0, 600.0, 900.0]]
    )
    times = gaps[:, :n].cumsum(-1).double()
    # Row 1's gap of 12 s makes its unit 10 s as well; its padded tail repeats the last real time.
    times = torch.where(valid, times, times.gather(1, (torch.tensor(lengths) - 1)[:, None]))
    return TokenContext(
        valid=valid, causal=True, positions=i.expand(len(lengths), n).clone(), timestamps=times
    )


def layer_norm(x: Tensor, norm) -> Tensor:
    norm = norm.norm  # the layernorm kind's nn.LayerNorm
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return norm.weight * (x - mean) / (var + 1e-8) ** 0.5 + norm.bias


def floored_gaps(t: list[float], unit: float) -> list[list[int]]:
    """The paper's ``min(⌊|t_i − t_j| / u⌋, k)``."""
    return [[min(math.floor(abs(a - c) / unit), K) for c in t] for a in t]


def rounded_times(t: list[float], unit: float) -> list[list[int]]:
    """The authors' util.py: each time mapped to ``int(round((t − t_min) / u) + 1)`` (Python's round),
    then ``computeRePos``: ``|a_i − a_j|``, clipped at ``k``."""
    a = [int(round((x - min(t)) / unit) + 1) for x in t]
    return [[min(abs(p - q), K) for q in a] for p in a]


def published_forward(x: Tensor, tokens: TokenContext, backbone, rule=floored_gaps) -> Tensor:
    """TiSASRec's ``log2feats`` at evaluation, one row and one query at a time, on ``backbone``'s
    weights: its windows are left-padded to ``L``, so real item ``i`` of a row of ``m`` sits at
    position ``L − m + i``; intervals by ``rule`` with ``u`` the row's smallest non-zero gap."""
    attention = backbone.blocks[0].attention
    tk, tv, pk, pv = attention.interval_k, attention.interval_v, attention.position_k, attention.position_v
    out = torch.zeros_like(x)
    for row in range(x.shape[0]):
        m = int(tokens.valid[row].sum())
        t = tokens.timestamps[row, :m].tolist()
        unit = min(abs(a - c) for a in t for c in t if a != c)
        r = rule(t, unit)
        pos = [L - m + j for j in range(m)]
        seq = x[row, :m]
        for block in backbone.blocks:
            a = block.attention
            w, bias = a.qkv.weight, a.qkv.bias
            queries = layer_norm(seq, block.mix.norm)
            q = queries @ w[:D].T + bias[:D]
            k = seq @ w[D : 2 * D].T + bias[D : 2 * D]
            v = seq @ w[2 * D :].T + bias[2 * D :]
            heads = []
            for head in range(H):
                s = slice(head * D // H, (head + 1) * D // H)
                z = torch.zeros(m, D // H, dtype=x.dtype)
                for i in range(m):
                    logits = torch.stack(
                        [q[i, s] @ (k[j, s] + tk[r[i][j], s] + pk[pos[j], s]) for j in range(i + 1)]
                    ) / math.sqrt(D // H)
                    p = torch.softmax(logits, 0)
                    z[i] = sum(p[j] * (v[j, s] + tv[r[i][j], s] + pv[pos[j], s]) for j in range(i + 1))
                heads.append(z)
            seq = queries + torch.cat(heads, -1)  # no output projection
            normed = layer_norm(seq, block.feed.norm)
            ffn = block.ffn
            seq = normed + torch.relu(normed @ ffn.w1.weight.T + ffn.w1.bias) @ ffn.w2.weight.T + ffn.w2.bias
        out[row, :m] = layer_norm(seq, backbone.final_norm)
    return out


def randomised(module) -> None:
    """Every parameter drawn afresh (LayerNorm's 1 / 0 and zero biases would hide a mix-up)."""
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p) * 0.5)


def test_published_form_matches_the_papers_equations_in_float64():
    torch.manual_seed(0)
    backbone = build_backbone(tisasrec(**PUBLISHED), BuildContext(dim=D, max_len=L)).double().eval()
    randomised(backbone)
    tokens = tokens_with_times([7, 4], 7)
    x = torch.randn(2, 7, D, dtype=torch.float64)
    with torch.no_grad():
        ours = backbone(x, tokens)
        last = backbone(x, tokens, last_only=True)
    expected = published_forward(x, tokens, backbone)
    torch.testing.assert_close(ours[tokens.valid], expected[tokens.valid], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(last, expected[[0, 1], [6, 3]], rtol=1e-12, atol=1e-12)
    # Each option is needed for that match: without the positions, or with W_o, it differs.
    for changed in ({"positions": False}, {"output_projection": True}):
        torch.manual_seed(0)
        other = build_backbone(tisasrec(**{**PUBLISHED, **changed}), BuildContext(dim=D, max_len=L))
        other = other.double().eval()
        other.load_state_dict(backbone.state_dict(), strict=False)
        with torch.no_grad():
            assert not torch.allclose(other(x, tokens)[tokens.valid], expected[tokens.valid])


def test_authors_rounded_times_match_their_code_in_float64():
    """``interval_index: difference_of_rounded_times`` gives util.py's intervals: row 0's times 10,
    35, 75 s in units of 10 s round to 1, 4, 8 (3.5 and 7.5 half to even), so 35 − 10 s is 3 units
    there and ⌊2.5⌋ = 2 in the paper's rule; the two rules' outputs differ."""
    tokens = tokens_with_times([7, 4], 7)
    t = tokens.timestamps[0, :7].tolist()
    assert rounded_times(t, 10.0)[2][1] == 3 and floored_gaps(t, 10.0)[2][1] == 2
    torch.manual_seed(0)
    variant = tisasrec(**PUBLISHED, interval_index="difference_of_rounded_times")
    backbone = build_backbone(variant, BuildContext(dim=D, max_len=L)).double().eval()
    randomised(backbone)
    attention = backbone.blocks[0].attention
    r = attention.intervals(tokens)
    for row, m in enumerate([7, 4]):
        times = tokens.timestamps[row, :m].tolist()
        causal = [[rounded_times(times, 10.0)[i][j] for j in range(i + 1)] for i in range(m)]
        assert [r[row, i, : i + 1].tolist() for i in range(m)] == causal
    x = torch.randn(2, 7, D, dtype=torch.float64)
    with torch.no_grad():
        ours = backbone(x, tokens)
    expected = published_forward(x, tokens, backbone, rounded_times)
    torch.testing.assert_close(ours[tokens.valid], expected[tokens.valid], rtol=1e-12, atol=1e-12)
    paper = published_forward(x, tokens, backbone)
    assert not torch.allclose(paper[tokens.valid], expected[tokens.valid])


def test_shared_tables_are_one_set_counted_once():
    torch.manual_seed(0)
    shared = build_backbone(tisasrec(**PUBLISHED), BuildContext(dim=D, max_len=L))
    own = build_backbone(tisasrec(**{**PUBLISHED, "share_tables": False}), BuildContext(dim=D, max_len=L))
    first, second = (block.attention for block in shared.blocks)
    for name in ("interval_k", "interval_v", "position_k", "position_v"):
        assert getattr(first, name) is getattr(second, name)
        assert getattr(own.blocks[0].attention, name) is not getattr(own.blocks[1].attention, name)
    tables = 2 * (K + 1) * D + 2 * L * D
    count = sum(p.numel() for p in shared.parameters())
    assert sum(p.numel() for p in own.parameters()) == count + tables
    # The size estimate (built on the meta device) counts them once too, at any depth.
    for blocks in (1, 2, 5):
        ctx = BuildContext(dim=D, max_len=L)
        built = build_backbone(tisasrec(blocks, **PUBLISHED), ctx)
        assert backbone_parameters(tisasrec(blocks, **PUBLISHED), ctx) == sum(
            p.numel() for p in built.parameters()
        )
    # No output projection: W_o's d² + d are gone.
    default = build_backbone(
        tisasrec(**{**PUBLISHED, "output_projection": True}), BuildContext(dim=D, max_len=L)
    )
    assert sum(p.numel() for p in default.parameters()) == count + 2 * (D * D + D)


def test_table_dropout_draws_per_pair_once_per_forward():
    """In training, E^K_{r_ij} is dropped per (i, j) pair (not per table row), and shared tables
    give every block the same draw within one forward, a new one at the next."""
    torch.manual_seed(0)
    backbone = build_backbone(tisasrec(dropout=0.5, **PUBLISHED), BuildContext(dim=D, max_len=L, dropout=0.5))
    backbone = backbone.double().train()
    tokens = tokens_with_times([7, 4], 7)
    seen: list[dict[str, Tensor]] = []
    for block in backbone.blocks:
        looked_up = block.attention.looked_up
        block.attention.looked_up = lambda t, f=looked_up: seen.append(f(t)) or seen[-1]
    backbone(torch.randn(2, 7, D, dtype=torch.float64), tokens)
    first, second = seen
    assert first is second  # one lookup, one draw, for both blocks
    ek = first["interval_k"]  # [b, n, n, h, e]
    r = backbone.blocks[0].attention.intervals(tokens)
    dropped = ek == 0
    assert 0.3 < dropped.double().mean() < 0.7
    # Two pairs with the same interval index got different masks: the draw is per pair.
    assert r[0, 3, 3] == r[0, 4, 4] == 0 and not torch.equal(dropped[0, 3, 3], dropped[0, 4, 4])
    backbone(torch.randn(2, 7, D, dtype=torch.float64), tokens)
    assert not torch.equal(seen[2]["interval_k"], ek)  # the next forward draws again
    # Model dropout by default (table_dropout: None), none at evaluation.
    assert backbone.blocks[0].attention.table_dropout.p == 0.5
    backbone.eval()
    assert "interval_k" not in backbone.blocks[0].attention.looked_up(tokens)


def test_defaults_train_as_before_and_keep_their_fingerprint():
    """At their defaults the new options leave the kind's settings (and so every stored trial's
    fingerprint) as they were, and the fast gather path (no [b, n, n, d] tables) runs."""
    from ablate.drive.ledger import _settings

    options = TimeIntervalAttention.Options(heads=2)
    assert set(_settings(options)) == {"heads", "max_interval", "dropout", "bias", "init"}
    assert set(_settings(TimeIntervalAttention.Options(**PUBLISHED))) >= set(PUBLISHED)
    attention = TimeIntervalAttention(options, BuildContext(dim=D, max_len=L)).double().train()
    assert attention.looked_up(tokens_with_times([7, 4], 7)) == {}
    assert not hasattr(attention, "position_k") and attention.out is not None


@pytest.mark.parametrize("check", testkit.CHECKS)
def test_published_form_passes_the_component_kit(check):
    testkit.check(TimeIntervalAttention, check, {**PUBLISHED, "table_dropout": 0.3, "heads": 2})


def test_init_option_is_applied_and_positions_beyond_the_table_are_refused():
    """``init: kaiming`` zeroes the projections' biases (it was accepted and ignored before), and a
    row longer than ``max_len`` stops with the kind's name rather than indexing past the table."""
    ctx = BuildContext(dim=D, max_len=L)
    attention = TimeIntervalAttention(TimeIntervalAttention.Options(heads=H, init="kaiming"), ctx)
    assert not attention.qkv.bias.any() and not attention.out.bias.any()
    assert TimeIntervalAttention(TimeIntervalAttention.Options(heads=H), ctx).qkv.bias.any()
    published = TimeIntervalAttention(TimeIntervalAttention.Options(heads=H, **PUBLISHED), ctx).double()
    long = tokens_with_times([8, 8], 8)
    n = L + 3
    tokens = TokenContext(
        valid=torch.ones(2, n, dtype=torch.bool),
        causal=True,
        positions=torch.arange(n).expand(2, n).clone(),
        timestamps=torch.cat([long.timestamps, long.timestamps[:, -1:] + torch.arange(1, 4)], 1),
    )
    refused = r"time_interval: token positions span -3\.\.8 but the position table"
    with pytest.raises(ValueError, match=refused):
        published(torch.randn(2, n, D, dtype=torch.float64), tokens)


def test_per_block_tables_and_w_o_compute_the_published_form_with_weights_copied():
    """What the NOTE's deviation rows say of this study's defaults: per-block tables holding the
    same values as the shared ones, and ``W_o = I`` with zero bias, give the published outputs."""
    torch.manual_seed(0)
    shared = build_backbone(tisasrec(**PUBLISHED), BuildContext(dim=D, max_len=L)).double().eval()
    randomised(shared)
    own = build_backbone(tisasrec(**{**PUBLISHED, "share_tables": False}), BuildContext(dim=D, max_len=L))
    with_w_o = build_backbone(
        tisasrec(**{**PUBLISHED, "output_projection": True}), BuildContext(dim=D, max_len=L)
    )
    own, with_w_o = own.double().eval(), with_w_o.double().eval()
    own.load_state_dict(shared.state_dict())  # the shared tables under both blocks' names
    assert with_w_o.load_state_dict(shared.state_dict(), strict=False).missing_keys == [
        f"blocks.{i}.attention.out.{p}" for i in (0, 1) for p in ("weight", "bias")
    ]
    with torch.no_grad():
        for block in with_w_o.blocks:
            block.attention.out.weight.copy_(torch.eye(D))
            block.attention.out.bias.zero_()
    tokens = tokens_with_times([7, 4], 7)
    x = torch.randn(2, 7, D, dtype=torch.float64)
    with torch.no_grad():
        expected = shared(x, tokens)[tokens.valid]
        torch.testing.assert_close(own(x, tokens)[tokens.valid], expected, rtol=0, atol=0)
        torch.testing.assert_close(with_w_o(x, tokens)[tokens.valid], expected, rtol=1e-14, atol=1e-14)


def test_authors_initialisation_is_xavier_uniform_with_zero_biases():
    """``init: xavier_uniform`` (TensorFlow's defaults, TiSASRec's code): every projection and
    table of the blocks inside Xavier-uniform's bound, not beyond it as Xavier-normal's tails go,
    every linear bias zero, the norms' ones and zeros kept."""
    variant = tisasrec(**PUBLISHED)
    torch.manual_seed(0)
    backbone = build_backbone(
        dataclasses.replace(variant, spec=variant.spec.model_copy(update={"init": "xavier_uniform"})),
        BuildContext(dim=D, max_len=L),
    )
    attention = backbone.blocks[0].attention
    for weight in (
        attention.qkv.weight,
        attention.interval_k,
        attention.position_v,
        backbone.blocks[1].ffn.w1.weight,
    ):
        bound = math.sqrt(6 / sum(weight.shape))
        assert weight.abs().max() <= bound and weight.abs().max() > 0.8 * bound
    assert not attention.qkv.bias.any() and not backbone.blocks[0].ffn.w2.bias.any()
    assert torch.equal(backbone.blocks[0].mix.norm.norm.weight, torch.ones(D))
    torch.manual_seed(0)
    normal = build_backbone(variant, BuildContext(dim=D, max_len=L))
    assert normal.blocks[0].attention.qkv.bias.any()  # the kind's own U(±1/√d) biases otherwise

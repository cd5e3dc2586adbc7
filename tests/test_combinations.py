"""Every registered kind composes with every other.

For two kinds of token data — ordered sequences (causal, with timestamps) and unordered
token sets (channels / features, with raw per-token values and a readout token) — every
(attention × ffn × norm × connection × bias) combination is either

* compatible: it builds through the real builder and takes one optimizer step with a
  finite loss that changes the parameters; or
* incompatible: the same check the study validator uses names both parts, and a study
  file with it fails validation with that message — never a crash mid-training.

Every combination is checked for compatibility; of the compatible ones, a set covering every
pair of values (two slots' kinds, or a kind and the norm placement) that occurs together in any
compatible combination is trained: a failure that needs two parts to meet shows up there, and
training all of them (thousands per kind of data) checks no further interaction.

Kinds come from the registry, so a new plugin is covered without touching this file.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time

import pytest
import torch
from torch import nn

from ablate import registry
from ablate.components import BuildContext, TokenContext
from ablate.model.build import build_backbone
from ablate.model.spec import ModelSpec
from ablate.model.variant import Part, Variant
from ablate.study.resolve import incompatibility

B, N, D, W = 2, 5, 8, 6  # batch, tokens, width, raw values per token

DATA = {
    # name: (ordered, features)
    "sequence": (True, frozenset({"timestamps"})),
    "token-set": (False, frozenset({"values", "readout"})),
}


def _part(slot: str, kind: str, **options) -> Part:
    cls = registry.get(slot, kind)
    return Part(slot, cls, cls.Options(**options))


def _options_for(slot: str, kind: str) -> dict:
    """Small but valid options where a kind's defaults would not fit D=8 tokens."""
    cls = registry.get(slot, kind)
    fields = cls.Options.model_fields
    small = {"heads": 2, "streams": 2, "experts": 3, "top_k": 2, "hidden": 8, "buckets": 16}
    return {k: v for k, v in small.items() if k in fields}


def _tokens(ordered: bool, generator: torch.Generator) -> TokenContext:
    lengths = torch.tensor([N, N - 2])
    valid = torch.arange(N)[None, :] < lengths[:, None]
    positions = torch.arange(N).expand(B, N)
    times = torch.cumsum(torch.rand(B, N, generator=generator) * 1e5, dim=1)
    times = times - times[:, :1]
    readout = torch.zeros(B, N, dtype=torch.bool)
    readout[:, 0] = True
    return TokenContext(
        valid=valid,
        causal=ordered,
        positions=positions,
        timestamps=times if ordered else None,
        values=None if ordered else torch.randn(B, N, W, generator=generator),
        readout=None if ordered else readout,
    )


PLACEMENTS = ("pre", "post", "pre_skip")


def _combinations():
    """Every (attention, ffn, norm, placement, connection, bias set)."""
    bias_sets = [()] + [(k,) for k in registry.kinds("bias")]
    return itertools.product(
        registry.kinds("attention"),
        registry.kinds("ffn"),
        registry.kinds("norm"),
        PLACEMENTS,
        registry.kinds("connection"),
        bias_sets,
    )


def _pairs(combination: tuple) -> set[tuple]:
    """The (position, value, position, value) pairs a combination holds."""
    return {(i, a, j, b) for (i, a), (j, b) in itertools.combinations(enumerate(combination), 2)}


def all_pairs(combinations: list[tuple]) -> list[tuple]:
    """A subset of ``combinations`` that holds every pair of values any of them holds: greedy,
    each step taking the combination that covers most pairs not yet covered (a few dozen, not
    thousands). Deterministic: ties go to the first in the given order."""
    held = [_pairs(c) for c in combinations]
    uncovered = set().union(*held)
    chosen = []
    while uncovered:
        best = max(range(len(combinations)), key=lambda k: len(held[k] & uncovered))
        chosen.append(combinations[best])
        uncovered -= held[best]
    return chosen


def test_all_pairs_covers_every_pair_and_is_small():
    combos = list(itertools.product("abc", "xyz", "01", "pqrs"))
    subset = [c for c in combos if c[:2] != ("a", "x")]  # as the compatible ones are a subset
    for given in (combos, subset):
        chosen = all_pairs(given)
        assert set().union(*map(_pairs, chosen)) == set().union(*map(_pairs, given))
        assert set(chosen) <= set(given) and len(chosen) <= 16  # 4 × 3 is the least possible
    assert ("a", "x") not in {c[:2] for c in all_pairs(subset)}


def _variant(attention, ffn, norm, connection, bias, placement) -> Variant:
    spec = ModelSpec(dim=D, blocks=1, dropout=0.0, norm={"kind": norm, "placement": placement})
    return Variant(
        name="combo",
        spec=spec,
        attention=_part("attention", attention, **_options_for("attention", attention)),
        ffn=_part("ffn", ffn, **_options_for("ffn", ffn)),
        norm=_part("norm", norm),
        connection=_part("connection", connection, **_options_for("connection", connection)),
        bias=tuple(_part("bias", b, **_options_for("bias", b)) for b in bias),
    )


def _problem(variant: Variant, data: str) -> str | None:
    ordered, features = DATA[data]
    parts = [part for slot in registry.COMPONENT_SLOTS for part in variant.parts(slot)]
    return next((p for p in (incompatibility(part, data, features, ordered) for part in parts) if p), None)


@pytest.mark.parametrize("data", list(DATA))
def test_every_compatible_combination_trains_one_step(data):
    ordered, features = DATA[data]
    generator = torch.Generator().manual_seed(0)
    start = time.perf_counter()
    compatible, refused = [], 0
    for combination in _combinations():
        attention, ffn, norm, placement, connection, bias = combination
        problem = _problem(_variant(attention, ffn, norm, connection, bias, placement), data)
        label = f"{data}: {attention} × {ffn} × {norm}({placement}) × {connection} × {bias or 'no bias'}"
        if problem:
            refused += 1
            assert "kind '" in problem and data in problem, label
        else:
            compatible.append(combination)
    trained = all_pairs(compatible)
    assert set().union(*map(_pairs, trained)) == set().union(*map(_pairs, compatible))  # every pair
    for i, (attention, ffn, norm, placement, connection, bias) in enumerate(trained):
        variant = _variant(attention, ffn, norm, connection, bias, placement)
        label = f"{data}: {attention} × {ffn} × {norm}({placement}) × {connection} × {bias or 'no bias'}"
        torch.manual_seed(i)
        ctx = BuildContext(dim=D, dropout=0.0, max_len=N, ordered=ordered, features=features, values_width=W)
        backbone = build_backbone(variant, ctx)
        embed = nn.Linear(W, D)
        params = list(backbone.parameters()) + list(embed.parameters())
        before = [p.detach().clone() for p in params]
        optimizer = torch.optim.SGD(params, lr=0.1)
        tokens = _tokens(ordered, generator)
        x = embed(torch.randn(B, N, W, generator=generator))
        out = backbone(x, tokens)
        assert out.shape == (B, N, D), label
        loss = (out[tokens.valid] ** 2).mean()
        auxiliary = backbone.auxiliary_loss()
        if auxiliary is not None:
            loss = loss + auxiliary
        assert torch.isfinite(loss), label
        loss.backward()
        optimizer.step()
        assert all(torch.isfinite(p).all() for p in params), label
        assert any(not torch.equal(p, q) for p, q in zip(params, before, strict=True)), label
    assert trained and refused > 0
    # Keep CI honest about what this costs.
    print(
        f"{data}: {len(trained)} of {len(compatible)} compatible combinations trained (every pair), "
        f"{refused} refused, {time.perf_counter() - start:.1f} s"
    )


def test_incompatible_combination_fails_study_validation(write_study, cli):
    """The validator refuses with both parts named: the kind and the task / data."""
    code, _, err = cli(
        "validate",
        write_study(
            {"task": {"data": {"timestamps": False}}, "variants": {"t": {"bias": [{"kind": "rel_time"}]}}}
        ),
    )
    assert code == 2 and "variants.t.bias.0.kind" in err and "rel_time" in err and "timestamps" in err
    code, _, err = cli("validate", write_study({"variants": {"g": {"attention": {"kind": "fr_graph"}}}}))
    assert code == 2 and "fr_graph" in err and "seqrec" in err and "ordered" in err


def test_xavier_normal_init_sets_every_block_linear_weight():
    """``model.init: xavier_normal`` draws each linear weight from N(0, 2 / (fan_in + fan_out));
    the default keeps PyTorch's U(±1/√fan_in) (std 1/√(3·fan_in), clearly smaller here)."""
    d = 256
    variant = _variant("softmax", "pointwise", "layernorm", "residual", (), "pre")
    ctx = BuildContext(dim=d, dropout=0.0, max_len=8)
    torch.manual_seed(0)
    xavier = build_backbone(
        dataclasses.replace(
            variant, spec=variant.spec.model_copy(update={"dim": d, "init": "xavier_normal"})
        ),
        ctx,
    )
    plain_spec = variant.spec.model_copy(update={"dim": d})
    default = build_backbone(dataclasses.replace(variant, spec=plain_spec), ctx)
    linears = [(name, m) for name, m in xavier.named_modules() if isinstance(m, nn.Linear)]
    assert len(linears) == 4  # qkv, out, w1, w2
    for name, layer in linears:
        fan_out, fan_in = layer.weight.shape
        expected = math.sqrt(2 / (fan_in + fan_out))
        assert abs(layer.weight.std().item() / expected - 1) < 0.03, name
        assert abs(layer.weight.mean().item()) < 0.05 * expected, name
        plain = default.get_submodule(name).weight
        assert abs(plain.std().item() / (1 / math.sqrt(3 * fan_in)) - 1) < 0.03, name
        assert layer.bias.abs().max() <= 1 / math.sqrt(fan_in)  # biases keep their init

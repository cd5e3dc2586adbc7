"""Kind lookup through entry points: listing, unknown kinds and slots, broken plugins, providers."""

from __future__ import annotations

import dataclasses
import sys
from importlib.metadata import version

import pytest

from ablate import components, registry
from ablate.errors import AblateError
from ablate.model.spec import ModelSpec
from ablate.model.variant import Variant

BASES = {
    "attention": components.Attention,
    "ffn": components.FeedForward,
    "norm": components.Norm,
    "connection": components.Connection,
    "bias": components.BiasChannel,
}


@pytest.mark.parametrize("slot", registry.COMPONENT_SLOTS)
def test_every_slot_lists_its_kinds_sorted(slot):
    kinds = registry.kinds(slot)
    assert kinds and kinds == sorted(kinds)
    for kind in kinds:
        cls = registry.get(slot, kind)
        assert issubclass(cls, BASES[slot]), (slot, kind)
        assert cls.kind_name() == kind  # the name it was registered under


def test_built_in_kinds_are_listed():
    assert {"softmax", "pointwise", "ams", "none"} <= set(registry.kinds("attention"))
    assert {"pointwise", "mlp", "swiglu", "moe"} <= set(registry.kinds("ffn"))
    assert set(registry.kinds("norm")) >= {"layernorm", "rmsnorm", "none"}
    assert set(registry.kinds("connection")) >= {"residual", "hyper", "mhc"}
    assert set(registry.kinds("task")) >= {"seqrec", "forecast", "tabular"}


def test_unknown_kind_suggests_the_closest():
    with pytest.raises(registry.UnknownKind) as exc:
        registry.get("attention", "sofmax")
    message = str(exc.value)
    assert message.startswith("unknown attention kind 'sofmax'; did you mean 'softmax'? (known: ")
    assert ", ".join(registry.kinds("attention")) in message
    assert (exc.value.slot, exc.value.kind) == ("attention", "sofmax")
    assert "did you mean" not in str(registry.UnknownKind("ffn", "zzzzzz", ["mlp"]))
    assert "(none registered)" in str(registry.UnknownKind("ffn", "mlp", []))


@pytest.mark.parametrize("call", [registry.kinds, lambda slot: registry.get(slot, "softmax")])
def test_unknown_slot(call):
    slots = r"\(slots: attention, ffn, norm, connection, bias, task\)"
    with pytest.raises(AblateError, match=rf"unknown slot 'attn' {slots}"):
        call("attn")


def test_model_spec_and_variant_hold_every_component_slot():
    """``ModelSpec`` and ``Variant`` spell their slot fields out; they must cover the registry's slots."""
    assert set(registry.COMPONENT_SLOTS) <= set(ModelSpec.model_fields)
    assert set(registry.COMPONENT_SLOTS) <= {f.name for f in dataclasses.fields(Variant)}
    assert registry.SLOTS == registry.COMPONENT_SLOTS + ("task",)


@pytest.fixture
def broken_plugin(tmp_path, monkeypatch):
    """An installed distribution whose attention kind points at a module that does not exist."""
    dist = tmp_path / "broken_plugin-0.3.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 0.3\n")
    (dist / "entry_points.txt").write_text("[ablate.attention]\nbroken = no_such_module_for_ablate:Mixer\n")
    (dist / "RECORD").write_text("")
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    registry.refresh()
    yield
    monkeypatch.undo()
    registry.refresh()


def test_plugin_that_fails_to_import_is_named(broken_plugin):
    assert "broken" in registry.kinds("attention")
    with pytest.raises(AblateError) as exc:
        registry.get("attention", "broken")
    message = str(exc.value)
    assert message.startswith("attention kind 'broken' (no_such_module_for_ablate:Mixer) failed to import: ")
    assert "no_such_module_for_ablate" in message.split("failed to import: ")[1]
    assert registry.provider("attention", "broken") == "broken-plugin 0.3"
    assert registry.get("attention", "softmax").kind_name() == "softmax"  # the others still load


def test_provider_names_the_distribution():
    assert registry.provider("attention", "softmax") == f"ablate-studies {version('ablate-studies')}"
    assert registry.provider("task", "seqrec").startswith("ablate-studies ")

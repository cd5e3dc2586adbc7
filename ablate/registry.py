"""Component and task lookup through Python entry points.

Every kind — built-in or third-party — is found the same way: an entry point named after
the kind in the group ``ablate.<slot>``. The core never imports a plugin module by name.
"""

from __future__ import annotations

import difflib
from functools import cache
from importlib.metadata import EntryPoint, entry_points

from ablate.errors import AblateError

COMPONENT_SLOTS = ("attention", "ffn", "norm", "connection", "bias")
SLOTS = COMPONENT_SLOTS + ("task",)


class UnknownKind(AblateError):
    def __init__(self, slot: str, kind: str, known: list[str]):
        self.slot, self.kind, self.known = slot, kind, known
        close = difflib.get_close_matches(kind, known, n=1, cutoff=0.5)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        listed = ", ".join(known) if known else "(none registered)"
        super().__init__(f"unknown {slot} kind '{kind}'{hint} (known: {listed})")


@cache
def _entry_points(slot: str) -> dict[str, EntryPoint]:
    group = f"ablate.{slot}"
    found: dict[str, EntryPoint] = {}
    for ep in entry_points(group=group):
        # First distribution on sys.path wins, as for any import.
        found.setdefault(ep.name, ep)
    return found


def refresh() -> None:
    """Forget cached lookups (after ``sys.path`` changes, e.g. in tests)."""
    _entry_points.cache_clear()
    _load.cache_clear()


def kinds(slot: str) -> list[str]:
    """All registered kind names for a slot, sorted."""
    _check_slot(slot)
    return sorted(_entry_points(slot))


def get(slot: str, kind: str) -> type:
    """The class registered as ``kind`` in ``slot``; raises :class:`UnknownKind`."""
    _check_slot(slot)
    if kind not in _entry_points(slot):
        raise UnknownKind(slot, kind, kinds(slot))
    return _load(slot, kind)


@cache
def _load(slot: str, kind: str) -> type:
    ep = _entry_points(slot)[kind]
    try:
        cls = ep.load()
    except Exception as exc:  # a broken third-party plugin must not look like our crash
        raise AblateError(f"{slot} kind '{kind}' ({ep.value}) failed to import: {exc}") from exc
    # Kinds learn the name they were registered under (used in labels and tags).
    cls._kind = kind
    return cls


def provider(slot: str, kind: str) -> str:
    """Which distribution provides a kind (for ``ablate components``)."""
    ep = _entry_points(slot)[kind]
    dist = getattr(ep, "dist", None)
    return f"{dist.name} {dist.version}" if dist is not None else ep.value


def _check_slot(slot: str) -> None:
    if slot not in SLOTS:
        raise AblateError(f"unknown slot '{slot}' (slots: {', '.join(SLOTS)})")

"""Command-line overrides of a study file: ``train.lr=1e-3``, ``model.attention.heads=2``,
``seeds=[0,1,2,3]``, ``variants.wide.ffn.kind=mlp``.

A dotted key reaches into the study file's mapping; the value is read as YAML (a scalar or a
flow collection). Overrides are applied to the parsed mapping before it is validated, so they
are checked exactly like the file, and a problem they cause names the override instead of a
line of the file::

    override train.lr=abc: train.lr: Input should be a valid number ... (got 'abc')
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .errors import StudyError
from .studyfile import Locator, yaml_value

# YAML 1.1 (PyYAML) reads `1e-3` as a string; a number written that way on a command line is a number.
_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


@dataclass(frozen=True)
class Override:
    text: str  # as given, e.g. "train.lr=1e-3"
    key: tuple[str, ...]
    value: Any


def parse_overrides(texts: Iterable[str]) -> list[Override]:
    """``key=value`` strings as :class:`Override` s; a malformed one raises :class:`StudyError`."""
    parsed = []
    for text in texts:
        dotted, equals, value_text = text.partition("=")
        key = tuple(dotted.strip().split("."))
        if not equals or not all(key):
            raise StudyError(f"override {text}: expected key=value with a dotted key, e.g. train.lr=1e-3")
        try:
            value = yaml_value(value_text)  # an alias bomb on a command line is refused too
        except yaml.YAMLError as exc:
            problem = getattr(exc, "problem", None) or str(exc).strip().splitlines()[0]
            raise StudyError(f"override {text}: the value is not valid YAML: {problem}") from None
        if isinstance(value, str) and _FLOAT.fullmatch(value_text.strip()):  # unquoted only
            value = float(value)
        parsed.append(Override(text, key, value))
    return parsed


def apply_overrides(raw: dict, overrides: Iterable[Override]) -> dict:
    """A copy of the study file's mapping with each override set, in order. Missing mappings on
    the way are created (an empty section counts as missing); crossing any other value is an error."""
    out = copy.deepcopy(raw)
    for override in overrides:
        node = out
        for depth, part in enumerate(override.key[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            elif not isinstance(child, dict):
                crossed = ".".join(override.key[: depth + 1])
                raise StudyError(
                    f"override {override.text}: {crossed} holds {_kind(child)}, not a mapping of keys"
                )
            node = child
        node[override.key[-1]] = copy.deepcopy(override.value)
    return out


def _kind(value: Any) -> str:
    return "a list" if isinstance(value, list) else f"the value {value!r}"


class OverriddenLocator(Locator):
    """A :class:`Locator` for a study file with overrides applied: a problem at or inside a key
    an override set names that override (the last one, as the last one wins); any other names
    the file's line as before."""

    def __init__(self, path: Path, lines: dict[tuple, int], overrides: Iterable[Override]):
        super().__init__(path, lines)
        self.overrides = list(overrides)

    def error(self, key: tuple, message: str, fallback: tuple | None = None) -> StudyError:
        cause = self._cause(key)
        if cause is None and self._line(key) is None and fallback:
            cause = self._cause(fallback)  # a variant's key that only the base model spells out
        if cause is None:
            # A problem of a combination (the file's heads with an overridden dim) names both.
            section = [o.text for o in self.overrides if key and o.key[0] == str(key[0])]
            given = f" (with override {', '.join(section)})" if section else ""
            return super().error(key, message + given, fallback)
        dotted = ".".join(str(k) for k in key)
        return StudyError(f"override {cause.text}: {dotted}: {message}")

    def _cause(self, key: tuple) -> Override | None:
        """The last override that set ``key``, a key inside it (a component's option, for a
        problem its constructor found) or a mapping holding it."""
        named = tuple(map(str, key))
        found = [o for o in self.overrides if named[: len(o.key)] == o.key or o.key[: len(named)] == named]
        return found[-1] if found else None

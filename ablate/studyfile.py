"""Reading a study file: YAML or TOML text to a mapping, and every problem to one line naming
the file, the line (where the format gives one) and the key path, e.g.::

    studies/x.yaml:12: model.attention.kind: unknown attention kind 'sofmax'; did you mean 'softmax'? ...
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from . import registry
from .errors import AblateError, StudyError


def parse(path: Path, text: str) -> tuple[dict, dict[tuple, int]]:
    try:
        if path.suffix.lower() == ".toml":
            return tomllib.loads(text), {}
        raw = yaml.safe_load(text)
        lines = yaml_lines(text)
    except (yaml.YAMLError, tomllib.TOMLDecodeError) as exc:
        mark = getattr(exc, "problem_mark", None)
        loc = f":{mark.line + 1}" if mark is not None else ""
        first = str(exc).strip().splitlines()[0]
        raise StudyError(
            f"{path}{loc}: not valid {path.suffix.lstrip('.').upper() or 'YAML'}: {first}"
        ) from None
    if not isinstance(raw, dict):
        raise StudyError(f"{path}: a study file must be a mapping of keys (name, task, model, ...)")
    return raw, lines


def yaml_lines(text: str) -> dict[tuple, int]:
    """Key path -> 1-based line of the key, from the YAML node tree."""
    lines: dict[tuple, int] = {}

    def walk(node: yaml.Node, path: tuple) -> None:
        lines.setdefault(path, node.start_mark.line + 1)
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                sub = path + (key.value,)
                lines[sub] = key.start_mark.line + 1
                walk(value, sub)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                walk(item, path + (i,))

    root = yaml.compose(text)
    if root is not None:
        walk(root, ())
    return lines


class Locator:
    """Turns key paths into 'file:line: a.b.c: message' lines."""

    def __init__(self, path: Path, lines: dict[tuple, int]):
        self.path, self.lines = path, lines

    def error(self, key: tuple, message: str, fallback: tuple | None = None) -> StudyError:
        line = self._line(key) or (self._line(fallback) if fallback else None)
        loc = f"{self.path}:{line}" if line else f"{self.path}"
        dotted = ".".join(str(k) for k in key)
        return StudyError(f"{loc}: {dotted}: {message}" if dotted else f"{loc}: {message}")

    def _line(self, key: tuple) -> int | None:
        for n in range(len(key), 0, -1):
            if key[:n] in self.lines:
                return self.lines[key[:n]]
        return None

    def pydantic(self, exc: ValidationError, prefix: tuple, fallback: tuple | None = None) -> StudyError:
        err = exc.errors()[0]
        more = len(exc.errors()) - 1
        key = prefix + tuple(err["loc"])
        msg = pydantic_message(err)
        if more:
            msg += f" (and {more} more problem{'s' if more > 1 else ''})"
        return self.error(key, msg, fallback + tuple(err["loc"]) if fallback else None)


def pydantic_message(err: dict) -> str:
    kind = err["type"]
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "missing":
        return "required key is missing"
    given = err.get("input")
    shown = repr(given) if not isinstance(given, dict) else "a mapping"
    # A validator's own ValueError (e.g. an unknown vocabulary name) already says what it got.
    if kind == "value_error":
        return err["msg"].removeprefix("Value error, ")
    return f"{err['msg']} (got {shown})"


def lookup(where: Locator, key: tuple, slot: str, kind: str) -> type:
    try:
        return registry.get(slot, kind)
    except registry.UnknownKind as exc:
        raise where.error(key, str(exc)) from None
    except AblateError as exc:
        raise where.error(key, str(exc)) from None


def validate_options(where: Locator, key: tuple, cls: type, raw: dict, fallback: tuple | None = None) -> Any:
    try:
        return cls.Options.model_validate(raw)
    except ValidationError as exc:
        raise where.pydantic(exc, key, fallback) from None


class Bare(Locator):
    """Errors naming only the key path (for keys applied after loading, e.g. search values)."""

    def error(self, key: tuple, message: str, fallback: tuple | None = None) -> StudyError:
        return StudyError(f"{'.'.join(str(k) for k in key)}: {message}")

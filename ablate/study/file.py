"""Reading a study file: YAML or TOML text to a mapping, and every problem to one line naming
the file, the line (where the format gives one) and the key path, e.g.::

    studies/x.yaml:12: model.attention.kind: unknown attention kind 'sofmax'; did you mean 'softmax'? ...

A study file is small and plain: it is refused when it is over :data:`MAX_BYTES`, not UTF-8, or
(YAML) expands past :data:`MAX_NODES` values through aliases, refers to itself, repeats a key,
or carries a tag of a Python object (safe loading builds plain values only).
"""

from __future__ import annotations

import errno
import re
import stat
import tomllib
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from ablate import registry
from ablate.errors import AblateError, StudyError
from ablate.schema import Locator

# The largest committed study is a few KB: a file a thousand times that is not a study.
MAX_BYTES = 4 * 2**20
# Values in a YAML document once aliases are expanded: a 1 KB alias bomb expands to billions.
MAX_NODES = 100_000
# Mappings and lists inside each other: a study nests four or five deep; the parsers recurse.
MAX_DEPTH = 64
MERGE = "tag:yaml.org,2002:merge"  # `<<: *base`, whose keys the mapping's own keys override


def read_study(path: Path) -> tuple[dict, dict[tuple, int]]:
    """The study file's mapping and its key path → line map. Raises :class:`StudyError`."""
    try:
        mode = path.stat().st_mode  # is_file() says False for a symbolic link loop too: "not found"
    except FileNotFoundError:
        link = " (a symbolic link to a missing file)" if path.is_symlink() else ""
        raise StudyError(f"{path}: study file not found{link}") from None
    except OSError as exc:  # a symbolic link loop, a folder on the way not readable
        if exc.errno == errno.ELOOP:
            raise StudyError(f"{path}: a symbolic link loop (its links never reach a file)") from None
        raise StudyError(f"{path}: cannot read the study file: {exc.strerror or exc}") from None
    if stat.S_ISDIR(mode):
        raise StudyError(f"{path}: is a folder; give the study file (a .yaml or .toml file) in it")
    if not stat.S_ISREG(mode):  # a pipe or a device would block or never end
        raise StudyError(f"{path}: not a regular file (a pipe, socket or device)")
    try:
        with path.open("rb") as file:
            data = file.read(MAX_BYTES + 1)
    except OSError as exc:
        raise StudyError(f"{path}: cannot read the study file: {exc.strerror or exc}") from None
    if len(data) > MAX_BYTES:
        raise StudyError(f"{path}: over {MAX_BYTES // 2**20} MB; a study file is a few KB of settings")
    return parse(path, decode(path, data))


def decode(path: Path, data: bytes) -> str:
    """UTF-8 text (a byte-order mark dropped), or an error naming the first bad byte's line."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - data.rfind(b"\n", 0, exc.start)
        raise StudyError(
            f"{path}:{line}: not UTF-8: byte 0x{data[exc.start]:02x} at column {column}; "
            f"save the study file as UTF-8"
        ) from None


def parse(path: Path, text: str) -> tuple[dict, dict[tuple, int]]:
    if path.suffix.lower() == ".toml":
        raw, lines = parse_toml(path, text)
    else:
        raw, lines = parse_yaml(path, text)
    if not isinstance(raw, dict):
        raise StudyError(f"{path}: a study file must be a mapping of keys (name, task, model, ...)")
    return raw, lines


# ---------------------------------------------------------------------------------------
# YAML


class _Refused(yaml.YAMLError):
    """A document the loader will not build, at ``mark``."""

    def __init__(self, mark: yaml.Mark, message: str):
        super().__init__(message)
        self.mark, self.message, self.problem = mark, message, message


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return list(node.value) if isinstance(node, yaml.SequenceNode) else []


class StudyLoader(yaml.SafeLoader):
    """Safe YAML that counts values as aliases expand them while composing, so a bomb is
    refused before anything is built, and refuses an alias inside what it refers to and nesting
    past :data:`MAX_DEPTH`."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self.expanded: dict[int, int] = {}  # id(node) → values under it, aliases expanded
        self.depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        self.depth += 1
        try:
            return self._compose(parent, index)
        finally:
            self.depth -= 1

    def _compose(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        if self.depth > MAX_DEPTH:
            raise _Refused(self.peek_event().start_mark, f"nested over {MAX_DEPTH} levels deep")
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            node = super().compose_node(parent, index)
            if id(node) not in self.expanded:  # still being composed: the alias is inside it
                raise _Refused(mark, "recursive alias: it refers to a mapping or list that contains it")
            return node
        node = super().compose_node(parent, index)
        size = 1 + sum(self.expanded[id(child)] for child in _children(node))
        if size > MAX_NODES:
            raise _Refused(
                node.start_mark,
                f"holds over {MAX_NODES:,} values, each alias counted as what it repeats; a study "
                f"file holds a few hundred",
            )
        self.expanded[id(node)] = size
        return node


def yaml_value(text: str) -> Any:
    """A YAML value under a study file's limits (an override's ``key=value``); raises ``yaml.YAMLError``."""
    loader = StudyLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def parse_yaml(path: Path, text: str) -> tuple[Any, dict[tuple, int]]:
    loader = StudyLoader(text)
    try:
        root = loader.get_single_node()
        lines = yaml_lines(path, root)
        return (loader.construct_document(root) if root is not None else None), lines
    except _Refused as exc:
        raise StudyError(f"{path}:{exc.mark.line + 1}: not a valid study file: {exc.message}") from None
    except yaml.YAMLError as exc:
        raise StudyError(yaml_message(path, exc)) from None
    finally:
        loader.dispose()


# Where a problem is found only after the construct it belongs to (an unclosed bracket or quote)
# the line that opened it is the one to point at.
_OPENED = re.compile(r"while (?:parsing|scanning) (an? (?:flow mapping|flow sequence|quoted scalar))")


def yaml_message(path: Path, exc: yaml.YAMLError) -> str:
    """The parser's own words with the line they are about: ``expected ',' or '}', but got ':'``."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).strip().splitlines()[0]
    if mark is None:
        return f"{path}: not valid YAML: {problem}"
    context, opening = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}"
    opened = _OPENED.match(context or "")
    if opened and opening is not None:
        return (
            f"{path}:{opening.line + 1}: not valid YAML: {opened.group(1)} opened here "
            f"(column {opening.column + 1}) is not closed: {problem} at {where}"
        )
    detail = f"{problem} (column {mark.column + 1})"
    if context and opening is not None and not context.startswith("while"):
        detail = f"{context.rstrip(';')} at line {opening.line + 1}, {problem} at {where}"
    if "'\\t'" in problem:
        detail += "; indent with spaces: YAML does not allow tabs there"
    return f"{path}:{mark.line + 1}: not valid YAML: {detail}"


def yaml_lines(path: Path, root: yaml.Node | None) -> dict[tuple, int]:
    """Key path -> 1-based line of the key, from the YAML node tree; a key given twice in one
    mapping is refused, naming both lines (the later one would silently replace the first)."""
    lines: dict[tuple, int] = {}
    checked: set[int] = set()  # mappings reached again through an alias were checked once

    def walk(node: yaml.Node, at: tuple) -> None:
        lines.setdefault(at, node.start_mark.line + 1)
        if isinstance(node, yaml.MappingNode):
            if id(node) not in checked:
                checked.add(id(node))
                _check_keys(path, node, at)
            for key, value in node.value:
                sub = at + (key.value,)
                lines[sub] = key.start_mark.line + 1
                walk(value, sub)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                walk(item, at + (i,))

    if root is not None:
        walk(root, ())
    return lines


def _check_keys(path: Path, node: yaml.MappingNode, at: tuple) -> None:
    first: dict[tuple[str, Any], yaml.Node] = {}
    for key, _ in node.value:
        if not isinstance(key, yaml.ScalarNode) or key.tag == MERGE:
            continue
        earlier = first.setdefault((key.tag, key.value), key)
        if earlier is not key:
            dotted = ".".join(str(k) for k in at + (key.value,))
            line, before = key.start_mark.line + 1, earlier.start_mark.line + 1
            where = "earlier on this line" if line == before else f"first at line {before}"
            raise StudyError(
                f"{path}:{line}: {dotted}: duplicate key ({where}); the later one would silently "
                f"replace the first: rename or remove one"
            )


# ---------------------------------------------------------------------------------------
# TOML (tomllib keeps no positions: a line scanner finds each key's line)

_TOML_AT = re.compile(r"\s*\(at line (\d+), column (\d+)\)$")
_KEY = r"""(?:[A-Za-z0-9_-]+|"(?:[^"\\]|\\.)*"|'[^']*')"""
_DOTTED = rf"{_KEY}(?:\s*\.\s*{_KEY})*"
_HEADER = re.compile(rf"\s*(\[\[?)\s*({_DOTTED})\s*\]\]?\s*(?:#.*)?$")
_ASSIGN = re.compile(rf"\s*({_DOTTED})\s*=")


def parse_toml(path: Path, text: str) -> tuple[dict, dict[tuple, int]]:
    lines, repeated = toml_lines(path, text)
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        at = _TOML_AT.search(message)
        if at is None:
            raise StudyError(f"{path}: not valid TOML: {message}") from None
        line = int(at[1])
        if line in repeated:  # tomllib names the second definition only
            key, before = repeated[line]
            dotted = ".".join(str(k) for k in key)
            raise StudyError(
                f"{path}:{line}: {dotted}: duplicate key (first at line {before}); rename or remove one"
            ) from None
        raise StudyError(f"{path}:{line}: not valid TOML: {message[: at.start()]} (column {at[2]})") from None
    return raw, lines


def _toml_key(dotted: str) -> tuple[str, ...]:
    return tuple(part[1:-1] if part[0] in "\"'" else part for part in re.findall(_KEY, dotted))


def _scan_value(rest: str, depth: int) -> tuple[int, str | None, int]:
    """Open brackets after a value's text (a multi-line array or table), an unclosed multi-line
    string's quotes, and the deepest nesting on the way; strings and comments are skipped."""
    i, deepest = 0, depth
    while i < len(rest):
        char = rest[i]
        if rest.startswith(('"""', "'''"), i):
            end = rest.find(rest[i : i + 3], i + 3)
            if end < 0:
                return depth, rest[i : i + 3], deepest
            i = end + 3
            continue
        if char in "\"'":
            end = i + 1
            while end < len(rest) and rest[end] != char:
                end += 2 if char == '"' and rest[end] == "\\" else 1
            i = end + 1
            continue
        if char == "#":
            break
        depth += (char in "[{") - (char in "]}")
        deepest = max(deepest, depth)
        i += 1
    return depth, None, deepest


def toml_lines(path: Path, text: str) -> tuple[dict[tuple, int], dict[int, tuple[tuple, int]]]:
    """Key path → line of each key and table header, and line → (key, first line) of each key
    defined a second time."""
    lines: dict[tuple, int] = {}
    repeated: dict[int, tuple[tuple, int]] = {}
    arrays: dict[tuple, int] = {}  # array of tables → index of its last table
    table: tuple = ()
    depth, quotes = 0, None

    def resolve(key: tuple) -> tuple:
        out: tuple = ()
        for part in key:
            out += (part,)
            if out in arrays:
                out += (arrays[out],)
        return out

    def define(key: tuple, number: int) -> None:
        if key in lines:
            repeated[number] = (key, lines[key])
        lines[key] = number

    for number, line in enumerate(text.splitlines(), 1):
        if quotes is not None:
            if quotes in line:
                depth, quotes, _ = _scan_value(line[line.index(quotes) + 3 :], depth)
            continue
        rest = line
        if depth == 0:
            header, assign = _HEADER.match(line), _ASSIGN.match(line)
            if header:
                key = _toml_key(header[2])
                if header[1] == "[[":
                    parent = resolve(key[:-1]) + key[-1:]
                    arrays[parent] = arrays.get(parent, -1) + 1
                    table = parent + (arrays[parent],)
                    lines.setdefault(parent, number)
                    lines[table] = number
                else:
                    table = resolve(key)
                    define(table, number)
                continue
            if assign:
                key = table + _toml_key(assign[1])
                for n in range(len(table) + 1, len(key)):  # a dotted key's tables: its first line
                    lines.setdefault(key[:n], number)
                define(key, number)
                rest = line[assign.end() :]
        depth, quotes, deepest = _scan_value(rest, depth)
        if deepest > MAX_DEPTH:  # before tomllib, which would recurse until Python stops it
            raise StudyError(f"{path}:{number}: not a valid study file: nested over {MAX_DEPTH} levels deep")
    return lines, repeated


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

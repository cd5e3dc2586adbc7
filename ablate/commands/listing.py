"""``ablate components``: every registered kind per slot, a table a slot; each kind's options with
their type, allowed values, default and a one-line description — the field's ``description=``,
else the comment that documents the field in the kind's source (on its line, or the lines just
above it), else "—"."""

from __future__ import annotations

import ast
import inspect
import io
import textwrap
import tokenize
import types
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any, Literal, Union, get_args, get_origin

import annotated_types
from pydantic import AfterValidator, BaseModel

from ablate.schema import Vocabulary

if TYPE_CHECKING:  # pragma: no cover
    from rich.table import Table

NONE = "—"
# Numeric bounds as pydantic keeps them (``Field(gt=0)`` → ``Gt(0)``), in the order they read.
BOUNDS = {annotated_types.Ge: "≥", annotated_types.Gt: ">", annotated_types.Le: "≤", annotated_types.Lt: "<"}


@dataclass(frozen=True)
class OptionRow:
    name: str
    type: str
    allowed: str
    default: str
    description: str


def show_components(slot: str | None) -> None:
    """Print each slot's kinds (``slot``: that one only) with their options, one table a slot."""
    from ablate import registry
    from ablate.commands.console import out

    for s in [slot] if slot else list(registry.SLOTS):
        out.print(_slot_table(s))


def _slot_table(slot: str) -> Table:
    from rich.markup import escape
    from rich.table import Table

    from ablate import registry

    table = Table(title=f"{slot} kinds", title_justify="left")
    for column in ("kind", "option", "type", "allowed", "default", "description"):
        table.add_column(column)
    for kind in registry.kinds(slot):
        rows = describe_options(registry.get(slot, kind).Options)
        cells = [[r.name, r.type, r.allowed, r.default, r.description] for r in rows] or [["—"] * 5]
        # The kind, and under it (on the next option's row) the distribution that provides it.
        named = [kind, f"[dim]{escape(registry.provider(slot, kind))}[/dim]"]
        if len(cells) == 1:
            named = ["\n".join(named)]
        for i, row in enumerate(cells):
            table.add_row(named[i] if i < 2 else "", *map(escape, row), end_section=i == len(cells) - 1)
    return table


def describe_options(options_cls: type[BaseModel]) -> list[OptionRow]:
    rows = []
    for name, field in options_cls.model_fields.items():
        default = "required" if field.is_required() else repr(field.get_default(call_default_factory=True))
        description = field.description or _comments(_owner(options_cls, name)).get(name, NONE)
        rows.append(OptionRow(name, type_name(field.annotation), _allowed(field), default, description))
    return rows


def type_name(annotation: Any) -> str:
    """``int | None``, ``str`` for ``Literal['relu', 'gelu']``, ``list[int]``."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Literal:
        return " | ".join(dict.fromkeys(type(a).__name__ for a in args))
    if origin in (Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if annotation is type(None):
        return "None"
    if args or not hasattr(annotation, "__name__"):
        return str(annotation).replace("typing.", "")
    return annotation.__name__


def _allowed(field) -> str:
    """A Literal's values or a vocabulary's names (``relu, gelu``), or the numeric bounds (``≥ 0, < 1``)."""
    names = _literal_values(field.annotation)
    for meta in field.metadata:
        owner = getattr(getattr(meta, "func", None), "__self__", None)
        if isinstance(meta, AfterValidator) and isinstance(owner, Vocabulary):
            names += list(owner)
    if names:
        return ", ".join(str(n) for n in names)
    bounds = [
        f"{sign} {getattr(meta, kind.__name__.lower())}"
        for meta in field.metadata
        for kind, sign in BOUNDS.items()
        if isinstance(meta, kind)
    ]
    return ", ".join(bounds) or NONE


def _literal_values(annotation: Any) -> list:
    if get_origin(annotation) is Literal:
        return list(get_args(annotation))
    return [v for a in get_args(annotation) for v in _literal_values(a)]


def _owner(options_cls: type, name: str) -> type:
    """The class in the hierarchy that declares the field ``name``."""
    return next((c for c in options_cls.__mro__ if name in getattr(c, "__annotations__", {})), options_cls)


@cache
def _comments(cls: type) -> dict[str, str]:
    """Field name → the first sentence of the comment documenting it in ``cls``'s source: the
    comment ending its line, else the block of comment lines right above it."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    source = textwrap.dedent(source)
    comments = {
        token.start[0]: token.string.lstrip("#").strip()
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT
    }
    found = {}
    body = ast.parse(source).body[0].body
    for node in body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        text = comments.get(node.end_lineno)
        if text is None:
            above, line = [], node.lineno - 1
            while line in comments and not source.splitlines()[line - 1].split("#")[0].strip():
                above.insert(0, comments[line])
                line -= 1
            text = " ".join(above)
        if text:
            found[node.target.id] = _first_sentence(text)
    return found


def _first_sentence(text: str) -> str:
    end = text.find(". ")
    return text[: end + 1] if end >= 0 else text

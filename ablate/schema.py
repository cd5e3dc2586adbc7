"""Building blocks of the study-file schema: strict models and closed vocabularies.

A :class:`Strict` model refuses unknown keys and takes numbers as numbers only: ``true`` is not
an integer (pydantic's lax mode reads it as 1), anywhere in the model, nested types included.

A closed vocabulary (norm placements, initialisers, optimisers, samplers, …) is defined once,
as a :class:`Vocabulary` — a name → constructor/value map kept in the module that uses it, as
timm keeps ``_NORM_MAP`` beside ``get_norm_layer``. The schema validates a name against the
map's keys (:meth:`Vocabulary.field`), so adding an entry to the map is all it takes.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Annotated, Any, ClassVar, Generic, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    GetCoreSchemaHandler,
    ValidationError,
    WithJsonSchema,
    model_validator,
)
from pydantic_core import CoreSchema, PydanticCustomError, PydanticKnownError, core_schema

from ablate.errors import StudyError

Value = TypeVar("Value")

# YAML 1.1 (PyYAML) reads ``1e9`` as a string; where an integer is expected it means one.
_EXPONENT = re.compile(r"\s*[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+\s*")


def integer(value: Any) -> Any:
    """``value`` for an integer field: a bool refused, ``"1e9"`` read as 1000000000."""
    if isinstance(value, bool):  # pydantic's own error type: rebuilt errors (tasks.untagged) keep it
        raise PydanticKnownError("int_type")
    if isinstance(value, str) and _EXPONENT.fullmatch(value):
        exact = float(value)
        if math.isfinite(exact) and exact.is_integer():
            return int(exact)
    return value


def number(value: Any) -> Any:
    """``value`` for a float field: a bool refused."""
    if isinstance(value, bool):
        raise PydanticKnownError("float_type")
    return value


_NUMBERS = {"int": integer, "float": number}


def numbers_only(schema: Any) -> Any:
    """A core schema with every int and float inside it (fields, list items, union members, …)
    checked first by :func:`integer` / :func:`number`."""
    if isinstance(schema, list):
        return [numbers_only(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: numbers_only(item) for key, item in schema.items()}
    kind = out.get("type")  # a field may be named "type" too: its schema is a mapping
    check = _NUMBERS.get(kind) if isinstance(kind, str) else None
    return out if check is None else core_schema.no_info_before_validator_function(check, out)


# An integer outside a Strict model (a TypeAdapter's items).
Int = Annotated[int, BeforeValidator(integer)]


class Strict(BaseModel):
    """A section of the study file: unknown keys are errors, a bool is no number.

    ``ADDED_LATER`` names options added after stores with fingerprints by meaning existed, each
    with the value under which a study trains exactly as before the option existed: fingerprints
    leave such an option out at that value (not at its default: a default changed later is still
    seen), so adding an option does not retrain every store."""

    model_config = ConfigDict(extra="forbid")
    ADDED_LATER: ClassVar[dict[str, Any]] = {}

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: type[BaseModel], handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        return numbers_only(handler(source))

    @model_validator(mode="wrap")
    @classmethod
    def _unknown_keys_hinted(cls, data: Any, handler: Any) -> Any:
        """Every problem pydantic found, an unknown key of this section with a did-you-mean drawn
        from its keys (a nested section's were hinted by its own model)."""
        try:
            return handler(data)
        except ValidationError as exc:
            errors = exc.errors(include_url=False)
            if not any(e["type"] in ("extra_forbidden", UNKNOWN_KEY) for e in errors):
                raise
            known = [field.alias or name for name, field in cls.model_fields.items()]
            raise ValidationError.from_exception_data(exc.title, _hinted(errors, known)) from None


UNKNOWN_KEY = "unknown_key"  # pydantic's extra_forbidden with a did-you-mean (Strict)
_UNKNOWN_KEY_TEXT = "unknown key; did you mean '{suggestion}'?"


def errors_again(title: str, errors: list[dict]) -> ValidationError:
    """A ValidationError of ``errors`` as :meth:`ValidationError.errors` returned them (locations
    changed, say): a hinted unknown key is a custom error type, which pydantic rebuilds only from
    its PydanticCustomError."""
    out = [
        {
            **e,
            "type": PydanticCustomError(UNKNOWN_KEY, _UNKNOWN_KEY_TEXT, e.get("ctx") or {"suggestion": "?"}),
        }
        if e["type"] == UNKNOWN_KEY
        else e
        for e in errors
    ]
    return ValidationError.from_exception_data(title, out)


def _hinted(errors: list[dict], known: list[str]) -> list[dict]:
    """``errors`` with this level's unknown keys hinted and nested levels' hints kept."""
    out = []
    for e in errors:
        close = []
        if e["type"] == "extra_forbidden" and len(e["loc"]) == 1:
            close = difflib.get_close_matches(str(e["loc"][0]), known, n=1, cutoff=0.6)
        if e["type"] == UNKNOWN_KEY or close:
            ctx = e.get("ctx") or {"suggestion": close[0]}
            e = {**e, "type": PydanticCustomError(UNKNOWN_KEY, _UNKNOWN_KEY_TEXT, ctx)}
        out.append(e)
    return out


class Vocabulary(Mapping[str, Value], Generic[Value]):
    """A closed set of names, each mapped to what it stands for (a class, a factory, a value).

    ``what`` names the vocabulary in messages ("norm placement"); lookups of an unknown name
    raise ``ValueError`` with a did-you-mean drawn from the keys."""

    def __init__(self, what: str, entries: Mapping[str, Value]):
        self.what = what
        self._entries = dict(entries)

    def __getitem__(self, name: str) -> Value:
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Vocabulary({self.what!r}, {list(self._entries)})"

    def check(self, name: Any) -> str:
        """``name`` if it is one of the keys, else ``ValueError`` naming the known ones."""
        if isinstance(name, str) and name in self._entries:
            return name
        known = ", ".join(repr(k) for k in self._entries)
        close = difflib.get_close_matches(str(name), list(self._entries), n=1, cutoff=0.5)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown {self.what} {name!r}{hint} (known: {known})")

    @property
    def field(self) -> Any:
        """The pydantic type of a study-file key that takes one of these names."""
        return Annotated[str, AfterValidator(self.check), WithJsonSchema({"enum": list(self._entries)})]


# ---------------------------------------------------------------------------------------
# Where a key is in its file


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
        """Every problem pydantic found, one line each (file:line: key: message), in file order."""
        found = []
        for e in exc.errors():
            loc = tuple(e["loc"])
            found.append(self.error(prefix + loc, pydantic_message(e), fallback + loc if fallback else None))
        found.sort(key=lambda e: line_of(str(e)))
        return found[0] if len(found) == 1 else StudyError("\n".join(dict.fromkeys(str(e) for e in found)))


def line_of(text: str) -> int:
    """The line number of a 'file:line: …' error (0: none)."""
    found = re.match(r"[^\n]*?:(\d+): ", text)
    return int(found.group(1)) if found else 0


def pydantic_message(err: dict) -> str:
    kind = err["type"]
    if kind == UNKNOWN_KEY:  # with its did-you-mean (ablate.schema.Strict)
        return err["msg"]
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


class Bare(Locator):
    """Errors naming only the key path (for keys applied after loading, e.g. search values)."""

    def error(self, key: tuple, message: str, fallback: tuple | None = None) -> StudyError:
        return StudyError(f"{'.'.join(str(k) for k in key)}: {message}")

"""Building blocks of the study-file schema: strict models and closed vocabularies.

A closed vocabulary (norm placements, initialisers, optimisers, samplers, …) is defined once,
as a :class:`Vocabulary` — a name → constructor/value map kept in the module that uses it, as
timm keeps ``_NORM_MAP`` beside ``get_norm_layer``. The schema validates a name against the
map's keys (:meth:`Vocabulary.field`), so adding an entry to the map is all it takes.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator, Mapping
from typing import Annotated, Any, Generic, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, WithJsonSchema

Value = TypeVar("Value")


class Strict(BaseModel):
    """A section of the study file: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid")


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

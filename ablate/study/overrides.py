"""Command-line overrides of a study file, in Hydra's grammar: ``train.lr=1e-3``,
``model.attention.heads=2``, ``seeds=[0,1,2,3]``, ``variants.wide.ffn.kind=mlp``.

A dotted key reaches into the study file's mapping; the value is read as YAML (a scalar or a
flow collection). ``key=value`` sets a key (missing mappings on the way are created), ``+key=value``
adds one the file does not have (an error where it has), ``++key=value`` sets it either way,
``~key`` deletes it (``~variants.two-heads``; ``~key=value`` only where it holds that value).
A comma outside brackets and quotes makes a sweep, ``train.lr=1e-3,3e-3``: ``ablate run`` runs
the study once per value (every combination of several sweeps), each its own study named
``<name>.lr_1e-3`` (:func:`expand_sweeps`), as Hydra's multirun runs one job per value. Any
override that changes what a trial trains names its study alike (``train.epochs=2``:
``<name>.epochs_2``, :func:`configuration_name`), so each configuration has its own output folder,
MLflow experiment and Optuna queue, and a run with overrides never meets the study's own trials.
:func:`only_variants` keeps the variants named (``--only``).

Overrides are applied to the parsed mapping before it is validated, so they are checked exactly
like the file, and a problem they cause names the override instead of a line of the file::

    override train.lr=abc: train.lr: Input should be a valid number ... (got 'abc')
"""

from __future__ import annotations

import copy
import difflib
import hashlib
import itertools
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ablate.errors import StudyError
from ablate.schema import Locator
from ablate.study.file import yaml_value

# YAML 1.1 (PyYAML) reads `1e-3` as a string; a number written that way on a command line is a number.
_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")
_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")  # what a study's name may not hold


_DELETED = object()  # the value of a ``~key`` that names none
OPS = {"~": "delete", "++": "force", "+": "add", "": "set"}  # prefix → what the override does


@dataclass(frozen=True)
class Override:
    text: str  # as given, e.g. "train.lr=1e-3"
    key: tuple[str, ...]
    value: Any
    op: str = "set"  # one of OPS' values


def _prefix(text: str) -> tuple[str, str]:
    """(the grammar's prefix, the rest): ``++a=1`` → ``("++", "a=1")``."""
    for prefix in OPS:
        if prefix and text.startswith(prefix):
            return prefix, text[len(prefix) :]
    return "", text


def sweep_values(value_text: str) -> list[str] | None:
    """The values of a comma sweep (``1e-3,3e-3``), or None where the text is one value (commas
    only inside brackets, braces or quotes: ``[0,1]``, ``'a,b'``)."""
    parts, depth, quote, start = [], 0, None, 0
    for i, char in enumerate(value_text):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(value_text[start:i])
            start = i + 1
    return [*parts, value_text[start:]] if parts else None


def parse_overrides(texts: Iterable[str]) -> list[Override]:
    """``key=value`` strings as :class:`Override` s; a malformed one raises :class:`StudyError`."""
    parsed = []
    for text in texts:
        prefix, rest = _prefix(text.strip())
        dotted, equals, value_text = rest.partition("=")
        key = tuple(dotted.strip().split("."))
        if (not equals and prefix != "~") or not all(key):
            raise StudyError(
                f"override {text}: expected key=value with a dotted key, e.g. train.lr=1e-3 (+key=value "
                f"adds a key, ~key deletes one)"
            )
        if not equals:
            parsed.append(Override(text, key, _DELETED, "delete"))
            continue
        if sweep_values(value_text):
            raise StudyError(
                f"override {text}: a comma sweep runs the study once per value: `ablate run` takes it "
                f"(quote a string holding a comma: key='a,b')"
            )
        try:
            value = yaml_value(value_text)  # an alias bomb on a command line is refused too
        except yaml.YAMLError as exc:
            problem = getattr(exc, "problem", None) or str(exc).strip().splitlines()[0]
            raise StudyError(f"override {text}: the value is not valid YAML: {problem}") from None
        if isinstance(value, str) and _FLOAT.fullmatch(value_text.strip()):  # unquoted only
            value = float(value)
        parsed.append(Override(text, key, value, OPS[prefix]))
    return parsed


def apply_overrides(raw: dict, overrides: Iterable[Override]) -> dict:
    """A copy of the study file's mapping with each override set, in order. Missing mappings on
    the way are created (an empty section counts as missing); crossing any other value is an error."""
    out = copy.deepcopy(raw)
    for override in overrides:
        node, last = out, override.key[-1]
        for depth, part in enumerate(override.key[:-1]):
            child = node.get(part)
            if child is None and override.op == "delete":
                child = {}  # nothing there to delete: said below
            elif child is None:
                child = node[part] = {}
            elif not isinstance(child, dict):
                crossed = ".".join(override.key[: depth + 1])
                raise StudyError(
                    f"override {override.text}: {crossed} holds {_kind(child)}, not a mapping of keys"
                )
            node = child
        dotted = ".".join(override.key)
        if override.op == "delete":
            if last not in node:
                raise StudyError(
                    f"override {override.text}: the study has no {dotted} to delete{_near(node, last)}"
                )
            if override.value is not _DELETED and node[last] != override.value:
                raise StudyError(f"override {override.text}: {dotted} is {node[last]!r}, so it is kept")
            del node[last]
            continue
        if override.op == "add" and node.get(last) is not None:
            raise StudyError(
                f"override {override.text}: the study has {dotted} already; {override.text[1:]} changes it"
            )
        node[last] = copy.deepcopy(override.value)
    return out


def _near(node: dict, key: str) -> str:
    close = difflib.get_close_matches(key, [str(k) for k in node], n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


# The sections whose settings change what a trial trains: an override of one of them makes another
# study, named for it (:func:`configuration_name`), with its own folder, experiment and queue.
TRAINING_ROOTS = frozenset({"model", "train", "task", "metrics", "search"})


def _name_part(text: str) -> str | None:
    """``epochs_2`` for ``train.epochs=2``, ``no_final_norm`` for ``~model.final_norm``; None for an
    override that leaves every trial as it is (seeds, report settings, the name or output folder, a
    variant added or left out)."""
    prefix, rest = _prefix(text.strip())
    dotted, equals, value = rest.partition("=")
    key = dotted.split(".")
    patched_variant = key[0] == "variants" and prefix != "+" and (len(key) > 2 or prefix != "~")
    if key[0] not in TRAINING_ROOTS and not patched_variant:
        return None
    if prefix == "~" or not equals:
        return f"no_{key[-1]}"
    try:  # named by the value it sets, so that `lr=1e-3` and `lr=0.001` are one study
        (override,) = parse_overrides([f"{dotted}={value}"])
        shown = override.value if isinstance(override.value, str) else json.dumps(override.value)
    except StudyError:  # a sweep's whole value, or one the study's loading refuses in its own words
        override, shown = None, value
    if key == ["task", "data"] and override is not None and isinstance(override.value, list):
        return None  # several data sets: each is a study of its own, named for its data set already
    safe = re.sub("_+", "_", _NAME_UNSAFE.sub("_", shown.strip().strip(chr(39) + chr(34)))).strip("_")
    return f"{key[-1]}_{safe}"


def changes_training(text: str) -> bool:
    """Whether an override changes what a trial trains (and so names a study of its own)."""
    return _name_part(text) is not None


def configuration_name(name: str, texts: Iterable[str]) -> str:
    """The study's name with what its overrides change: ``quickstart.epochs_2`` for ``train.epochs=2``
    (each such override in the order given, as a sweep names its studies); ``name`` where none changes
    what a trial trains. A name past :data:`~ablate.study.spec.MAX_NAME` ends in a digest instead."""
    from ablate.study.spec import MAX_NAME  # the same layer; the schema loads only where a name is made

    parts = [part for part in map(_name_part, texts) if part]
    if not parts:
        return name
    named = f"{name}.{'.'.join(parts)}"
    if len(named) > MAX_NAME:
        named = f"{name[: MAX_NAME - 13]}.{hashlib.sha256(named.encode()).hexdigest()[:12]}"
    return named


def expand_sweeps(texts: Iterable[str], name: str) -> list[list[str]]:
    """The override lists of a sweep's studies, each naming its study ``<name>.<key>_<value>``
    (every combination of several sweeps, with the other overrides that change training, in the
    order given: :func:`configuration_name`); ``[texts]`` without a sweep."""
    texts = list(texts)
    axes = []
    for i, text in enumerate(texts):
        prefix, rest = _prefix(text.strip())
        dotted, equals, value_text = rest.partition("=")
        values = sweep_values(value_text) if equals else None
        if values:
            axes.append((i, f"{prefix}{dotted}", [v.strip() for v in values]))
    if not axes:
        return [texts]
    points = []
    for chosen in itertools.product(*(values for *_, values in axes)):
        point = list(texts)
        for (i, key, _), value in zip(axes, chosen, strict=True):
            point[i] = f"{key}={value}"
        points.append([*point, f"name={configuration_name(name, point)}"])
    return points


def only_variants(raw: dict, names: Iterable[str], source: str = "--only") -> list[str]:
    """``~variants.<v>`` overrides deleting every named variant of ``raw`` (the study file's
    mapping, overrides applied) not in ``names``: the subset of variants ``--only`` keeps (the
    baseline always stays). A name that is no variant of the file is an error."""
    names = [n.strip() for n in names if n.strip()]
    variants = raw.get("variants") or {}
    report = raw.get("report") or {}
    baseline = report.get("baseline", "base") if isinstance(report, dict) else "base"
    for name in names:
        if name not in variants and name != baseline:
            close = difflib.get_close_matches(name, list(variants), n=1, cutoff=0.6)
            hint = (
                f"; did you mean {close[0]}?"
                if close
                else f" (its variants: {', '.join(variants) or 'none'})"
            )
            raise StudyError(f"{source} {name}: not a named variant of the study file{hint}")
    return [f"~variants.{v}" for v in variants if v not in names and v != baseline]


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


def command_line(path: Path, texts: Iterable[str], only: str | None = None) -> list[list[str]]:
    """The override lists a command runs: one per point of a sweep (:func:`expand_sweeps`), each
    with the deletions ``--only`` implies (:func:`only_variants`, a comma-separated list)."""
    from ablate.study.file import read_study  # the same layer; read only where a sweep or --only needs it

    texts = list(texts or ())
    points = [texts] if not any(_swept(t) for t in texts) and not only else None
    if points is not None:
        return points
    raw, _ = read_study(Path(path))
    plain = [t for t in texts if not _swept(t)]
    raw = apply_overrides(raw, parse_overrides(plain))
    points = expand_sweeps(texts, str(raw.get("name", "study")))
    if only:
        points = [[*point, *only_variants(raw, only.split(","))] for point in points]
    return points


def _swept(text: str) -> bool:
    _, rest = _prefix(text.strip())
    _, equals, value_text = rest.partition("=")
    return bool(equals and sweep_values(value_text))

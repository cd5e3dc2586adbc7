"""Task ``function``: the researcher's own training code as a task.

The study names a callable (``callable: "package.module:train"``, or a script beside the study
file, ``callable: "train.py:train"``) that ablate calls once per (variant, seed) as
``train(config, seed, reporter)``: ``config`` is the variant's ``model.config`` (a plain nested
dict, its keys the study's own), ``seed`` the trial's seed and ``reporter`` a
:class:`~ablate.tasks.TrialReporter` (per-epoch curves, pruning, checkpoints). It returns the
final metrics: ``{"valid.acc": …, "test.acc": …}``, or a plain name (``{"acc": …}``) for a
number that is both (one held-out split); beside them, ``"units": {"acc": {unit id: score, …}}``
the test units' scores (``test.acc`` their mean), which the report's paired tests across units and
``report: {variance: seeds_and_units}`` read. Everything else — variants, grids, search, seeds,
workers, tracking, the report — is ablate's as for any task.

A trial's fingerprint covers the callable's code (:func:`local_modules`): the file defining it and
the local Python code beside it — its whole top-level package, or for a script or a module outside
a package the ``.py`` files and packages in its folder. Installed libraries, data and other files
it reads are not covered: ``version:`` (any value) is the study's way to say they changed.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.machinery
import importlib.util
import sys
from collections.abc import Callable
from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field

from ablate.cache import file_digest
from ablate.components import Options
from ablate.errors import warn
from ablate.tasks import PER_UNIT_KEY, Task, TrialReporter


class FunctionOptions(Options):
    # ``module:function`` (importable) or ``path/to/script.py:function`` (relative to the study file).
    callable: str = Field(pattern=r"^[^:]+:[A-Za-z_][A-Za-z0-9_.]*$")
    # Metrics where lower is better (loss, error); every other metric is higher-is-better.
    lower_is_better: list[str] = []
    # Any value: changed, every trial trains again (what the fingerprint does not see changed).
    version: int | str | None = None

    ADDED_LATER: ClassVar[dict[str, Any]] = {"version": None}


class FunctionTask(Task):
    Options = FunctionOptions

    @property
    def _target(self) -> tuple[str, str]:
        where, _, name = self.options.callable.rpartition(":")
        return where, name

    def _script(self) -> Path | None:
        """The script file the callable names, or None for an importable module."""
        where, _ = self._target
        if where.endswith(".py") or "/" in where or "\\" in where:
            return (self.base_dir / Path(where).expanduser()).resolve()
        return None

    def source_file(self) -> Path:
        """The file ``ablate run`` would import for the callable, found without running any of
        it (a package's ``__init__`` included); raises ``LookupError`` saying why there is none."""
        where, _ = self._target
        script = self._script()
        if script is not None:
            if not script.is_file():
                raise LookupError(f"no script {script}")
            return script
        search, spec = None, None
        for depth, part in enumerate(where.split(".")):
            # Located, not imported: ``importlib.util.find_spec`` would run a parent package's code.
            spec = importlib.machinery.PathFinder.find_spec(part, search)
            if spec is None and depth == 0 and str(self.base_dir) not in sys.path:
                spec = importlib.machinery.PathFinder.find_spec(part, [str(self.base_dir)])
            if spec is None:
                raise LookupError(f"no module {'.'.join(where.split('.')[: depth + 1])!r} found")
            search = spec.submodule_search_locations
        if spec.origin is None or not Path(spec.origin).is_file():
            raise LookupError(f"module {where!r} has no source file")
        return Path(spec.origin).resolve()

    def _import(self) -> Callable[..., Any]:
        where, name = self._target
        script = self._script()
        if script is None:
            # A module beside the study file imports as one installed would (installed ones first).
            if str(self.base_dir) not in sys.path:
                sys.path.append(str(self.base_dir))
            module = importlib.import_module(where)
        else:
            if not script.is_file():
                raise FileNotFoundError(f"no script {script}")
            if str(script.parent) not in sys.path:  # its own modules import, as `python train.py` runs it
                sys.path.append(str(script.parent))
            # One module per script path, registered so that what it defines pickles (workers, tools).
            module_name = f"ablate_function_{hashlib.sha256(str(script).encode()).hexdigest()[:12]}"
            spec = importlib.util.spec_from_file_location(module_name, script)
            module = importlib.util.module_from_spec(spec)
            sys.modules[module_name] = module
            try:
                spec.loader.exec_module(module)
            except BaseException:
                del sys.modules[module_name]
                raise
        target: Any = module
        for part in name.split("."):
            target = getattr(target, part)
        return target

    @cached_property
    def function(self) -> Callable[..., Any]:
        """The callable, imported: only in a trial's own process (``ablate run``)."""
        return self._import()

    def options_problem(self) -> tuple[tuple[str | int, ...], str] | None:
        where, name = self._target
        top = where.split(".")[0]
        if self._script() is None and (top in sys.stdlib_module_names or top in sys.builtin_module_names):
            return ("callable",), (
                f"{self.options.callable!r} is in Python's standard library, not training code: "
                "name your own function (module:function or script.py:function)"
            )
        try:
            source = self.source_file()
        except LookupError as exc:
            return ("callable",), f"cannot find {self.options.callable!r}: {exc}"
        if not defines(source, name.split(".")[0]):
            return ("callable",), f"cannot find {self.options.callable!r}: {source} defines no {name!r}"
        if self._script() is not None and not source.is_relative_to(self.base_dir):
            warn(f"task.callable {self.options.callable!r} runs {source}, outside the study's folder")
        return None

    def code_source(self) -> str | None:
        return str(self.source_file())

    def code_digest(self) -> str | None:
        """The callable's name with its code's content (:func:`file_source_digest`) when first
        asked: changed, it trains again. Read from the file ``ablate run`` imports, not imported."""
        if "_code" not in self.__dict__:
            self._code = file_source_digest(self.options.callable, self.source_file())
        return self._code

    def __getstate__(self) -> dict[str, Any]:
        # A trial's own process imports the callable itself (a script's module does not pickle),
        # the code the trial's fingerprint was taken of.
        state = {key: value for key, value in self.__dict__.items() if key not in ("function", "_code")}
        return {**state, "fingerprinted": self.code_digest()}

    def run_trial(self, config: dict[str, Any], seed: int, reporter: TrialReporter) -> dict[str, float]:
        if getattr(self, "fingerprinted", None) not in (None, self.code_digest()):
            raise RuntimeError(f"the code of {self.options.callable!r} changed during the run: run it again")
        # Run in a trial's own process: a script parsing its arguments sees its own name alone.
        sys.argv = [str(self._script() or self._target[0])]
        returned = self.function(config, seed, reporter)
        if not isinstance(returned, dict):
            return returned  # the driver says what is wrong with it
        metrics = {str(key): value for key, value in returned.items() if "." in str(key)}
        if PER_UNIT_KEY in returned:  # the test units' scores, passed on as they are
            metrics[PER_UNIT_KEY] = returned[PER_UNIT_KEY]
        for key, value in returned.items():
            if "." not in str(key) and key != PER_UNIT_KEY:  # a plain name: both splits' number
                metrics.setdefault(f"valid.{key}", value)
                metrics.setdefault(f"test.{key}", value)
        return metrics

    # -- ablate's own loop is not used: no data, no model of ablate's ---------------------
    def check_metric(self, name: str) -> str | None:
        return None  # the function's own: a missing one fails its trial, naming it

    def metric_higher_is_better(self, name: str) -> bool:
        return name.lower() not in {metric.lower() for metric in self.options.lower_is_better}

    def load(self) -> Any:
        return None

    def max_len(self, data: Any) -> int:
        return 1


# Folders of installed libraries: a module there is covered alone, not with its neighbours.
INSTALLED = frozenset({"site-packages", "dist-packages"})


def defines(source: Path, name: str) -> bool:
    """Whether the module in ``source`` binds ``name`` at its top level, read without running it
    (True where it cannot tell: a star import, a module ``__getattr__``, a file that does not parse)."""
    try:
        tree = ast.parse(source.read_bytes())
    except (SyntaxError, ValueError, OSError):
        return True  # the trial's import says what is wrong
    bound = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {alias.asname or alias.name.split(".")[0] for alias in node.names}
        else:
            bound |= {
                n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
            }
    return name in bound or "*" in bound or "__getattr__" in bound


def file_source_digest(name: str, source: Path) -> str:
    """A digest of ``name`` and the content of the callable's code: its ``source`` file and the
    local modules beside it (:func:`local_modules`). The files are named relative to their folder:
    a study moved elsewhere keeps its fingerprints."""
    # The defining file's digest first, as before local modules were covered: a callable alone in
    # its folder keeps the fingerprint it had then.
    others = local_modules(source)
    content = file_digest(source) + "".join(f"\0{rel}\0{file_digest(path)}" for rel, path in others)
    return hashlib.sha256(f"{name}\0{content}".encode()).hexdigest()[:16]


def local_modules(file: Path) -> list[tuple[str, Path]]:
    """The local code a callable's source ``file`` may import, each file as (its name relative to
    the folder searched, its path), in name order: inside a package (a folder with ``__init__.py``),
    every ``.py`` file of its top-level package; otherwise the ``.py`` files beside it and those of
    the packages beside it. A module installed alone (in ``site-packages``) is covered alone."""
    file = file.resolve()
    folder = file.parent
    if (folder / "__init__.py").is_file():
        while (folder.parent / "__init__.py").is_file():
            folder = folder.parent
        found = folder.rglob("*.py")
    elif folder.name in INSTALLED:
        found = iter(())
    else:
        packages = [p for p in folder.iterdir() if p.is_dir() and (p / "__init__.py").is_file()]
        found = [*folder.glob("*.py"), *(f for package in packages for f in package.rglob("*.py"))]
    return sorted({(f.relative_to(folder).as_posix(), f) for f in found if f.is_file() and f != file})

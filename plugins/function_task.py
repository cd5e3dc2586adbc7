"""Task ``function``: the researcher's own training code as a task.

The study names a callable (``callable: "package.module:train"``, or a script beside the study
file, ``callable: "train.py:train"``) that ablate calls once per (variant, seed) as
``train(config, seed, reporter)``: ``config`` is the variant's ``model.config`` (a plain nested
dict, its keys the study's own), ``seed`` the trial's seed and ``reporter`` a
:class:`~ablate.tasks.TrialReporter` (per-epoch curves, pruning, checkpoints). It returns the
final metrics: ``{"valid.acc": …, "test.acc": …}``, or a plain name (``{"acc": …}``) for a
number that is both (one held-out split). Everything else — variants, grids, search, seeds,
workers, tracking, the report — is ablate's as for any task.

A trial's fingerprint covers the callable's code (:func:`local_modules`): the file defining it and
the local Python code beside it — its whole top-level package, or for a script or a module outside
a package the ``.py`` files and packages in its folder. Installed libraries, data and other files
it reads are not covered: ``version:`` (any value) is the study's way to say they changed.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable
from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field

from ablate.cache import file_digest
from ablate.components import Options
from ablate.tasks import Task, TrialReporter


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
        function = self._import()
        # The source as imported, not as the file reads later: the trials run what was imported.
        self._code = source_digest(self.options.callable, function)
        return function

    def options_problem(self) -> tuple[tuple[str | int, ...], str] | None:
        try:
            target = self.function
        except Exception as exc:  # noqa: BLE001 - whatever the import raised, one line for the study file
            message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            return ("callable",), f"cannot import {self.options.callable!r}: {type(exc).__name__}: {message}"
        if not callable(target):
            return ("callable",), f"{self.options.callable!r} is a {type(target).__name__}, not a callable"
        return None

    def code_digest(self) -> str | None:
        """The callable's name with its code's content (:func:`source_digest`): changed, it trains again."""
        _ = self.function
        return self._code

    def run_trial(self, config: dict[str, Any], seed: int, reporter: TrialReporter) -> dict[str, float]:
        returned = self.function(config, seed, reporter)
        if not isinstance(returned, dict):
            return returned  # the driver says what is wrong with it
        metrics = {str(key): value for key, value in returned.items() if "." in str(key)}
        for key, value in returned.items():
            if "." not in str(key):  # a plain name: the one held-out number is both, unless given apart
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


def source_digest(name: str, function: Any) -> str:
    """A digest of ``name`` and the content of the callable's code (:func:`local_modules`; the name
    alone for one without a source file, such as a built-in). The files are named relative to
    their folder: a study moved elsewhere keeps its fingerprints."""
    try:
        source = inspect.getsourcefile(inspect.unwrap(function))
    except TypeError:
        source = None
    if not source or not Path(source).is_file():
        return hashlib.sha256(f"{name}\0".encode()).hexdigest()[:16]
    # The defining file's digest first, as before local modules were covered: a callable alone in
    # its folder keeps the fingerprint it had then.
    others = local_modules(Path(source))
    content = file_digest(Path(source)) + "".join(f"\0{rel}\0{file_digest(path)}" for rel, path in others)
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

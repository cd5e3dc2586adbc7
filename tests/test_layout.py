"""The core's map (ablate/README.md) holds: the core is a few top-level modules (the foundations and
the plugin interface) and one package per stage, each room imports only from its own layer or the
ones below it, no module imports another that imports it back (imports inside functions and
type-only imports counted), the core never imports a plugin, plugins reach the core through its
interface only, no core module is over 450 lines, and Optuna's private names are read in one
adapter only."""

from __future__ import annotations

import ast
import graphlib
import importlib
import re
from pathlib import Path

import optuna
import pytest

REPO = Path(__file__).resolve().parents[1]
CORE = REPO / "ablate"
# The modules beside the package (ablate_namesake: the check for PyPI's other `ablate`; ablate_studies:
# the command's entry point) are part of the import graph too.
BESIDE = {"ablate_namesake": REPO / "ablate_namesake.py", "ablate_studies": REPO / "ablate_studies.py"}

# ablate/README.md's table, bottom layer first: a room is a top-level module or a package.
LAYERS = [
    {"errors", "stopping", "faults", "cache", "schema", "fastpaths", "jagged", "kernels", "margins"},
    {"components", "tasks", "registry"},
    {"stats"},
    {"data"},
    {"model"},
    {"optim", "testkit"},
    {"study"},
    {"training"},
    {"tracking"},
    {"drive"},
    {"report"},
    {"commands"},
    {"__init__"},
]
LAYER_OF = {room: i for i, rooms in enumerate(LAYERS) for room in rooms}
# What plugins may import from the core: the interface a kind or a task is written against.
PLUGIN_INTERFACE = {"components", "tasks", "fastpaths", "jagged", "errors", "stopping", "cache", "kernels"}
MAX_TOP_LEVEL_MODULES = 13  # __init__, the foundations and the plugin interface
OPTUNA_ADAPTER = CORE / "drive" / "optuna_private.py"


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


CORE_FILES = sorted(CORE.rglob("*.py"))
MODULES = {_module_name(p): p for p in CORE_FILES} | BESIDE
PACKAGES = sorted(p.parent for p in CORE.glob("*/__init__.py"))


def _room(name: str) -> str:
    """The top-level room of a core module: ``stats`` for ablate.stats.ranking, ``__init__`` for ablate."""
    return name.split(".")[1] if "." in name else "__init__"


def _imported(path: Path) -> set[str]:
    """Every dotted name a module imports, anywhere in it (function bodies and ``TYPE_CHECKING``
    blocks included): the module, and for ``from m import x`` also ``m.x``."""
    name = _module_name(path) if path.is_relative_to(REPO) else path.stem
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            found.add(module)
            found |= {f"{module}.{alias.name}" for alias in node.names}
    return found


def _core_imports(path: Path) -> set[str]:
    """The project's modules (core and beside it) a module imports, each its longest known name."""
    found = set()
    for name in _imported(path):
        parts = name.split(".")
        for n in range(len(parts), 0, -1):
            if ".".join(parts[:n]) in MODULES:
                found.add(".".join(parts[:n]))
                break
    return found - {_module_name(path) if path.parent != REPO else path.stem}


GRAPH = {name: _core_imports(path) - {"ablate"} for name, path in MODULES.items()}


def test_every_room_is_on_the_map():
    rooms = {_room(name) for name in MODULES if name.startswith("ablate")}
    assert rooms == set(LAYER_OF), "ablate/README.md and LAYERS must list exactly the core's rooms"


def test_the_readme_map_is_the_package_tree():
    """ablate/README.md has one line per room: every module (``study/load.py``) and package."""
    rows = [
        line.split("|") for line in (CORE / "README.md").read_text().splitlines() if line.startswith("| ")
    ]
    listed = [room.strip().strip("`") for _, _, room, *_ in rows[1:]]  # the room column, past the header
    modules = {p.relative_to(CORE).as_posix() for p in CORE_FILES if p.name != "__init__.py"}
    packages = {f"{p.relative_to(CORE).as_posix()}/" for p in PACKAGES}
    assert sorted(listed) == sorted(modules | packages | {"__init__.py"})


def test_the_core_is_packages_and_a_few_modules():
    top = list(CORE.glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, sorted(p.name for p in top)


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.name)
def test_every_package_says_what_it_holds_and_may_import(package):
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text()))
    assert doc and re.search(r"\bimports?\b", doc, re.IGNORECASE), f"{package.name}/__init__.py"


@pytest.mark.parametrize("path", CORE_FILES, ids=lambda p: str(p.relative_to(CORE)))
def test_rooms_import_only_downwards(path):
    mine = LAYER_OF[_room(_module_name(path))]
    for name in _imported(path):
        assert not name.startswith("ablate_plugins"), f"{path.name} imports the plugin {name}"
    for name in GRAPH[_module_name(path)]:
        if not name.startswith("ablate."):
            continue
        assert LAYER_OF[_room(name)] <= mine, (
            f"{path.relative_to(REPO)} (layer {mine}) imports {name} (layer {LAYER_OF[_room(name)]})"
        )


def test_no_import_cycles():
    """Where two modules need each other, the shared piece moves down or becomes a parameter."""
    try:
        tuple(graphlib.TopologicalSorter(GRAPH).static_order())
    except graphlib.CycleError as exc:
        pytest.fail(f"import cycle: {' -> '.join(exc.args[1])}")


def test_the_cycle_check_sees_function_bodies_and_type_only_imports(tmp_path):
    """The check is not blind where cycles hide: an import inside a function and one under
    ``TYPE_CHECKING`` are both edges."""
    module = tmp_path / "m.py"
    module.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ablate.study.load import Study\n"
        "def f():\n    from ablate.drive import driver\n"
    )
    assert {"ablate.study.load.Study", "ablate.drive.driver"} <= _imported(module)


def test_plugins_use_the_interface_only():
    for path in sorted((REPO / "plugins").rglob("*.py")):
        for name in _imported(path):
            parts = name.split(".")
            if parts[0] == "ablate" and len(parts) > 1:
                assert parts[1] in PLUGIN_INTERFACE, f"{path.relative_to(REPO)} imports {name}"


@pytest.mark.parametrize("path", CORE_FILES, ids=lambda p: str(p.relative_to(CORE)))
def test_no_core_module_is_over_450_lines(path):
    assert len(path.read_text().splitlines()) <= 450


def test_no_private_optuna_attributes():
    """``._storage`` / ``._trial_id`` are Optuna internals: the stores use its public storage API,
    and the adapter alone reads a trial's storage id (``storage_id``)."""
    for path in CORE_FILES:
        if path == OPTUNA_ADAPTER:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute):
                assert node.attr not in ("_storage", "_trial_id"), f"{path.relative_to(REPO)}:{node.lineno}"


def test_optunas_private_modules_are_read_in_one_adapter():
    for path in [*CORE_FILES, *BESIDE.values()]:
        private = {n for n in _imported(path) if n.startswith("optuna") and "._" in n}
        if path != OPTUNA_ADAPTER:
            assert not private, f"{path.relative_to(REPO)} imports {sorted(private)}"


def test_the_optuna_adapter_still_finds_what_it_reads():
    """Fails, naming the adapter, the day Optuna moves or renames what it reads."""
    adapter = importlib.import_module("ablate.drive.optuna_private")
    assert isinstance(adapter.LOCK_FILE_SUFFIX, str) and adapter.LOCK_FILE_SUFFIX
    assert adapter.JOURNAL_OPERATIONS and all(isinstance(op, int) for op in adapter.JOURNAL_OPERATIONS)
    storage = optuna.storages.InMemoryStorage()
    study = optuna.create_study(storage=storage)
    for _ in range(3):
        study.enqueue_trial({})
    study_id = storage.get_study_id_from_name(study.study_name)
    ids = [storage.get_trial_id_from_study_id_trial_number(study_id, n) for n in range(3)]
    assert [adapter.storage_id(t) for t in study.get_trials(deepcopy=False)] == ids
